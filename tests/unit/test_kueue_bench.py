"""The Kueue side-by-side benchmark's own arithmetic: the trace it replays (Kueue's baseline
shape), the figures it reports for a trace (Kueue's definitions), and the status patches its
trace runner writes. (What it reads from the audit log and /proc: test_bench_harness.py.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest


def _load() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "kueue_bench.py"
    spec = importlib.util.spec_from_file_location("bench_kueue", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_kueue"] = module
    spec.loader.exec_module(module)
    return module


kb = _load()


def test_baseline_trace_is_kueues_shape_scaled() -> None:
    full = kb.baseline_trace(1.0)
    assert len(full) == 15_000
    assert len({i.queue for i in full}) == 30
    per_class = {c: sum(1 for i in full if i.cls.name == c) for c in ("small", "medium", "large")}
    assert per_class == {"small": 10_500, "medium": 3_000, "large": 1_500}
    # One queue's large Workloads arrive every 1.2 s, the first after one interval.
    large = [i.at for i in full if i.queue == "cq-0-0" and i.cls.name == "large"]
    assert large[:3] == [1.2, 2.4, 3.6] and large[-1] == pytest.approx(60.0)
    assert [i.at for i in full] == sorted(i.at for i in full)
    tenth = kb.baseline_trace(0.1)
    assert len(tenth) == 1_500 and len({(i.queue, i.name) for i in tenth}) == 1_500
    assert len(kb.baseline_trace(0.001)) == 90  # at least one of each class per queue


def test_trace_summary_uses_kueues_definitions() -> None:
    record = kb.WorkloadRecord
    records = [
        # Queue a (nominal 20): 10 cpu held for 10 s; queue b: 20 cpu held for 5 s.
        record("a", "small", 10, created=0.0, admitted=1.0, finished=11.0, cpu_seconds=100.0),
        record("b", "large", 20, created=2.0, admitted=5.0, finished=10.0, cpu_seconds=100.0),
        record("b", "large", 20, created=3.0, admitted=4.0, finished=9.0, cpu_seconds=100.0),
    ]
    summary = kb.trace_summary(records, {"a": 20, "b": 20})
    assert summary["wall_seconds"] == 11.0  # first creation to last finish
    # 300 cpu-seconds over (40 cpu x 11 s)
    assert summary["cq_usage_percent"] == pytest.approx(68.2)
    assert summary["min_cq_usage_percent"] == pytest.approx(45.5)  # a: 100 / (20 x 11)
    assert summary["avg_time_to_admission_ms"] == {"large": 2000, "small": 1000}
    assert kb.trace_summary([record("a", "small", 1, created=0.0)], {"a": 20})["finished"] == 0


def test_merge_patch_turns_old_into_new() -> None:
    old = {"status": {"admission": {"clusterQueue": "a"}, "conditions": [1], "keep": 1}}
    new = {"status": {"conditions": [1, 2], "keep": 1, "requeueState": {"count": 1}}}
    assert kb.merge_patch(old, new) == {
        "status": {"admission": None, "conditions": [1, 2], "requeueState": {"count": 1}}
    }
    assert kb.merge_patch(new, new) == {}
