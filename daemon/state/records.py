"""The fold's frozen records (state/session.py, ...): `evolve`, a fast copy with changes,
`new_tuple`, a NamedTuple made without its Python-level constructor, and `plain`, a record as
JSON-ready values."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import fields
from typing import Any, Final, TypeVar

_T = TypeVar("_T")
_FIELDS: dict[type, frozenset[str]] = {}
_new: Final = object.__new__
# `new_tuple(Cls, (every field, in order))`: a NamedTuple without its `__new__`, which is Python
# (an interpreted call per estimator step and stall check: a load makes thousands a second).
# No defaults are filled in: the caller gives every field.
new_tuple: Final = tuple.__new__


class CompiledRecord:
    """A dataclass of a compiled module (forecast.py's), copied and pickled through its
    constructor: compiled (mypyc), it is a native class without `__dict__`, which `copy` and
    `pickle` would write. (The records made per bar update are named tuples (`new_tuple`):
    compiled, a frozen dataclass is built through a Python-level `__init__` that sets each
    field, several times slower.)"""

    __slots__ = ()

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return type(self), tuple(getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]


def evolve(obj: _T, **changes: Any) -> _T:
    """`dataclasses.replace` for frozen records, several times faster. The records keep their
    fields in `__dict__` (no slots) and have no validation, so a copy is two dict updates and no
    `__init__` call: the fold makes a few copies per input, so this is most of its cost. Unknown
    field names raise KeyError."""
    cls = type(obj)
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = frozenset(f.name for f in fields(cls))  # type: ignore[arg-type]
    if not names.issuperset(changes):
        raise KeyError(f"{cls.__name__} has no field {sorted(set(changes) - names)}")
    new = _new(cls)
    d = new.__dict__
    d.update(obj.__dict__)
    d.update(changes)
    return new


_LEAVES = frozenset({str, int, bool, type(None)})
_NAMES: dict[type, tuple[str, ...]] = {}  # a dataclass's field names, read once a class


def plain(value: Any) -> Any:
    """Dataclasses to dicts, tuples to lists, non-finite floats to None. (A long log's report
    holds tens of thousands of values: each is looked at by its type once.)"""
    cls = type(value)
    if cls in _LEAVES:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    names = _NAMES.get(cls)
    if names is None and dataclasses.is_dataclass(cls):
        names = _NAMES[cls] = tuple(f.name for f in fields(cls))
    if names is not None:
        return {name: plain(getattr(value, name)) for name in names}
    if isinstance(value, tuple | list | frozenset | set):
        return [plain(v) for v in value]
    return value
