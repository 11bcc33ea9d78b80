"""`muster up` and `muster down`: Muster running for real on a local cluster, in one command.

The command lives beside what it drives (as `kubectl muster` lives in plugin/). It reads the
plugin's views and the apiserver, imported inside the command so that naming it costs
`muster --help` nothing (controllers/main.py)."""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.live import Live

from controllers.cli.fairshare import load_documents
from controllers.cli.options import dir_option
from controllers.localcluster.binaries import BinariesError
from controllers.localcluster.cluster import ClusterError, LocalCluster
from controllers.up.plan import plan_scenario
from controllers.up.stack import REPO, Stack, UpError, start, stop
from quota.api import ManifestError

if TYPE_CHECKING:
    from controllers.up.liveview import LiveView
    from controllers.up.player import Player

DEMO = REPO / "examples" / "demo.yaml"


@click.command("up")
@click.argument("scenario", required=False, type=click.Path(path_type=Path, dir_okay=False))
@dir_option
@click.option(
    "--database-url",
    default=None,
    help="History store. In the cluster (default): the database `make setup` prepares in "
    "this machine's PostgreSQL, at the address pods reach it; the URL must work from pods "
    "and from here. Out of cluster: an SQLite file in the cluster's directory.",
)
@click.option(
    "--out-of-cluster",
    is_flag=True,
    help="Run the controller on this machine instead of as the chart's pods on the local "
    "cluster's real node (for a machine where a kubelet cannot run: not root, no containerd).",
)
@click.option(
    "--chart/--no-chart",
    default=None,
    help="Out of cluster: install Muster's CRDs and RBAC with its Helm chart and run as its "
    "ServiceAccount (default: when helm is found).",
)
@click.option(
    "--for",
    "duration",
    type=click.FloatRange(min=0),
    default=None,
    help="Leave the live view after this many seconds (default: at Ctrl-C). Muster keeps "
    "running either way, until `muster down`.",
)
@click.option(
    "--plain/--live",
    default=None,
    help="Print decisions as lines instead of redrawing the view (default: lines when the "
    "output is not a terminal).",
)
def up(
    scenario: Path | None,
    directory: Path | None,
    database_url: str | None,
    out_of_cluster: bool,
    chart: bool | None,
    duration: float | None,
    plain: bool | None,
) -> None:
    """Start a local cluster with Muster on it and play SCENARIO (default: examples/demo.yaml)
    on it in real time, with a live view of queues, waits and decisions until Ctrl-C.

    SCENARIO is a `muster simulate` file: its organisation is applied, its Nodes and
    NodePools become kwok nodes, its Jobs, generated workloads and ScaleEvents happen at
    their times. Run again while Muster is up to watch it again; `muster down` stops
    everything this started.
    """
    from controllers.history.engine import make_engine
    from controllers.plugin.kube import Target
    from controllers.up.liveview import LiveView
    from controllers.up.player import Player

    path = scenario or DEMO
    try:
        plan = plan_scenario(load_documents(path), name=path.stem)
    except ManifestError as error:
        raise click.ClickException(f"{path}: {error}") from None
    cluster = LocalCluster(directory)
    stack = Stack.load(cluster.directory)
    attach = stack is not None and stack.controller_alive() and bool(cluster.running())
    err = Console(stderr=True)
    try:
        if attach:
            assert stack is not None
            err.print(f"Muster is already up ({cluster.directory}); showing the live view.")
        else:
            stack = start(
                cluster,
                plan,
                scenario=str(path),
                database_url=database_url,
                use_chart=chart,
                in_cluster=not out_of_cluster,
                progress=lambda m: err.print(f"[dim]{m}[/dim]"),
            )
    except (UpError, ClusterError, BinariesError) as error:
        raise click.ClickException(f"{error}\n`muster down` stops what was started.") from None
    except KeyboardInterrupt:
        raise click.ClickException("interrupted; `muster down` stops what was started") from None
    assert stack is not None
    kube = Target(stack.kubeconfig).kube()
    view = LiveView(
        kube,
        make_engine(stack.database_url),
        datetime.fromtimestamp(stack.started_at, UTC),
        f"Muster on {cluster.directory.name}: {Path(stack.scenario).name}",
    )
    plain = plain if plain is not None else not sys.stdout.isatty()
    player = None
    if not attach:

        def report(line: str) -> None:
            view.activity.append(line)
            if plain:
                click.echo(f"demo: {line}")

        player = Player(kube, plan, report)
        player.start()
    try:
        _watch(view, player, duration, plain)
    except KeyboardInterrupt:
        pass
    finally:
        if player is not None:
            player.stop()
    tools = _tools_dir()
    click.echo(
        "\nMuster keeps running. Use the cluster with "
        f'`eval "$({tools}muster local-cluster env)"`, then kubectl or '
        f"`{tools}kubectl-muster queues`; the controller's log is {stack.controller_log}. "
        f"`{tools}muster down` stops everything.",
        err=True,
    )


def _tools_dir() -> str:
    """Where `muster` and `kubectl-muster` are, as the user would type it ("" on PATH)."""
    here = Path(sys.executable).parent
    if shutil.which("muster") == str(here / "muster"):
        return ""
    with contextlib.suppress(ValueError):
        return f"{here.relative_to(Path.cwd())}/"
    return f"{here}/"


def _footer(player: Player | None, started: float) -> str:
    elapsed = time.monotonic() - started
    played = f"demo: {player.done}/{player.total} steps played, " if player is not None else ""
    return f"{played}{elapsed:.0f}s — Ctrl-C leaves the view; `muster down` stops Muster"


def _watch(view: LiveView, player: Player | None, duration: float | None, plain: bool) -> None:
    started = time.monotonic()
    deadline = None if duration is None else started + duration
    if plain:
        last_queues = 0.0
        while deadline is None or time.monotonic() < deadline:
            picture = view.read()
            for line in view.new_lines(picture):
                click.echo(line)
            if time.monotonic() - last_queues >= 30.0:
                last_queues = time.monotonic()
                Console(width=120, no_color=True).print(
                    view.render(picture, _footer(player, started))
                )
            time.sleep(2.0)
        Console(width=120, no_color=True).print(view.render(view.read(), _footer(player, started)))
        return
    with Live(console=Console(), refresh_per_second=2, screen=False) as live:
        while deadline is None or time.monotonic() < deadline:
            live.update(view.render(view.read(), _footer(player, started)))
            time.sleep(2.0)


@click.command("down")
@dir_option
def down(directory: Path | None) -> None:
    """Stop everything `muster up` started (the controller and the local cluster), by pid."""
    stopped = stop(LocalCluster(directory).directory)
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
