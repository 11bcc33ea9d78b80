"""`muster bench`: benchmarks that print figures (they never fail on time)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import click

_BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> ModuleType:
    """Import a benchmark script from the repository's bench/ folder (it is not a package)."""
    path = _BENCH_DIR / f"{name}.py"
    if not path.exists():
        raise click.ClickException(f"benchmark script {path} not found (run from a checkout)")
    spec = importlib.util.spec_from_file_location(f"muster_bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@click.group()
def bench() -> None:
    """Run a benchmark and print its figures."""


@bench.command("quota")
@click.option(
    "--scale",
    type=click.IntRange(min=1),
    multiple=True,
    help="Size factor (1 = 1,110 queues and 50,000 workloads); repeat for several. "
    "Default: 1 and 10.",
)
@click.option("--per-leaf", default=50, show_default=True, help="Pending workloads per leaf.")
@click.option("--repeat", default=20, show_default=True, help="Fair-share repetitions.")
def quota(scale: tuple[int, ...], per_leaf: int, repeat: int) -> None:
    """Fair share over a 3-level tree and one admission cycle over 50,000 pending workloads."""
    module = _load("quota_bench")
    module.run(list(scale) or [1, 10], per_leaf, repeat, click.echo)


@bench.command(
    "scheduler",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def scheduler(args: tuple[str, ...]) -> None:
    """kube-scheduler's native gang scheduling vs Muster's scheduler on one local cluster,
    and the KAI-Scheduler scale test (options: `muster bench scheduler --help`)."""
    module = _load("scheduler_bench")
    module.main(list(args))


@bench.command(
    "preemption",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def preemption(args: tuple[str, ...]) -> None:
    """Preemption on nodes in memory: 1,000 nodes full of 10-pod groups, 100 high-priority
    groups (options: `muster bench preemption --help`)."""
    module = _load("preemption_bench")
    module.main(list(args))
