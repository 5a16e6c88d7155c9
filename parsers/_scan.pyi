# The C scanner (_scan.c); scan.py holds the Python equal of each function.
def candidates(
    data: bytes,
    pos: int,
    groups: tuple[tuple[bytes, tuple[bytes, ...] | None, bool], ...],
    quiet_ok: bool,
    /,
) -> tuple[list[tuple[int, int]], list[tuple[int, int, int, bytes]]]: ...
def count_records(data: bytes, /) -> int: ...
