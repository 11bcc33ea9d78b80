"""`muster fairshare FILE` and `muster admit FILE`: the quota engine on a file, no cluster.

FILE is a multi-document YAML of ResourceFlavors, ClusterQueues, LocalQueues, Nodes (or
none: quota-only mode), PriorityClasses and Workloads (pending, or admitted with
`status.admission`). `fairshare` prints each queue's fair share, usage and demand per
flavor/resource; `admit` runs one admission cycle and prints its decisions. A malformed file
is rejected with the document's index, the field and the rule, and a non-zero exit.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Table

from controllers.cli.options import output_option
from controllers.runtime.gcpause import paused_collection
from quota.admission.cycle import admission_cycle
from quota.api import ManifestError
from quota.api.quantity import format_quantity
from quota.fairness.fairshare import FairShare, fair_share
from quota.manifests.cluster import ClusterState, cluster_state
from quota.model.decisions import CycleResult
from quota.model.resources import FlavorResource
from quota.model.snapshot import Snapshot
from quota.simulation.report import key_name, tree_order

# Limits on what a file may hold: far above any real cluster or scenario, low enough that a
# file cannot make the tools run for minutes or exhaust memory before saying what is wrong.
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 40  # nesting of mappings and lists within one document
MAX_VALUES = 2_000_000  # values in one document, YAML aliases expanded


def load_documents(path: Path) -> list[Any]:
    """The YAML documents of `path`. Anything that is not a readable, UTF-8, well-formed and
    reasonably sized YAML file becomes a ClickException naming the file and the rule (and
    the line where there is one); so does a file with no documents at all."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise click.ClickException(
                f"{path}: {size:,} bytes; at most {MAX_FILE_BYTES:,} are read (split the file)"
            )
        data = path.read_bytes()
    except OSError as error:
        raise click.ClickException(f"{path}: {error.strerror or error}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise click.ClickException(
            f"{path}: not UTF-8 text: byte 0x{data[error.start]:02x} on line {line} "
            f"(save the file as UTF-8)"
        ) from None
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise click.ClickException(f"{path}: not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise click.ClickException(
            f"{path}: nested too deeply (at most {MAX_DEPTH} levels of mappings and lists)"
        ) from None
    except ValueError as error:  # an integer of more digits than Python converts
        problem = str(error).split(":", 1)[0].lower()
        raise click.ClickException(f"{path}: not valid YAML: a number {problem}") from None
    for index, doc in enumerate(docs):
        depth, values = _shape(doc)
        if depth < 0:
            raise click.ClickException(
                f"{path}: document {index}: contains itself through a YAML alias"
            )
        if depth > MAX_DEPTH:
            raise click.ClickException(
                f"{path}: document {index}: nested more than {MAX_DEPTH} levels of mappings "
                "and lists"
            )
        if values > MAX_VALUES:
            raise click.ClickException(
                f"{path}: document {index}: {values:,} values once its aliases are expanded; "
                f"at most {MAX_VALUES:,}"
            )
    if all(doc is None for doc in docs):
        raise click.ClickException(f"{path}: the file holds no documents")
    return docs


def _shape(doc: Any) -> tuple[int, int]:
    """(nesting depth, number of values with YAML aliases expanded) of a document, without
    recursion and without expanding the aliases: any input is measured quickly. A document
    that contains itself (a recursive alias) has depth -1."""
    known: dict[int, tuple[int, int]] = {}
    open_: set[int] = set()
    stack: list[tuple[Any, bool]] = [(doc, False)]
    while stack:
        node, expanded = stack.pop()
        if not isinstance(node, dict | list):
            continue
        children = list(node.values()) if isinstance(node, dict) else node
        if not expanded:
            if id(node) in open_:
                return -1, 0
            if id(node) in known:
                continue
            open_.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in children)
            continue
        shapes = [known.get(id(child), (0, 1)) for child in children]
        open_.discard(id(node))
        known[id(node)] = (
            1 + max((d for d, _ in shapes), default=0),
            1 + sum(n for _, n in shapes),
        )
    return known.get(id(doc), (0, 1))


def _now(text: str | None) -> float:
    if text is None:
        return datetime.now(UTC).timestamp()
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not an ISO 8601 time (e.g. 2025-01-06T09:00:00Z)", param_hint="--now"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _state(path: Path, now: str | None, *, place: bool) -> ClusterState:
    docs = load_documents(path)
    try:
        return cluster_state(docs, _now(now), place=place)
    except ManifestError as error:
        raise click.ClickException(f"{path}: {error}") from None


