"""Type stub for the C run search (_kvrun.c); see kvrun.py's `kv_run`, which it equals."""

from typing import Any

def kv_run(data: bytes, start: int, /) -> tuple[Any, ...] | None: ...
