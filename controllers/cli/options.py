"""Options several commands share, declared once so they read and default the same way."""

from __future__ import annotations

from pathlib import Path

import click

# `--output table|json`: what `muster history ...`, `fairshare` and `admit` print.
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
