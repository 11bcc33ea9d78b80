"""Objects that many threads read and no one changes: what the informers' caches hold.

A cached object is read by the admission cycle, the scheduler loop, the reconcilers, the
status writers and the metrics scrape, each on its own thread. If one of them changed it in
place (even only adding an empty `status` to read it), another thread deep-copying it at that
moment would fail with "dictionary changed size during iteration", and a cycle failing there
once stranded a Workload for good (issue 24). So the caches hold frozen objects: dicts and
lists that refuse every change, with a `TypeError` at the line that tried (not a race
somewhere else, later). `copy.deepcopy` of a frozen object is a plain, mutable copy: the one
way to change a cached object is to copy it and write the copy (copy on write).

Frozen dicts and lists are `dict` and `list` subclasses: they compare equal to plain ones and
serialize, validate and read as them.
"""

from __future__ import annotations

from typing import Any, NoReturn

_REFUSAL = (
    "a cached object is shared between threads and never changed in place: "
    "copy.deepcopy() it and change the copy"
)


def _refuse(*_: Any, **__: Any) -> NoReturn:
    raise TypeError(_REFUSAL)


class FrozenDict(dict[str, Any]):
    """A dict no one may change (see the module's docstring)."""

    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return thaw(self)  # type: ignore[no-any-return]

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))


class FrozenList(list[Any]):
    """A list no one may change (see the module's docstring)."""

    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = remove = pop = clear = sort = reverse = _refuse

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return thaw(self)  # type: ignore[no-any-return]

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))


_MUTABLE = frozenset({dict, list})


def freeze(value: Any) -> Any:
    """`value` (JSON-shaped: dicts, lists, scalars) as frozen containers. Parts already
    frozen are shared, not copied: nothing can change them."""
    kind = type(value)
    if kind is dict:
        # Most values are scalars: copy the dict whole, then replace only its containers
        # (a call per scalar cost more than the copy; every watch event comes through here).
        out = FrozenDict(value)
        for k, v in value.items():
            if type(v) in _MUTABLE:
                dict.__setitem__(out, k, freeze(v))
        return out
    if kind is list:
        return FrozenList([freeze(v) if type(v) in _MUTABLE else v for v in value])
    return value


def freeze_object(obj: dict[str, Any]) -> Any:
    """An API object frozen for a cache, without `metadata.managedFields`: the apiserver's
    bookkeeping of who set which field, which Muster never reads and which is often the
    largest part of an object (the time to freeze it and the memory to keep it)."""
    meta = obj.get("metadata")
    if type(meta) is dict and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return freeze(obj)


def thaw(value: Any) -> Any:
    """A plain, mutable deep copy of a JSON-shaped `value`, frozen or not (JSON has no
    shared parts or cycles, so no memo is needed)."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thaw(v) for v in value]
    return value