def fair_share_table(snapshot: Snapshot, fair: FairShare) -> dict[str, Any]:
    """The documented JSON: per queue and "flavor/resource", fairShare, usage, demand, quota
    and limit (null when unlimited), in base units."""
    queues: dict[str, dict[str, dict[str, int | None]]] = {}
    for name, _ in tree_order(snapshot.queues):
        spec = snapshot.queues[name]
        shares = fair.shares.get(name, {})
        usage = fair.usage.get(name, {})
        demand = fair.demand.get(name, {})
        keys: set[FlavorResource] = set(spec.quotas) | set(spec.limits)
        keys |= {k for k, v in shares.items() if v} | {k for k, v in usage.items() if v}
        keys |= {k for k, v in demand.items() if v}
        queues[name] = {
            key_name(key): {
                "fairShare": shares.get(key, 0),
                "usage": usage.get(key, 0),
                "demand": demand.get(key, 0),
                "quota": spec.quota_for(*key),
                "limit": spec.limit_for(*key),
            }
            for key in sorted(keys)
        }
    return {"queues": queues}


def _amount(key: str, value: int | None) -> str:
    if value is None:
        return "-"
    return format_quantity(value, key.split("/", 1)[1])


def _print_fair_share(data: Mapping[str, Any], snapshot: Snapshot) -> None:
    depth = dict(tree_order(snapshot.queues))
    table = Table(title="Fair share per queue (usage and demand of the whole subtree)")
    for column in ("Queue", "Flavor/resource", "Quota", "Limit", "Usage", "Demand", "Fair share"):
        table.add_column(
            column, justify="left" if column in ("Queue", "Flavor/resource") else "right"
        )
    for name, entries in data["queues"].items():
        label = "  " * depth.get(name, 0) + name
        if not entries:
            table.add_row(label, "-", "", "", "", "", "")
        for i, (key, e) in enumerate(entries.items()):
            table.add_row(
                label if i == 0 else "",
                key,
                _amount(key, e["quota"]),
                _amount(key, e["limit"]),
                _amount(key, e["usage"]),
                _amount(key, e["demand"]),
                _amount(key, e["fairShare"]),
            )
    Console().print(table)


_now_option = click.option(
    "--now",
    "now",
    metavar="TIME",
    default=None,
    help="The time the cycle runs at, ISO 8601 (default: the current time); decides which "
    "admitted workloads are still protected by a minimum runtime.",
)
_file = click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path)
)


@click.command("fairshare")
@_file
@output_option
@_now_option
def fairshare(file: Path, output: str, now: str | None) -> None:
    """Print each queue's fair share, usage and demand per flavor/resource for FILE."""
    state = _state(file, now, place=False)
    data = fair_share_table(state.snapshot, fair_share(state.snapshot))
    _report(output, data, lambda: _print_fair_share(data, state.snapshot))


def _print_decisions(result: CycleResult) -> None:
    console = Console()
    table = Table(title="One admission cycle")
    for column in ("Decision", "Workload", "Queue", "Why"):
        table.add_column(column, overflow="fold")
    for admit in result.admit:
        table.add_row("admit", admit.workload, admit.queue, admit.reason)
    for preempt in result.preempt:
        for victim in preempt.victims:
            table.add_row(
                victim.kind.lower(),
                victim.workload,
                victim.queue,
                f"for {preempt.preemptor}: {victim.reason}",
            )
    for victim in result.drain:
        table.add_row("drain", victim.workload, victim.queue, victim.reason)
    for pending in result.pending:
        table.add_row("pending", pending.workload, pending.queue, pending.reason)
    console.print(table)


@click.command("admit")
@_file
@output_option
@_now_option
def admit(file: Path, output: str, now: str | None) -> None:
    """Run one admission cycle on FILE and print what it decides: on its Nodes when it has
    any (the admitted Workloads naming the nodes their pods run on), else on quota alone."""
    state = _state(file, now, place=True)
    with paused_collection():
        result = state.with_waiting(admission_cycle(state.snapshot))
    _report(output, result.to_dict(), lambda: _print_decisions(result))


def _report(output: str, data: Any, table: Callable[[], None]) -> None:
    """`data` as JSON on stdout (`--output json`), else the `table`."""
    if output == "json":
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        table()
