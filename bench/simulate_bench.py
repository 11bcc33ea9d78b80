"""Benchmark of `muster simulate` on the shape of Kueue's baseline performance test.

examples/kueue-baseline.yaml: 30 ClusterQueues in 5 parents, 15,000 workloads in small /
medium / large classes. `--scale 10` multiplies every class's count by 10 (150,000
workloads, the same arrival rates for ten times as long). Prints figures; never fails on time.

    python bench/simulate_bench.py [--scale 1 10] [--history]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from controllers.runtime.gcpause import paused_collection
from quota.simulation.scenario import parse_scenario
from quota.simulation.simulator import simulate

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "kueue-baseline.yaml"


def scaled(docs: list[Any], factor: int) -> list[Any]:
    """The baseline with every generator class `factor` times as long."""
    out = []
    for doc in docs:
        if doc.get("kind") == "WorkloadGenerator":
            doc = {**doc, "spec": {**doc["spec"]}}
            doc["spec"]["classes"] = [
                {**cls, "count": cls["count"] * factor} for cls in doc["spec"]["classes"]
            ]
        out.append(doc)
    return out


def run(factor: int, history: bool) -> None:
    docs = scaled(list(yaml.safe_load_all(EXAMPLE.read_text())), factor)
    gc.collect()
    started = time.perf_counter()
    scenario = parse_scenario(docs, name=f"kueue-baseline-x{factor}")
    parsed = time.perf_counter()
    with paused_collection():  # as `muster simulate` runs it
        result = simulate(scenario, 0, record=history)
    simulated = time.perf_counter()
    workloads = scenario.workload_count()
    line = (
        f"x{factor:<3} {workloads:>8,} workloads  parse {parsed - started:6.2f}s  "
        f"simulate {simulated - parsed:7.2f}s  ({workloads / (simulated - parsed):7,.0f} "
        f"workloads/s)  {result.cycles:>7,} cycles  {result.evictions:>7,} evictions  "
        f"makespan {result.makespan:8.1f}s simulated"
    )
    if history:
        from controllers.simreport.history import write_history

        with tempfile.TemporaryDirectory() as tmp:
            records = write_history(result, Path(tmp) / "history.db")
        line += f"  history {records:,} records in {time.perf_counter() - simulated:.2f}s"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, nargs="+", default=[1, 10])
    parser.add_argument(
        "--history", action="store_true", help="also record transitions to SQLite, timed apart"
    )
    args = parser.parse_args()
    print(f"{EXAMPLE.name}, Python {sys.version.split()[0]}, one process")
    for factor in args.scale:
        run(factor, args.history)


if __name__ == "__main__":
    main()
