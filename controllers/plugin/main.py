"""`kubectl muster ...` (the console script kubectl-muster; kubectl runs any kubectl-*
program on PATH as a plugin): queues, clusters, explain, stop/resume, topology, history,
what-if, completion."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click
import yaml
from kubernetes import config
from rich.console import Console
from rich.table import Table

from controllers.cli.options import out_dir_option
from controllers.plugin.kube import Target
from quota.simulation.report import format_seconds

if TYPE_CHECKING:  # the history store's modules load only when explain reads it
    from controllers.history.queries import TimelineEntry
    from controllers.plugin.explain import HistoryReader
    from controllers.runtime.resources import Obj

COLOR = click.Choice(["auto", "always", "never"])


def _console(color: str) -> Console:
    # auto: colour on a terminal only, so pipes and files get plain text.
    forced = {"always": True, "never": False}.get(color)
    return Console(force_terminal=forced, no_color=color == "never", highlight=False)


def _namespace(target: Target, namespace: str | None) -> str:
    """-n, else the current context's namespace, else default (as kubectl)."""
    if namespace:
        return namespace
    try:
        _, active = config.list_kube_config_contexts(config_file=target.kubeconfig)  # type: ignore[no-untyped-call]
        if target.context:
            contexts, _ = config.list_kube_config_contexts(config_file=target.kubeconfig)  # type: ignore[no-untyped-call]
            active = next((c for c in contexts if c["name"] == target.context), active)
        return str((active or {}).get("context", {}).get("namespace") or "default")
    except (config.ConfigException, OSError):
        return "default"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--kubeconfig", envvar="KUBECONFIG", default=None, help="Kubeconfig file.")
@click.option("--context", default=None, help="Kubeconfig context to use.")
@click.pass_context
def main(ctx: click.Context, kubeconfig: str | None, context: str | None) -> None:
    """Muster from kubectl: queues, worker clusters, why a Job waits, stopping queues,
    what-if simulations."""
    # KUBECONFIG may list several files (a:b); the client reads the first.
    first = kubeconfig.split(":")[0] if kubeconfig else None
    ctx.obj = Target(first or None, context)


@main.command()
@click.option(
    "-n",
    "--namespace",
    default=None,
    help="Whose LocalQueues to show if you may not list them in every namespace "
    "(default: the context's namespace).",
)
@click.option("--color", type=COLOR, default="auto", show_default=True)
@click.pass_obj
def queues(target: Target, namespace: str | None, color: str) -> None:
    """The ClusterQueue tree: usage / quota, fair share, admitted and pending, per queue."""
    from controllers.plugin.kube import Forbidden, list_all
    from controllers.plugin.queues import local_queue_tree, queue_tree, unreadable_queues
    from controllers.runtime.resources import CLUSTER_QUEUE, LOCAL_QUEUE

    kube = target.kube()
    console = _console(color)
    # A batch user bound in one namespace reads its LocalQueues only: show what they may
    # read, and say what is left out and why (docs/tenancy.md, "Roles for people").
    try:
        cqs: list[Obj] | None = list_all(kube, CLUSTER_QUEUE)
    except Forbidden as refused:
        cqs, cq_refusal = None, refused.said
    scope: str | None = None
    try:
        lqs = list_all(kube, LOCAL_QUEUE)
    except Forbidden:
        scope = _namespace(target, namespace)
        try:
            lqs = list_all(kube, LOCAL_QUEUE, scope)
        except Forbidden as refused:
            raise click.ClickException(
                f"reading the LocalQueues of namespace {scope} needs the chart's batch-user "
                f"role (or the built-in view role) there. {refused.message}"
            ) from None
    if cqs is None:
        console.print(local_queue_tree(lqs, scope))
        console.print(unreadable_queues(cq_refusal), style="yellow")
        return
    if not cqs:
        raise click.ClickException(
            "no ClusterQueues in this cluster (kubectl apply -f examples/api/ creates some)"
        )
    console.print(queue_tree(cqs, lqs))
    if scope is not None:
        console.print(
            f"local queues: those of namespace {scope} only (you may not list LocalQueues "
            "in every namespace)",
            style="yellow",
        )


