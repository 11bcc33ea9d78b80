"""What an import could not carry over, and the input it refuses.

Every importer returns the Muster manifests it could build plus one `Unmapped` entry per
source field (or whole object) that has no Muster equivalent, with the reason; input that
is not what the source project itself would accept is refused with an `ImportInputError`
naming the file, the document, the object, the field and the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from quota.api import ManifestError


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a source object came from: its file, its position there and what it is."""

    file: str
    index: int
    subject: str  # "ClusterQueue team-a", "LocalQueue ml/train"

    def where(self, path: str = "") -> str:
        """`file: document N (subject)[: path]`, the prefix of every message about it."""
        head = f"{self.file}: document {self.index} ({self.subject})"
        return f"{head}: {path}" if path else head


class ImportInputError(ValueError):
    """Input the importer refuses; the message names file, document, object, field, rule."""

    def __init__(self, origin: Origin, path: str, rule: str) -> None:
        self.origin = origin
        self.path = path
        self.rule = rule
        super().__init__(f"{origin.where(path)}: {rule}")


def refuse(origin: Origin, path: str, rule: str) -> NoReturn:
    """Raise the error for one bad field of one source object."""
    raise ImportInputError(origin, path, rule)


def from_manifest_error(origin: Origin, error: ManifestError) -> ImportInputError:
    """A ManifestError raised while reading a source object, said about that object."""
    path, rule = error.problems[0] if error.problems else ("", str(error))
    return ImportInputError(origin, path, rule)


@dataclass(frozen=True, slots=True)
class Unmapped:
    """One source field (or object, with path "") Muster has no equivalent for."""

    origin: Origin
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.origin.where(self.path)}: {self.reason}"


@dataclass(frozen=True, slots=True)
class ImportedWorkload:
    """A source workload as a Muster Workload manifest, with its simulated timing."""

    manifest: Mapping[str, Any]
    submit_at: float  # seconds from the start of a simulation
    run_for: float | None  # seconds once admitted; None: the command's default
    origin: Origin  # the source object it was imported from


@dataclass(frozen=True)
class ImportResult:
    """Muster manifests built from one source's files, and what did not carry over.

    `manifests` are queue objects and cluster state in apply order (PriorityClasses,
    ResourceFlavors, ClusterQueues parents first, LocalQueues, Nodes); `workloads` the
    source's pending work as Muster Workloads.
    """

    manifests: tuple[Mapping[str, Any], ...]
    workloads: tuple[ImportedWorkload, ...] = ()
    unmapped: tuple[Unmapped, ...] = field(default_factory=tuple)
