"""The sources' topology objects as Muster Topologies: Kueue's and KAI's (levels of node
labels, widest first, as Muster's), and Volcano's HyperNodes where a node label chooses
their members. docs/import.md has the tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from quota.importers.build import manifest
from quota.importers.reader import SourceObject
from quota.importers.report import Unmapped, refuse
from quota.importers.workloads import skipped

# The Topology a Volcano import makes of the HyperNodes it can map.
HYPERNODE_TOPOLOGY = "hypernodes"


def level_topologies(
    objs: Sequence[SourceObject], unmapped: list[Unmapped]
) -> list[dict[str, Any]]:
    """Kueue's and KAI's Topology objects (`spec.levels[].nodeLabel`, widest first) as
    Muster's, under the same names; fields beside nodeLabel (KAI's alias) are reported."""
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    for obj in objs:
        if obj.name in names:
            refuse(obj.origin, "metadata.name", "Topology defined twice")
        names.add(obj.name)
        levels = []
        for i, level in enumerate(obj.items(obj.spec().get("levels"), "spec.levels")):
            path = f"spec.levels[{i}]"
            level = obj.mapping(level, path)
            label = obj.text(level.get("nodeLabel"), f"{path}.nodeLabel", required=True)
            levels.append({"nodeLabel": label})
            for key in sorted(set(level) - {"nodeLabel"}):
                skipped(obj, f"{path}.{key}", "Muster names a level by its node label", unmapped)
        out.append(
            manifest(
                obj.origin, "Topology", {"metadata": {"name": obj.name}, "spec": {"levels": levels}}
            )
        )
    return out


def _member_label(obj: SourceObject, unmapped: list[Unmapped]) -> str | None:
    """The node label whose one value chooses every member of a HyperNode, or None (and
    why, reported) when its members are not chosen so."""
    spec = obj.spec()
    keys: set[str] = set()
    for i, member in enumerate(obj.items(spec.get("members"), "spec.members")):
        path = f"spec.members[{i}]"
        member = obj.mapping(member, path)
        selector = obj.mapping(member.get("selector"), f"{path}.selector")
        kind = obj.text(member.get("type"), f"{path}.type")
        if kind != "Node":
            skipped(
                obj,
                f"{path}.type",
                f"a member of type {kind or 'unset'}: Muster's Topology levels are node labels, "
                "so a tier of HyperNodes made of HyperNodes maps only once the nodes carry a "
                "label naming it",
                unmapped,
            )
            return None
        labels = obj.mapping(selector.get("labelMatch"), f"{path}.selector.labelMatch")
        match = obj.strings(labels.get("matchLabels"), f"{path}.selector.labelMatch.matchLabels")
        if len(match) != 1 or labels.get("matchExpressions"):
            chosen = "by name" if "labelMatch" not in selector else "by several labels"
            skipped(
                obj,
                f"{path}.selector",
                f"chooses nodes {chosen}: Muster's Topology levels are node labels, one value "
                "per domain; label the nodes instead",
                unmapped,
            )
            return None
        keys.update(match)
    if len(keys) != 1:
        why = "different labels" if keys else "nothing: it has no members"
        skipped(obj, "spec.members", f"its members are chosen by {why}", unmapped)
        return None
    return next(iter(keys))


def hypernode_topology(
    objs: Sequence[SourceObject], unmapped: list[Unmapped]
) -> list[dict[str, Any]]:
    """Volcano's HyperNodes as one Topology, `hypernodes`, where they map: a tier maps to a
    node label when each of its HyperNodes takes as members the nodes with one value of that
    label (all of the tier the same label). Tiers count from 1, the HyperNodes that hold
    nodes, as Muster counts the tiers of a `networkTopology` on a Topology (its narrowest
    level that is not the hostname is tier 1), so the levels are the mapped tiers 1, 2, ...
    up to the first that does not map; the tiers above it are reported, since mapping them
    would renumber those tiers."""
    tiers: dict[int, list[SourceObject]] = {}
    for obj in objs:
        tier = obj.integer(obj.spec().get("tier"), "spec.tier", low=1)
        if tier is None:
            refuse(obj.origin, "spec.tier", "required field is missing")
        tiers.setdefault(tier, []).append(obj)
    labels: list[str] = []
    top = max(tiers, default=0)
    for tier in range(1, top + 1):
        found = {_member_label(obj, unmapped) for obj in tiers.get(tier, [])}
        label = found.pop() if len(found) == 1 else None
        if label is None or label in labels:
            if label is not None:
                why = f"tier {tier} repeats the node label {label} of a lower tier"
            elif len(found) > 1 and None not in found:
                why = f"tier {tier} mixes node labels {', '.join(sorted(map(str, found)))}"
            else:
                why = ""  # each HyperNode said why, or the tier has none
            for obj in tiers.get(tier, []) if why else []:
                skipped(obj, "spec.members", why, unmapped)
            for above in range(tier + 1, top + 1):
                for obj in tiers.get(above, []):
                    skipped(
                        obj,
                        "spec.tier",
                        f"tier {tier} does not map to a node label, so no tier above it does "
                        "(mapping it would renumber the tiers)",
                        unmapped,
                    )
            break
        labels.append(label)
    if not labels:
        return []
    origin = tiers[1][0].origin
    levels = [{"nodeLabel": label} for label in reversed(labels)]
    return [
        manifest(
            origin,
            "Topology",
            {"metadata": {"name": HYPERNODE_TOPOLOGY}, "spec": {"levels": levels}},
        )
    ]
