"""Options several commands share, declared once so they read and default the same way."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

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

# `--dir`: which local cluster `muster local-cluster ...`, `up` and `down` act on.
dir_option = click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path),
    default=None,
    help="State directory of the cluster (default: $MUSTER_LOCAL_CLUSTER_DIR or "
    "~/.cache/muster/local-cluster/default).",
)


def out_dir_option(help: str) -> Callable[[Any], Any]:
    """`--out DIRECTORY` (the parameter `out_dir`): also write files there; `help` says which."""
    return click.option(
        "--out",
        "out_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help=help,
    )
