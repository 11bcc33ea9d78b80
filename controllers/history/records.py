"""What the history store records: plain, immutable values the controller hands to the recorder.

Each record carries a natural key (`key()`) that is the same every time the controller
reports the same event, so a replay after a restart or a spool replay after an outage stores
it once. Records convert to and from JSON-ready dicts for the on-disk spool.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, ClassVar


class TransitionKind(enum.StrEnum):
    """The steps of a workload's life that an operator asks about after the fact."""

    CREATED = "created"
    QUOTA_RESERVED = "quota_reserved"
    ADMITTED = "admitted"
    EVICTED = "evicted"
    PREEMPTED = "preempted"
    RECLAIMED = "reclaimed"
    REQUEUED = "requeued"
    SLICE_REPLACED = "slice_replaced"
    FINISHED = "finished"
    # Sent to a worker cluster (docs/multicluster.md); the reason names the cluster.
    DISPATCHED = "dispatched"


class RecordError(ValueError):
    """A record is malformed; the message names the record, the field and the rule."""


def utc(at: datetime) -> datetime:
    """Return `at` as an aware UTC datetime; naive datetimes are taken to be UTC already."""
    if at.tzinfo is None:
        return at.replace(tzinfo=UTC)
    return at.astimezone(UTC)


def _require(cond: bool, record: str, fld: str, rule: str) -> None:
    if not cond:
        raise RecordError(f"{record}: field {fld!r} {rule}")


def _check_text(record: str, fld: str, value: str, *, limit: int, required: bool = True) -> None:
    _require(isinstance(value, str), record, fld, "must be a string")
    if required:
        _require(value != "", record, fld, "must not be empty")
    _require(len(value) <= limit, record, fld, f"must be at most {limit} characters")


_MAX_SEQUENCE = 2**63 - 1  # a BIGINT column on both engines


def _check_sequence(record: str, sequence: int) -> None:
    _require(
        isinstance(sequence, int) and 0 <= sequence <= _MAX_SEQUENCE,
        record,
        "sequence",
        "must be an integer between 0 and 2**63-1",
    )


def _check_workload(who: str, namespace: str, name: str, uid: str) -> None:
    """The workload a record is about: its namespace, name and uid."""
    _check_text(who, "namespace", namespace, limit=253)
    _check_text(who, "name", name, limit=253)
    _check_text(who, "uid", uid, limit=64)


def _check_moment(
    who: str, record: WorkloadTransition | PlacementDecision | PreemptionDecision
) -> None:
    """When it happened (stored as UTC) and which repetition of it this is."""
    _require(isinstance(record.at, datetime), who, "at", "must be a datetime")
    object.__setattr__(record, "at", utc(record.at))
    _check_sequence(who, record.sequence)


