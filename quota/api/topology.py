"""Topology: how the nodes of a flavor nest (blocks of racks of hosts), as node-label levels.

A ResourceFlavor names one (`spec.topologyName`); its nodes then form a tree of domains, one
per value of each level's label, and a pod set may require or prefer that all its pods share
one domain at a level, or that each slice of its pods does (`Workload.spec.podSets[].
topologyRequest`). The shape follows Kueue's Topology (ordered levels, widest first). Also
what other schedulers' constraints become as such a request (Volcano's `networkTopology`,
KEP-5732's `schedulingConstraints.topology`), one rule each for the controller's PodGroup
intake and the importers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from quota.api.meta import (
    API_VERSION,
    ApiModel,
    ApiObject,
    CrdInfo,
    PrinterColumn,
    cel,
    validations,
)
from quota.api.names import HOSTNAME_LABEL

MAX_LEVELS = 8
# A label key: an optional DNS-subdomain prefix and "/", then a name of at most 63 characters.
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def _label(description: str, *, optional: bool = False) -> Any:
    """A field holding a node label key (a level of a Topology)."""
    return Field(
        None if optional else ...,
        min_length=1,
        max_length=316,
        pattern=LABEL_KEY,
        description=description,
    )


class TopologyLevel(ApiModel):
    """One level of the topology: the node label whose values are its domains."""

    node_label: str = _label(
        "The node label, e.g. example.com/rack; kubernetes.io/hostname (one node per domain) "
        "only as the last level."
    )


class TopologySpec(ApiModel):
    """The levels, widest first (e.g. block, rack, hostname)."""

    model_config = validations(
        cel(
            "self.levels.all(x, self.levels.exists_one(y, y.nodeLabel == x.nodeLabel))",
            "levels must be unique",
            field_path=".levels",
        ),
        cel(
            "self.levels.all(x, x.nodeLabel != 'kubernetes.io/hostname' || "
            "x == self.levels[size(self.levels) - 1])",
            "kubernetes.io/hostname may only be the last level",
            field_path=".levels",
        ),
    )

    levels: list[TopologyLevel] = Field(
        min_length=1,
        max_length=MAX_LEVELS,
        description="Node labels from the widest domain to the narrowest.",
    )

    @model_validator(mode="after")
    def _levels_make_sense(self) -> Self:
        labels = [level.node_label for level in self.levels]
        repeated = sorted({x for x in labels if labels.count(x) > 1})
        if repeated:
            raise ValueError(f"levels must be unique: {', '.join(repeated)} appears twice")
        if HOSTNAME_LABEL in labels[:-1]:
            raise ValueError(f"{HOSTNAME_LABEL} may only be the last level")
        return self

    @property
    def labels(self) -> tuple[str, ...]:
        """The levels' node labels, widest first."""
        return tuple(level.node_label for level in self.levels)


class Topology(ApiObject):
    """How the nodes of the flavors that name it nest (cluster-scoped)."""

    crd = CrdInfo(
        plural="topologies",
        scope="Cluster",
        short_names=("topo",),
        printer_columns=(PrinterColumn("Age", ".metadata.creationTimestamp", "date"),),
    )

    api_version: Literal["muster.dev/v1alpha1"] = API_VERSION
    kind: Literal["Topology"] = "Topology"
    spec: TopologySpec


# The one-of rule of a request's kinds, in the words of both the CRD and the model.
_ONE_KIND = "at most one of required, preferred, requiredTier, preferredTier and unconstrained"


