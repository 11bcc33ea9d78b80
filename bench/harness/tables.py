"""Figures as a table: rendered by rich as Markdown, so that a table printed by a benchmark
pastes into docs/benchmarks.md as it is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table


def cell(value: Any) -> str:
    """A figure as a table shows it: "-" for none, floats with thousands separators."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def render(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table of `rows` under `header`, as plain text."""
    table = Table(*header, box=box.MARKDOWN, show_edge=True, pad_edge=True)
    for row in rows:
        table.add_row(*(cell(v) for v in row))
    # Wide enough for any row: a table is never wrapped or cut to the terminal's width.
    console = Console(width=100_000, color_system=None, highlight=False)
    with console.capture() as captured:
        console.print(table, crop=False, overflow="ignore")
    return "\n".join(line.rstrip() for line in captured.get().splitlines()).strip("\n")