@dataclass(frozen=True, slots=True)
class WorkloadTransition:
    """One step in a workload's life: who, where, how much, why, and (for evictions) by whom.

    `sequence` tells apart repeated transitions of the same kind for one workload (the second
    admission after a requeue); the controller derives it from the Workload's own status (for
    example its requeue count or slice number) so that replaying the event yields the same key.
    """

    TYPE: ClassVar[str] = "transition"

    namespace: str
    name: str
    uid: str
    kind: TransitionKind
    at: datetime
    sequence: int = 0
    local_queue: str = ""
    cluster_queue: str = ""
    # resource name -> flavor, and resource name -> amount in base units (millicores, bytes,
    # devices), exactly as the quota engine reserved them.
    flavors: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, int] = field(default_factory=dict)
    reason: str = ""
    # The workload (NS/NAME) whose admission caused an eviction, preemption or reclaim; for
    # `dispatched`, the worker cluster it was sent to.
    actor: str = ""

    def __post_init__(self) -> None:
        # The controller builds thousands of these per admission cycle, almost always valid:
        # one cheap test first, the detailed checks (naming field and rule) only when it fails.
        if (
            type(self.kind) is TransitionKind
            and type(self.at) is datetime
            and self.at.tzinfo is UTC
            and type(self.sequence) is int
            and 0 <= self.sequence <= _MAX_SEQUENCE
            and type(self.namespace) is str
            and type(self.name) is str
            and type(self.uid) is str
            and 0 < len(self.namespace) <= 253
            and 0 < len(self.name) <= 253
            and 0 < len(self.uid) <= 64
            and type(self.local_queue) is str
            and type(self.cluster_queue) is str
            and type(self.actor) is str
            and len(self.local_queue) <= 253
            and len(self.cluster_queue) <= 253
            and len(self.actor) <= 507
            and all(type(v) is int and v >= 0 for v in self.resources.values())
        ):
            return
        self._validate()

    def _validate(self) -> None:
        who = f"workload transition {self.namespace}/{self.name}"
        _check_workload(who, self.namespace, self.name, self.uid)
        try:
            object.__setattr__(self, "kind", TransitionKind(self.kind))
        except ValueError:
            allowed = ", ".join(k.value for k in TransitionKind)
            raise RecordError(f"{who}: field 'kind' must be one of {allowed}") from None
        _check_moment(who, self)
        _check_text(who, "local_queue", self.local_queue, limit=253, required=False)
        _check_text(who, "cluster_queue", self.cluster_queue, limit=253, required=False)
        _check_text(who, "actor", self.actor, limit=507, required=False)
        for res, amount in self.resources.items():
            _require(
                isinstance(amount, int) and amount >= 0,
                who,
                f"resources[{res}]",
                "must be a non-negative integer in base units",
            )

    def key(self) -> tuple[str, ...]:
        """The natural key: one stored row per (workload uid, transition kind, sequence)."""
        return (self.TYPE, self.uid, self.kind.value, str(self.sequence))


@dataclass(frozen=True, slots=True)
class PlacementDecision:
    """Where the pods of an admitted pod group went: node name -> number of pods placed there."""

    TYPE: ClassVar[str] = "placement"

    namespace: str
    name: str
    uid: str
    pod_group: str
    at: datetime
    sequence: int = 0
    cluster_queue: str = ""
    assignments: Mapping[str, int] = field(default_factory=dict)
    reason: str = ""

    def __post_init__(self) -> None:
        who = f"placement decision {self.namespace}/{self.name}"
        _check_workload(who, self.namespace, self.name, self.uid)
        _check_text(who, "pod_group", self.pod_group, limit=253)
        _check_moment(who, self)
        for node, pods in self.assignments.items():
            _require(
                isinstance(pods, int) and pods > 0,
                who,
                f"assignments[{node}]",
                "must be a positive pod count",
            )

    def key(self) -> tuple[str, ...]:
        """The natural key: one stored row per (workload uid, pod group, sequence)."""
        return (self.TYPE, self.uid, self.pod_group, str(self.sequence))


