"""`muster import kueue|kai|volcano FILE...`: another project's queue objects as Muster
manifests, what could not be carried over, and (with --simulate) the waits teams would see.

The mapping is pure (`quota.importers`); this module reads the files with the same checks
as `muster fairshare`, prints or writes the manifests, and reports every unmapped field on
stderr as `FILE: document N (KIND NAME): FIELD: reason`.

Exit status: 0 when the import succeeded (unmapped fields are reported, not fatal); 1 when
a file is malformed (the message names the file, the document, the object, the field and
the rule); 2 for a wrong command line.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console

from controllers.cli.fairshare import load_documents
from controllers.runtime.gcpause import paused_collection
from controllers.simreport.table import render_table
from quota.api import ManifestError
from quota.api.meta import parse_duration
from quota.importers import SOURCES, ImportInputError, ImportResult, import_documents
from quota.importers.simulation import to_scenario
from quota.manifests.cluster import cluster_state
from quota.simulation.simulator import simulate

QUEUES_FILE = "queues.yaml"  # what to apply to the cluster
CLUSTER_FILE = "cluster.yaml"  # queues, nodes and pending work: `muster fairshare` input


def _dump(docs: list[Any]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)


def _check(result: ImportResult) -> None:
    """The imported manifests must be what `muster fairshare` accepts; anything else is a
    bug of the importer, said as such rather than written out."""
    docs = [*result.manifests, *(w.manifest for w in result.workloads)]
    try:
        cluster_state(docs, 0.0)
    except ManifestError as error:
        raise click.ClickException(
            f"the imported manifests are not a valid Muster cluster: {error}"
        ) from None


def _report(result: ImportResult) -> None:
    if not result.unmapped:
        click.echo("Everything was mapped.", err=True)
        return
    click.echo(f"Not mapped ({len(result.unmapped)}):", err=True)
    for entry in result.unmapped:
        click.echo(f"  {entry}", err=True)


@click.command("import")
@click.argument("source", type=click.Choice(sorted(SOURCES)))
@click.argument(
    "files",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path),
)
@click.option(
    "-o",
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help=f"Write {QUEUES_FILE} (to apply) and {CLUSTER_FILE} (queues, nodes and pending work, "
    "for `muster fairshare`) here instead of printing the manifests.",
)
@click.option(
    "--simulate",
    "simulate_",
    is_flag=True,
    help="Also run the imported queues, nodes and pending work through Muster's simulator "
    "and print the waits each queue would see.",
)
@click.option(
    "--run-for",
    metavar="DURATION",
    default="1h",
    show_default=True,
    help="With --simulate: how long each workload runs once admitted, unless it carries "
    "the annotation muster.dev/run-for.",
)
def import_command(
    source: str, files: tuple[Path, ...], out_dir: Path | None, simulate_: bool, run_for: str
) -> None:
    """Turn SOURCE's (kueue, kai or volcano) queue objects in FILE... into Muster manifests."""
    try:
        default_run = parse_duration(run_for).total_seconds()
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--run-for") from None
    if default_run <= 0:
        raise click.BadParameter("must be a positive duration", param_hint="--run-for")
    loaded = [(str(path), load_documents(path)) for path in files]
    try:
        result = import_documents(source, loaded)
    except ImportInputError as error:
        raise click.ClickException(str(error)) from None
    if not result.manifests:
        raise click.ClickException(
            f"no {source} queue objects in {', '.join(str(f) for f in files)}"
        )
    _check(result)
    queues = [m for m in result.manifests if m.get("kind") != "Node"]
    everything = [*result.manifests, *(w.manifest for w in result.workloads)]
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / QUEUES_FILE).write_text(_dump(queues), encoding="utf-8")
        (out_dir / CLUSTER_FILE).write_text(_dump(everything), encoding="utf-8")
        click.echo(
            f"wrote {out_dir / QUEUES_FILE} ({len(queues)} objects) and "
            f"{out_dir / CLUSTER_FILE} ({len(everything)} objects)",
            err=True,
        )
    elif not simulate_:
        sys.stdout.write(_dump(everything))
    _report(result)
    if simulate_:
        try:
            scenario = to_scenario(result, default_run, name=f"{source} import")
        except ManifestError as error:
            raise click.ClickException(f"cannot simulate the import: {error}") from None
        if not scenario.jobs:
            raise click.ClickException(
                "nothing to simulate: the files hold no pending work for the imported queues"
            )
        with paused_collection():
            outcome = simulate(scenario, 0, record=False)
        sys.stdout.flush()
        render_table(outcome, Console(width=None if sys.stdout.isatty() else 120))
