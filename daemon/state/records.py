"""`evolve`: a fast copy-with-changes for the fold's frozen records (state/session.py, ...)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

_T = TypeVar("_T")
_FIELDS: dict[type, frozenset[str]] = {}
_new = object.__new__


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
