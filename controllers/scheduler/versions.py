"""Objects of one kind converted once per resourceVersion, for the scheduler loop's passes
(nodes and pods for its view, flavors and Topologies for its domains)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from controllers.runtime.resources import Obj, object_key
from quota.api import ManifestError

log = logging.getLogger(__name__)

T = TypeVar("T")


def describe(error: ManifestError) -> str:
    """ "Node n-1: status.allocatable[cpu]: not a quantity" without the document number."""
    problems = "; ".join(f"{path}: {rule}" for path, rule in error.problems)
    return f"{error.subject}: {problems}"


class ByVersion(Generic[T]):
    """Objects of one kind converted once per resourceVersion; the ones gone are dropped."""

    def __init__(self, convert: Callable[[Obj], T | None], what: str) -> None:
        self._convert = convert
        self._what = what  # "node", "pod": for the warning
        self._cache: dict[str, tuple[str, T | None]] = {}

    def convert(self, objects: Iterable[Obj]) -> dict[str, T]:
        """Key -> converted object, every object that converts, in the order given."""
        out: dict[str, T] = {}
        seen: set[str] = set()
        for obj in objects:
            key = object_key(obj)
            seen.add(key)
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            cached = self._cache.get(key)
            if cached is None or cached[0] != rv:
                try:
                    value: T | None = self._convert(obj)
                except ValueError as error:  # ManifestError, pydantic's ValidationError
                    words = describe(error) if isinstance(error, ManifestError) else str(error)
                    extra = {"error": words[:300]}
                    log.warning("%s left out of placement", self._what, extra=extra)
                    value = None
                cached = (rv, value)
                self._cache[key] = cached
            if cached[1] is not None:
                out[key] = cached[1]
        for gone in [k for k in self._cache if k not in seen]:
            del self._cache[gone]
        return out
