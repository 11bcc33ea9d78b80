"""`muster local-cluster up|down|status|env|nodes|list|build|images`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from controllers.cli.options import dir_option
from controllers.localcluster.binaries import (
    BinariesError,
    build_binaries,
    cache_bin_dir,
    find_binaries,
)
from controllers.localcluster.cluster import ClusterError, LocalCluster, known_clusters
from controllers.localcluster.names import clusters_dir, select_args
from controllers.localcluster.nodes import create_nodes
from controllers.localcluster.peers import PEERS, PeerError, parse_names
from controllers.localcluster.peers import build as build_peer
from controllers.localcluster.peers import start_all as start_peers


@click.group("local-cluster")
def local_cluster() -> None:
    """A real local Kubernetes control plane with kwok nodes, for development and tests."""


_peers_help = f"Comma-separated peer controllers ({', '.join(PEERS)})"


@local_cluster.command()
@click.option(
    "--peers",
    default="",
    help=f"{_peers_help} to build too, from their exact versions (cached like the rest).",
)
def build(peers: str) -> None:
    """Build (or find) the control-plane binaries; a no-op when they are cached."""
    try:
        wanted = parse_names(peers)
    except PeerError as exc:
        raise click.BadParameter(str(exc), param_hint="--peers") from exc
    found, missing = find_binaries()
    if missing:
        click.echo(f"building {', '.join(missing)} into {cache_bin_dir()} (first time: slow)")
        try:
            build_binaries()
        except BinariesError as exc:
            raise click.ClickException(str(exc)) from exc
        found, missing = find_binaries()
        if missing:
            raise click.ClickException(f"still missing after the build: {', '.join(missing)}")
    for name, path in sorted(found.items()):
        click.echo(f"{name:<24} {path}")
    for peer in wanted:
        if not peer.built():
            click.echo(
                f"building {peer.name} {peer.version} into {peer.directory} (first time: slow)"
            )
        try:
            build_peer(peer)
        except PeerError as exc:
            raise click.ClickException(str(exc)) from exc
        click.echo(f"{peer.name:<24} {peer.binary_path} (manifests: {peer.manifest_dir})")


@local_cluster.command()
@dir_option
@click.option("--timeout", default=120.0, show_default=True, help="Seconds to wait per component.")
@click.option(
    "--with",
    "with_peers",
    default="",
    help=f"{_peers_help} to run against the cluster, with their CRDs and webhooks.",
)
@click.option(
    "--real-node",
    is_flag=True,
    help="Also run this machine's kubelet, containerd and kube-proxy as a real node, where "
    "pods really run (root; one per machine). `down` undoes what it changed on the host.",
)
def up(directory: Path | None, timeout: float, with_peers: str, real_node: bool) -> None:
    """Start etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (and
    the peer controllers asked for; `up` again adds peers to a running cluster)."""
    try:
        parse_names(with_peers)
    except PeerError as exc:
        raise click.BadParameter(str(exc), param_hint="--with") from exc
    cluster = LocalCluster(directory)
    progress = lambda m: click.echo(m, err=True)  # noqa: E731
    try:
        if not (with_peers and cluster.running()):
            cluster.up(timeout=timeout, progress=progress, real_node=real_node)
        if with_peers:
            start_peers(cluster, with_peers, timeout=timeout, progress=progress)
    except (ClusterError, BinariesError, PeerError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"local cluster is up ({cluster.directory})", err=True)
    click.echo(cluster.env())


@local_cluster.command()
@dir_option
def down(directory: Path | None) -> None:
    """Stop every process the cluster started."""
    stopped = LocalCluster(directory).down()
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@local_cluster.command()
@dir_option
def status(directory: Path | None) -> None:
    """Show each component's state; exit 1 unless all are healthy."""
    cluster = LocalCluster(directory)
    states = cluster.status()
    if not states:
        click.echo(f"no local cluster has been started in {cluster.directory}")
        sys.exit(1)
    for name, state in states.items():
        click.echo(f"{name:<24} {state}")
    if any(s != "healthy" for s in states.values()):
        sys.exit(1)