@dataclass(frozen=True, slots=True)
class Victim:
    """A workload evicted so that a preemptor could run."""

    namespace: str
    name: str
    uid: str
    cluster_queue: str = ""
    priority: int = 0
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        """Return the victim as a JSON-ready dict."""
        return {
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "cluster_queue": self.cluster_queue,
            "priority": self.priority,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class PreemptionDecision:
    """A preemptor and the victims chosen for it, with the rule that chose them."""

    TYPE: ClassVar[str] = "preemption"

    namespace: str
    name: str
    uid: str
    at: datetime
    victims: tuple[Victim, ...]
    sequence: int = 0
    cluster_queue: str = ""
    # "preempt" (within a queue, by priority) or "reclaim" (from a queue above its fair share).
    strategy: str = "preempt"
    reason: str = ""

    def __post_init__(self) -> None:
        who = f"preemption decision for {self.namespace}/{self.name}"
        _check_workload(who, self.namespace, self.name, self.uid)
        _check_moment(who, self)
        _require(len(self.victims) > 0, who, "victims", "must name at least one victim")
        object.__setattr__(self, "victims", tuple(self.victims))
        _require(
            self.strategy in ("preempt", "reclaim"), who, "strategy", "must be preempt or reclaim"
        )

    def key(self) -> tuple[str, ...]:
        """The natural key: one stored row per (preemptor uid, sequence)."""
        return (self.TYPE, self.uid, str(self.sequence))


@dataclass(frozen=True, slots=True)
class QueueSample:
    """A queue's usage, fair share and demand of one resource in one flavor, at one moment.

    Amounts are in base units. `usage` is the average over the `resolution_s` seconds the sample
    stands for, so `usage * resolution_s` is the usage integrated over that period (what
    time-based fairness decays). `covered_s` is how many of those seconds were observed: equal to
    `resolution_s` for a raw sample, possibly less for an hourly average with gaps.
    """

    TYPE: ClassVar[str] = "sample"

    cluster_queue: str
    flavor: str
    resource: str
    at: datetime
    usage: float
    fair_share: float
    demand: float
    resolution_s: int = 60
    downsampled: bool = False
    covered_s: int = -1

    def __post_init__(self) -> None:
        who = f"queue sample {self.cluster_queue}/{self.flavor}/{self.resource}"
        _check_text(who, "cluster_queue", self.cluster_queue, limit=253)
        _check_text(who, "flavor", self.flavor, limit=253)
        _check_text(who, "resource", self.resource, limit=253)
        _require(isinstance(self.at, datetime), who, "at", "must be a datetime")
        object.__setattr__(self, "at", utc(self.at))
        for fld in ("usage", "fair_share", "demand"):
            value = getattr(self, fld)
            _require(
                isinstance(value, int | float) and value >= 0, who, fld, "must be a number >= 0"
            )
        _require(self.resolution_s > 0, who, "resolution_s", "must be a positive number of seconds")
        if self.covered_s < 0:
            object.__setattr__(self, "covered_s", self.resolution_s)
        _require(
            0 < self.covered_s <= self.resolution_s,
            who,
            "covered_s",
            "must be between 1 and resolution_s",
        )

    def key(self) -> tuple[str, ...]:
        """The natural key: one row per (queue, flavor, resource, resolution, time)."""
        return (
            self.TYPE,
            self.cluster_queue,
            self.flavor,
            self.resource,
            str(self.resolution_s),
            self.at.isoformat(),
        )


Record = WorkloadTransition | PlacementDecision | PreemptionDecision | QueueSample

_TYPES: dict[str, type[Record]] = {
    cls.TYPE: cls
    for cls in (WorkloadTransition, PlacementDecision, PreemptionDecision, QueueSample)
}


def record_fields(record: Record) -> dict[str, Any]:
    """The fields of `record` as plain values (an enum as its value, a mapping as a dict, the
    victims as dicts), the time as the datetime it is: what a database row and a spool line
    are both made from."""
    out: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if isinstance(value, TransitionKind):
            value = value.value
        elif f.name == "victims":
            value = [v.as_dict() for v in value]
        elif isinstance(value, Mapping):
            value = dict(value)
        out[f.name] = value
    return out


def record_to_dict(record: Record) -> dict[str, Any]:
    """Return `record` as a JSON-ready dict tagged with its type (the spool's line format)."""
    out: dict[str, Any] = {"type": record.TYPE} | record_fields(record)
    out["at"] = record.at.isoformat()  # the one datetime field of every record
    return out


def record_from_dict(data: Mapping[str, Any]) -> Record:
    """Rebuild a record written by `record_to_dict`; raises RecordError on anything else."""
    kind = data.get("type")
    cls = _TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise RecordError(f"history record: field 'type' must be one of {', '.join(_TYPES)}")
    values = {k: v for k, v in data.items() if k != "type"}
    try:
        values["at"] = datetime.fromisoformat(values["at"])
        if cls is PreemptionDecision:
            values["victims"] = tuple(Victim(**v) for v in values["victims"])
        return cls(**values)
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, RecordError):
            raise
        raise RecordError(f"history record of type {kind}: {err}") from err
