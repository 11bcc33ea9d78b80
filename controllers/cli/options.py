"""Options several commands share, declared once so they read and default the same way."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from controllers.localcluster.names import check_name, named_dir

# `--output table|json`: a human-readable table, or the same answer as JSON for scripts
# (`muster history ...`, `fairshare`, `admit`).
output_option = click.option(
    "--output",
    "-o",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="Human-readable table or JSON.",
)

# Where named clusters live when $MUSTER_LOCAL_CLUSTER_DIR is not set (for --help).
_DEFAULT_PARENT = "~/.cache/muster/local-cluster"


def dir_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--dir DIR` or `--name NAME`: which local cluster `muster local-cluster ...`, `up` and
    `down` act on. The command receives one parameter, `directory` (None: the default
    cluster); NAME is the directory NAME beside the default cluster's."""

    @functools.wraps(command)
    def chosen(*args: Any, directory: Path | None, cluster_name: str | None, **kwargs: Any) -> Any:
        if cluster_name is not None and directory is not None:
            raise click.UsageError(
                "--name and --dir both choose the cluster: give one of them "
                "(--name NAME is the directory NAME beside the default cluster's)"
            )
        if cluster_name is not None:
            directory = named_dir(cluster_name)
        return command(*args, directory=directory, **kwargs)

    chosen = click.option(
        "--name",
        "cluster_name",
        default=None,
        metavar="NAME",
        callback=_check_cluster_name,
        help=f"Name of the cluster (a DNS label): its state is in {_DEFAULT_PARENT}/NAME, "
        "beside the default cluster's (named default). `muster local-cluster list` shows "
        "them. Not with --dir.",
    )(chosen)
    return click.option(
        "--dir",
        "directory",
        type=click.Path(path_type=Path),
        default=None,
        help="State directory of the cluster (default: $MUSTER_LOCAL_CLUSTER_DIR or "
        f"{_DEFAULT_PARENT}/default).",
    )(chosen)


def _check_cluster_name(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> str | None:
    if value is None:
        return None
    try:
        return check_name(value)
    except ValueError as error:
        raise click.BadParameter(str(error), ctx, param) from None


def out_dir_option(help: str) -> Callable[[Any], Any]:
    """`--out DIRECTORY` (the parameter `out_dir`): also write files there; `help` says which."""
    return click.option(
        "--out",
        "out_dir",
        type=click.Path(path_type=Path),
        default=None,
        help=help,
    )