@local_cluster.command()
@dir_option
def env(directory: Path | None) -> None:
    """Print `export KUBECONFIG=...` for this cluster (use with eval)."""
    cluster = LocalCluster(directory)
    if not cluster.kubeconfig.is_file():
        raise click.ClickException(
            f"no local cluster has been started in {cluster.directory}; run "
            f"`muster local-cluster up {select_args(cluster.directory)}`"
        )
    click.echo(cluster.env())


@local_cluster.command()
@dir_option
@click.option("--count", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--cpu", default="32", show_default=True)
@click.option("--memory", default="256Gi", show_default=True)
@click.option("--gpu", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--pods", default=110, show_default=True, type=click.IntRange(min=1))
@click.option("--label", "labels", multiple=True, help="key=value, repeatable.")
@click.option("--taint", "taints", multiple=True, help="key=value:Effect, repeatable.")
@click.option("--prefix", default="node", show_default=True)
def nodes(
    directory: Path | None,
    count: int,
    cpu: str,
    memory: str,
    gpu: int,
    pods: int,
    labels: tuple[str, ...],
    taints: tuple[str, ...],
    prefix: str,
) -> None:
    """Create fake kwok nodes of the given shape and wait until they are Ready."""
    label_map: dict[str, str] = {}
    for item in labels:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: expected key=value", param_hint="--label")
        label_map[key] = value
    taint_list: list[dict[str, str]] = []
    for item in taints:
        kv, sep, effect = item.rpartition(":")
        key, _, value = kv.partition("=")
        if not sep or not key or effect not in {"NoSchedule", "PreferNoSchedule", "NoExecute"}:
            raise click.BadParameter(
                f"{item!r}: expected key=value:NoSchedule|PreferNoSchedule|NoExecute",
                param_hint="--taint",
            )
        taint_list.append({"key": key, "value": value, "effect": effect})
    cluster = LocalCluster(directory)
    if not cluster.running():
        raise click.ClickException(
            f"the local cluster in {cluster.directory} is not running; run "
            f"`muster local-cluster up {select_args(cluster.directory)}`"
        )
    names = create_nodes(
        cluster.binaries["kubectl"],
        cluster.kubeconfig,
        count,
        prefix=prefix,
        cpu=cpu,
        memory=memory,
        gpu=gpu,
        pods=pods,
        labels=label_map,
        taints=taint_list,
    )
    click.echo("\n".join(names))


@local_cluster.command("list")
def list_clusters() -> None:
    """Every local cluster `--name` reaches (the directories beside the default cluster's):
    name, running or stopped, its directory; `*` marks the one with this machine's real node."""
    parent = clusters_dir()
    found = known_clusters(parent)
    if not found:
        click.echo(f"no local clusters in {parent} (`muster local-cluster up --name NAME`)")
        return
    rows = [("NAME", "STATE", "DIRECTORY")] + [
        (c.name + (" *" if c.real_node else ""), c.state, str(c.directory)) for c in found
    ]
    name_width = max(len(r[0]) for r in rows)
    state_width = max(len(r[1]) for r in rows)
    for name, state, where in rows:
        click.echo(f"{name:<{name_width}}  {state:<{state_width}}  {where}".rstrip())
    if any(c.real_node for c in found):
        click.echo("* runs this machine's real node")


@local_cluster.command()
def images() -> None:
    """Build (or find) the images a real node runs: pause, Muster's and the real workload's.

    Built with buildah, no Docker engine or registry, and cached by content under the cache
    directory: a tree that did not change is not built again."""
    from controllers.localcluster.images import ImageError, ensure_base, ensure_images

    progress = lambda m: click.echo(m, err=True)  # noqa: E731
    try:
        base = ensure_base(progress)
        archives = ensure_images(progress)
    except ImageError as exc:
        raise click.ClickException(str(exc)) from exc
    for archive in archives:
        size = archive.path.stat().st_size / 1e6
        click.echo(f"{archive.ref:<32} {size:7.1f} MB  {archive.path}")
    click.echo(
        f"(base, not imported: {base.ref} {base.path.stat().st_size / 1e6:.1f} MB)", err=True
    )
