"""Amounts in the units a person reads: GPUs as devices, cpu in cores, memory in GiB."""

from __future__ import annotations

from quota.simulation.report import FlavorStats, is_accelerator


def unit_of(resource: str) -> tuple[float, str]:
    """How a resource is shown: (divisor from base units, unit name)."""
    if resource == "cpu":
        return 1000.0, "cores"
    if resource in ("memory", "ephemeral-storage", "storage") or resource.startswith("hugepages"):
        return float(2**30), "GiB"
    return 1.0, "devices" if is_accelerator(resource) else "units"


def in_unit(resource: str, value: float) -> str:
    divisor, unit = unit_of(resource)
    shown = value / divisor
    text = f"{shown:,.0f}" if shown == int(shown) else f"{shown:,.1f}"
    return text if unit in ("devices", "units") else f"{text} {unit}"


# ------------------------------------------------------------------------- html


def short(resource: str) -> str:
    return resource.rsplit("/", 1)[-1]


def percent(f: FlavorStats) -> str:
    return "-" if f.utilisation is None else f"{100 * f.utilisation:.0f}%"