class TopologyRequest(ApiModel):
    """Where a pod set's pods must or should be, in levels of its flavor's topology.

    At most one of required, preferred (a level by its node label), requiredTier,
    preferredTier (a level counted from the narrowest, as Volcano counts HyperNode tiers) and
    unconstrained; a slice (`sliceSize` pods in a row inside one domain at
    `sliceRequiredTopology`) goes with any of them.
    """

    model_config = validations(
        cel(
            "[has(self.required), has(self.preferred), has(self.requiredTier), "
            "has(self.preferredTier), has(self.unconstrained) && self.unconstrained]"
            ".filter(x, x).size() <= 1",
            _ONE_KIND,
        ),
        cel(
            "has(self.sliceSize) == has(self.sliceRequiredTopology)",
            "sliceSize and sliceRequiredTopology go together",
        ),
    )

    required: str | None = _label(
        "Every pod in one domain at this level (its node label).", optional=True
    )
    preferred: str | None = _label(
        "In one domain at this level if one can hold them all, else at the lowest wider "
        "level that can, else anywhere in the topology.",
        optional=True,
    )
    required_tier: int | None = Field(
        None,
        ge=1,
        le=MAX_LEVELS,
        description="As required, at the level this many tiers up from the narrowest: tier 1 "
        "is the narrowest level that is not kubernetes.io/hostname (e.g. the rack), tier 2 "
        "the one above, as Volcano counts HyperNode tiers. A tier beyond the flavor's "
        "Topology waits with that reason.",
    )
    preferred_tier: int | None = Field(
        None,
        ge=1,
        le=MAX_LEVELS,
        description="As preferred, at the level counted as for requiredTier.",
    )
    unconstrained: bool | None = Field(
        None, description="Anywhere among the topology's nodes (slices still apply)."
    )
    slice_required_topology: str | None = _label(
        "Each slice of sliceSize pods in one domain at this level.", optional=True
    )
    slice_size: int | None = Field(
        None, ge=1, le=100_000, description="Pods per slice; must divide the pod count."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        kinds = (self.required, self.preferred, self.required_tier, self.preferred_tier)
        if sum(x is not None for x in kinds) + bool(self.unconstrained) > 1:
            raise ValueError(_ONE_KIND)
        if (self.slice_size is None) != (self.slice_required_topology is None):
            raise ValueError("sliceSize and sliceRequiredTopology go together")
        return self


# What other schedulers' topology constraints become, for the controller's intake and the
# importers alike: one rule each.

VOLCANO_MODES = ("hard", "soft")


class ForeignTopologyError(ValueError):
    """A foreign constraint Muster refuses: `path` below the constraint's own field, the
    `rule`, and whether the constraint is valid in its own API but beyond Muster
    (`unsupported`) rather than malformed."""

    def __init__(self, path: str, rule: str, *, unsupported: bool = False) -> None:
        super().__init__(f"{path}: {rule}" if path else rule)
        self.path = path
        self.rule = rule
        self.unsupported = unsupported


def network_topology_request(network: object) -> dict[str, Any]:
    """A Volcano `networkTopology` (HyperNode tiers, counted from the leaves) as a
    topologyRequest. Hard mode keeps every pod inside one HyperNode of tier at most
    `highestTierAllowed`, which is one domain at that tier: `requiredTier`; soft mode keeps
    them as close as it can, climbing tier by tier: `preferredTier` 1 (the highest tier is
    Volcano's for hard mode only). Volcano's CRD defaults: hard, tier 1."""
    if not isinstance(network, Mapping):
        raise ForeignTopologyError("", "must be an object")
    mode = network.get("mode") or "hard"
    if mode not in VOLCANO_MODES:
        raise ForeignTopologyError(".mode", f"must be hard or soft (got {mode!r})")
    if mode == "soft":
        return {"preferredTier": 1}
    tier = network.get("highestTierAllowed")
    tier = 1 if tier is None else tier
    if isinstance(tier, bool) or not isinstance(tier, int) or tier < 1:
        raise ForeignTopologyError(
            ".highestTierAllowed", f"must be a tier, at least 1 (got {tier!r})"
        )
    if tier > MAX_LEVELS:
        raise ForeignTopologyError(
            ".highestTierAllowed",
            f"tier {tier} is beyond any Muster Topology, which has at most {MAX_LEVELS} levels",
            unsupported=True,
        )
    return {"requiredTier": tier}


def kep5732_topology_request(constraints: object) -> dict[str, Any]:
    """A native PodGroup's `schedulingConstraints.topology` (KEP-5732: every pod within one
    value of the node label `key`, a hard constraint) as a topologyRequest: `required`.
    Its API allows one constraint; should more come, they are refused rather than some
    ignored, since Muster keeps a group to one domain."""
    if not constraints:
        return {}
    if not isinstance(constraints, list):
        raise ForeignTopologyError("", "must be a list")
    if len(constraints) > 1:
        raise ForeignTopologyError(
            "",
            "Muster honours one topology constraint per group (as kube-scheduler 1.37 does), "
            f"got {len(constraints)}",
            unsupported=True,
        )
    first = constraints[0]
    key = first.get("key") if isinstance(first, Mapping) else None
    if not isinstance(key, str) or not key:
        raise ForeignTopologyError("[0].key", "must name a node label")
    return {"required": key}