@main.command()
@click.argument("name", metavar="JOB|WORKLOAD|KIND/NAME")
@click.option("-n", "--namespace", default=None, help="Default: the context's namespace.")
@click.option(
    "--database-url",
    metavar="URL",
    default=None,
    help="History store to read the timeline from too (default: $MUSTER_DATABASE_URL, if set).",
)
@click.option("--color", type=COLOR, default="auto", show_default=True)
@click.pass_obj
def explain(
    target: Target, name: str, namespace: str | None, database_url: str | None, color: str
) -> None:
    """Why a Job (or Workload, or lws/NAME, deploy/NAME, sts/NAME) waits: the engine's
    reason, the placement, its timeline."""
    import os

    from controllers.plugin.explain import explain as run_explain
    from controllers.plugin.kube import Forbidden

    ns = _namespace(target, namespace)
    url = database_url or os.environ.get("MUSTER_DATABASE_URL")
    history = _history_reader(url) if url else None
    try:
        found = run_explain(target.kube(), ns, name, _console(color), history)
    except Forbidden as refused:
        raise click.ClickException(
            f"explaining {name} needs the right to read Jobs and Workloads in namespace {ns} "
            f"(the chart's batch-user role, or the built-in view role). {refused.message}"
        ) from None
    if not found:
        what = "no Workload queued for" if "/" in name else "no Job or Workload named"
        raise click.ClickException(f"{what} {name!r} in namespace {ns}")


def _history_reader(url: str) -> HistoryReader:
    """A function (namespace, workload) -> timeline entries, or why there are none."""
    from sqlalchemy.exc import DatabaseError

    from controllers.history import migrate, queries
    from controllers.history.engine import DatabaseURLError, database_url, make_engine

    def read(namespace: str, name: str) -> list[TimelineEntry] | str:
        try:
            engine = make_engine(database_url(url))
            try:
                entries = queries.workload_timeline(engine, namespace, name)
            finally:
                engine.dispose()
        except DatabaseURLError as error:
            return str(error)
        except DatabaseError as error:  # unreachable, no schema, damaged: the rest still helps
            return f"history store at {url} {migrate.describe(error)}"
        return entries or "nothing recorded"

    return read


@main.command()
@click.option("--color", type=COLOR, default="auto", show_default=True)
@click.pass_obj
def clusters(target: Target, color: str) -> None:
    """The worker clusters queues dispatch to: answering or not, last seen, nodes, used /
    capacity per resource, workloads sent there, and the ClusterQueues that select each."""
    from datetime import UTC, datetime

    from kubernetes.client.exceptions import ApiException

    from controllers.plugin import clusters as view
    from controllers.plugin.kube import Forbidden, api_error, list_all
    from controllers.runtime.resources import CLUSTER_QUEUE, WORKER_CLUSTER

    kube = target.kube()
    try:
        workers, _ = kube.list(WORKER_CLUSTER)
    except ApiException as error:
        if error.status == 404:
            raise click.ClickException(
                "this cluster does not serve WorkerClusters (muster.dev/v1alpha1): apply "
                "Muster's CRDs (kubectl apply --server-side -f crds/, or the chart)"
            ) from None
        raise api_error(error, "listing WorkerClusters") from None
    except Exception as error:  # connection refused, DNS, TLS
        raise click.ClickException(f"cannot reach the cluster: {error}") from None
    if not workers:
        click.echo(view.NO_WORKERS)
        return
    console = _console(color)
    try:
        cqs: list[Obj] | None = list_all(kube, CLUSTER_QUEUE)
    except Forbidden:
        cqs = None
    if not console.is_terminal:
        console.width = 100_000  # a row per cluster, as kubectl get prints: never wrapped
    dispatchers = view.Dispatchers.of(cqs)
    console.print(view.clusters_table(workers, dispatchers, datetime.now(UTC)))
    for note in view.notes(dispatchers):
        console.print(note, style="yellow")


@main.command()
@click.argument("queue")
@click.option("--drain", is_flag=True, help="Also evict what the queue has admitted.")
@click.pass_obj
def stop(target: Target, queue: str, drain: bool) -> None:
    """Stop a ClusterQueue: admit nothing new (--drain: also evict what runs)."""
    from controllers.plugin.stop import StopPolicy, set_stop_policy

    policy: StopPolicy = "HoldAndDrain" if drain else "Hold"
    before = set_stop_policy(target.kube(), queue, policy)
    click.echo(f"clusterqueue/{queue} stopped ({policy}; was {before})")


