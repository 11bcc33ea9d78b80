"""Where each local cluster keeps its state, and the names that pick one.

Every cluster lives in a directory of its own (its pids, PKI, kubeconfig, logs and etcd
data), so several run side by side: `--name NAME` is the directory NAME beside the default
cluster's (whose name is `default`), `--dir` any directory at all.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

DEFAULT_NAME = "default"
# A DNS label (RFC 1123), as Kubernetes names a namespace: the name also goes into the
# kubeconfig's context and may one day name a WorkerCluster.
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# The context of the default cluster's kubeconfig, as it always was.
DEFAULT_CONTEXT = "muster-local"


def default_dir() -> Path:
    """$MUSTER_LOCAL_CLUSTER_DIR, else ~/.cache/muster/local-cluster/default."""
    env = os.environ.get("MUSTER_LOCAL_CLUSTER_DIR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "muster" / "local-cluster" / DEFAULT_NAME


def clusters_dir() -> Path:
    """The directory holding every named cluster: the default cluster's parent."""
    return default_dir().resolve().parent


def check_name(name: str) -> str:
    """`name` if it is a DNS label, else ValueError saying what a name may be."""
    if len(name) > 63 or not _LABEL.match(name):
        raise ValueError(
            f"{name!r} is not a valid cluster name: a DNS label is wanted (at most 63 "
            "lower-case letters, digits and '-', starting and ending with a letter or digit)"
        )
    return name


def named_dir(name: str) -> Path:
    """The state directory of the cluster called `name`."""
    return clusters_dir() / check_name(name)


def name_of(directory: Path) -> str | None:
    """The name `--name` knows the cluster in `directory` by, or None when only `--dir`
    reaches it (it lives elsewhere)."""
    directory = directory.resolve()
    return directory.name if directory.parent == clusters_dir() else None


def select_args(directory: Path) -> str:
    """The option that picks this cluster on the command line: `--name NAME` or `--dir DIR`."""
    name = name_of(directory)
    if name is not None and _LABEL.match(name):
        return f"--name {name}"
    return f"--dir {directory}"


def context_name(directory: Path) -> str:
    """The cluster's and context's name in its kubeconfig: distinct per cluster, so that
    kubeconfigs of several clusters can be merged (KUBECONFIG=a:b, `kubectl config view
    --flatten`); the default cluster keeps `muster-local`."""
    name = directory.resolve().name
    return DEFAULT_CONTEXT if name == DEFAULT_NAME else f"{DEFAULT_CONTEXT}-{name}"
