"""Benchmark of the history store; same as `muster bench-history` (see its --help).

Run with `python bench/history_bench.py [--records 50000] [--cycles 15] [--no-postgres]`.
Prints figures; never fails on time.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controllers.cli.bench_history import bench_history

if __name__ == "__main__":
    bench_history()