@main.command()
@click.argument("queue")
@click.pass_obj
def resume(target: Target, queue: str) -> None:
    """Resume a stopped ClusterQueue."""
    from controllers.plugin.stop import set_stop_policy

    before = set_stop_policy(target.kube(), queue, "None")
    click.echo(f"clusterqueue/{queue} resumed (was {before})")


def _complete_names(plural: str) -> Callable[[click.Context, click.Parameter, str], list[str]]:
    """Completion of cluster-scoped Muster objects' names, read from the cluster (nothing
    when it cannot be reached or read: completion never prints an error)."""

    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
        from controllers.plugin.kube import list_all
        from controllers.runtime.resources import muster_kind

        target = ctx.find_object(Target) or Target()
        try:
            kube = target.kube()
            items = list_all(kube, muster_kind("", plural, False))
        except click.ClickException:
            return []
        names = (str(o["metadata"]["name"]) for o in items)
        return sorted(n for n in names if n.startswith(incomplete))

    return complete


@main.command()
@click.argument("name", required=False, shell_complete=_complete_names("topologies"))
@click.option(
    "--flavor",
    default=None,
    metavar="FLAVOR",
    shell_complete=_complete_names("resourceflavors"),
    help="Only this ResourceFlavor's nodes.",
)
@click.option(
    "--gpus",
    type=click.IntRange(min=1),
    default=None,
    help="Per domain, how many pods asking this many of --resource it holds now.",
)
@click.option("--resource", default="nvidia.com/gpu", show_default=True, help="What --gpus counts.")
@click.option(
    "--fits",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="With --gpus: mark the domains that hold N such pods, and say where a gang of N "
    "required in one domain of each level would go now (or why it would wait).",
)
@click.option(
    "--depth",
    type=click.IntRange(min=1),
    default=None,
    help="Levels shown below the flavor (nodes count as one). Default: every level.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Domains shown under each domain: the roomiest; the rest in one line.",
)
@click.option("--all", "show_all", is_flag=True, help="Every level and every domain.")
@click.option("--color", type=COLOR, default="auto", show_default=True)
@click.pass_obj
def topology(
    target: Target,
    name: str | None,
    flavor: str | None,
    gpus: int | None,
    resource: str,
    fits: int | None,
    depth: int | None,
    limit: int,
    show_all: bool,
    color: str,
) -> None:
    """Free room per domain of each Topology (block > rack > node): nodes, free GPUs, pods."""
    from controllers.plugin import topology as topo

    if fits is not None and gpus is None:
        raise click.UsageError("--fits needs --gpus: the pods whose room it counts")
    cluster = topo.read_cluster(target.kube())
    console = _console(color)
    if not console.is_terminal:
        # A row per domain, as kubectl get prints: piped into grep or a file, never wrapped.
        console.width = 100_000
    for problem in cluster.left_out:
        console.print(f"left out: {problem}", style="yellow")
    shape = topo.Shape(resource, gpus, fits) if gpus is not None else None
    flavors, notes = topo.views(cluster, shape, name, flavor)
    if not flavors and not notes:
        raise click.ClickException(topo.nothing_to_show(cluster, name, flavor))
    for view in flavors:
        console.print(
            topo.render(view, shape, None if show_all else depth, None if show_all else limit)
        )
    for note in notes:
        console.print(note, style="yellow")
    if cluster.pods is None:
        console.print(topo.pods_hidden(cluster.pods_refused), style="yellow")
    elif cluster.workloads_refused:
        console.print(topo.reservations_hidden(cluster.workloads_refused), style="yellow")


