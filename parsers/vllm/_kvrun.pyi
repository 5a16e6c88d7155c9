"""Type stub for the C run search (_kvrun.c); see kvrun.py's `kv_run` and `load_run`, which it
equals."""

from typing import Any

def kv_run(data: bytes, start: int, /) -> tuple[Any, ...] | None: ...
def load_run(data: bytes, start: int, /) -> tuple[int, list[tuple[Any, ...]]] | None: ...