@main.command("what-if")
@click.option(
    "--set",
    "changes",
    multiple=True,
    metavar="QUEUE[.FLAVOR].quota|limit.RESOURCE=AMOUNT",
    help="A proposed change (repeatable), e.g. team-a.quota.nvidia.com/gpu=16.",
)
@click.option(
    "--run-for",
    default="1h",
    show_default=True,
    help="How long a Job runs when it has no muster.dev/run-for annotation.",
)
@click.option(
    "--export",
    "export_only",
    is_flag=True,
    help="Print the exported scenario (YAML for `muster simulate`) and stop.",
)
@out_dir_option(
    "Also write both runs' html reports (the views of `muster simulate --output html`) "
    "into this directory: now.html and with-change.html."
)
@click.option("--color", type=COLOR, default="auto", show_default=True)
@click.pass_obj
def what_if(
    target: Target,
    changes: tuple[str, ...],
    run_for: str,
    export_only: bool,
    out_dir: Path | None,
    color: str,
) -> None:
    """Simulate the live cluster as it is and with a change; print how waits would change."""
    import copy

    from controllers.plugin import whatif
    from quota.api.meta import parse_duration

    try:
        default_run = parse_duration(run_for).total_seconds()
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--run-for") from None
    from controllers.plugin.kube import Forbidden

    skipped: list[str] = []
    try:
        docs = whatif.export_scenario(target.kube(), default_run, skipped=skipped)
    except Forbidden as refused:
        raise click.ClickException(
            "what-if simulates the whole cluster: it needs to read its flavors, ClusterQueues, "
            "every namespace's LocalQueues and queued Jobs, its nodes and priority classes "
            f"(a cluster admin's view of it). {refused.message}"
        ) from None
    for problem in skipped:
        click.echo(f"left out of the simulation: {problem}", err=True)
    if export_only:
        click.echo(yaml.safe_dump_all(docs, sort_keys=False), nl=False)
        return
    if not changes:
        raise click.UsageError("name a change with --set (or print the scenario with --export)")
    proposed = copy.deepcopy(docs)
    for change in changes:
        whatif.apply_change(proposed, change)
    before = whatif.run(docs, "the cluster as it is")
    after = whatif.run(proposed, "the cluster with " + ", ".join(changes))
    console = _console(color)
    table = Table(title="waits: now -> with " + ", ".join(changes), title_justify="left")
    for col in ("ClusterQueue", "jobs", "mean wait", "max wait"):
        table.add_column(col)
    for row in whatif.compare(before, after):
        table.add_row(
            row.queue,
            str(row.jobs),
            f"{format_seconds(row.before_mean)} -> {format_seconds(row.after_mean)}",
            f"{format_seconds(row.before_max)} -> {format_seconds(row.after_max)}",
        )
    console.print(table)
    moved = whatif.changed_jobs(before, after)
    for key, b, a in moved:
        console.print(f"  {key}: waits {format_seconds(b)} -> {format_seconds(a)}")
    if not moved:
        console.print("no Job's wait changes")
    if out_dir is not None:
        from controllers.simreport.html import render_html

        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            for name, result in (("now.html", before), ("with-change.html", after)):
                (out_dir / name).write_text(render_html(result), encoding="utf-8")
        except OSError as error:
            raise click.ClickException(f"--out {out_dir}: {error.strerror}") from None
        console.print(f"reports: {out_dir / 'now.html'}, {out_dir / 'with-change.html'}")


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,  # --help goes to `muster history`, which lists its questions
)
@click.pass_context
def history(ctx: click.Context) -> None:
    """The history store's answers (`muster history ...`: workload, queue, preemptions)."""
    from controllers.cli.history import history as history_group

    history_group.main(args=ctx.args, prog_name="kubectl muster history")


@main.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script: `source <(kubectl muster completion bash)`.

    It completes `kubectl-muster`; kubectl >= 1.26 completes `kubectl muster ...` through
    the kubectl_complete-muster program installed beside it."""
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None  # the three above are click's own
    script = cls(main, {}, "kubectl-muster", "_KUBECTL_MUSTER_COMPLETE").source()
    sys.stdout.write(script)


def complete() -> None:
    """kubectl_complete-muster: kubectl (>= 1.26) runs it with the words typed after
    `kubectl muster`, and prints one candidate per line."""
    from click.shell_completion import ShellComplete

    args = sys.argv[1:]
    incomplete = args.pop() if args else ""
    completer = ShellComplete(main, {}, "kubectl-muster", "_KUBECTL_MUSTER_COMPLETE")
    for item in completer.get_completions(args, incomplete):
        print(item.value)
    # kubectl's protocol: a final ":<directive>" line (4: no file completion).
    print(":4")
