"""The benchmarks' shared harness reads figures right: the writes the audit log attributes to
one client, CPU seconds and peak memory from /proc, what a Prometheus histogram recorded
between two scrapes, the percentiles and the tables the benchmarks print."""

from __future__ import annotations

import json

import pytest

from bench.harness import metrics
from bench.harness.audit import audit_writes
from bench.harness.meter import cpu_seconds_of, peak_rss_of, rss_mib, thread_group
from bench.harness.tables import render
from bench.harness.timing import percentile, timed


def _event(
    user: str, verb: str, resource: str, sub: str | None = None, stage: str = "ResponseComplete"
) -> str:
    ref = {"resource": resource, "namespace": "ns", "name": "x"}
    if sub:
        ref["subresource"] = sub
    return json.dumps({"stage": stage, "verb": verb, "user": {"username": user}, "objectRef": ref})


def test_audit_writes_counts_one_users_writes_once_each_by_resource() -> None:
    lines = [
        _event("bench-muster", "create", "workloads"),
        _event("bench-muster", "patch", "workloads", "status"),
        _event("bench-muster", "patch", "workloads", "status"),
        _event("bench-muster", "patch", "workloads", "status", stage="ResponseStarted"),
        _event("bench-muster", "get", "workloads"),  # a read
        _event("system:kube-scheduler", "create", "pods", "binding"),  # someone else
        '{"stage": "ResponseComple',  # a line cut at the end of the file
    ]
    counts = audit_writes(lines, "bench-muster")
    assert counts == {"create workloads": 1, "patch workloads/status": 2}


def test_proc_figures() -> None:
    # pid (comm with ") " in it) state ppid ... utime=150 stime=50 cutime=30 cstime=20 ...
    stat = "42 (we) ird) S 1 42 42 0 -1 4194560 100 0 0 0 150 50 30 20 20 0 4 0 100 1000 200"
    assert cpu_seconds_of(stat, 100) == pytest.approx(2.5)
    assert cpu_seconds_of(stat, 100, children=False) == pytest.approx(2.0)
    status = "Name:\tpython\nVmPeak:\t  900000 kB\nVmHWM:\t  143360 kB\nVmRSS:\t  100000 kB\n"
    assert peak_rss_of(status) == 143360 * 1024
    with pytest.raises(ValueError):
        peak_rss_of("Name:\tpython\n")
    current, peak = rss_mib()  # this process, read for real
    assert 0 < current <= peak
    assert thread_group("worker-3") == "worker" and thread_group("bind_2-1") == "bind"


def _scrape(buckets: dict[str, int], total: float, calls: int, moved: int) -> str:
    name = "apiserver_admission_webhook_admission_duration_seconds"
    labels = 'name="vjob.muster.dev",operation="CREATE"'
    lines = [f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{{labels},le="{le}"}} {n}' for le, n in buckets.items()]
    lines += [f"{name}_sum{{{labels}}} {total}", f"{name}_count{{{labels}}} {calls}"]
    lines += ["# TYPE apiserver_requests_total counter", f"apiserver_requests_total {moved}"]
    return "\n".join(lines) + "\n"


def test_histograms_between_two_scrapes() -> None:
    name = "apiserver_admission_webhook_admission_duration_seconds"
    before = metrics.parse(_scrape({"0.01": 5, "0.1": 5, "+Inf": 5}, 0.02, 5, 7))
    # 100 more calls: 50 under 10 ms, 49 more under 100 ms, one slower.
    after = metrics.parse(_scrape({"0.01": 55, "0.1": 104, "+Inf": 105}, 2.02, 105, 9))
    [(labels, h)] = metrics.histograms(before, after, name).items()
    assert dict(labels) == {"name": "vjob.muster.dev", "operation": "CREATE"}
    assert h.count == 100 and h.mean_ms() == pytest.approx(20.0)
    assert h.bound_ms(0.5) == pytest.approx(10.0)  # the 50th call was within 10 ms
    assert h.bound_ms(0.99) == pytest.approx(100.0)
    assert h.quantile_ms(0.5) == pytest.approx(10.0)
    assert h.quantile_ms(0.75) == pytest.approx(10 + 90 * 25 / 49, abs=0.01)
    assert h.add(h).count == 200
    # Only what moved, buckets left out.
    assert metrics.counter_deltas(before, after) == {
        "apiserver_requests_total": 2.0,
        f'{name}_count{{name="vjob.muster.dev",operation="CREATE"}}': 100.0,
        f'{name}_sum{{name="vjob.muster.dev",operation="CREATE"}}': 2.0,
    }
    kept = metrics.parse(_scrape({"+Inf": 1}, 0.1, 1, 1), metrics.starting("apiserver_requests"))
    assert list(kept) == [("apiserver_requests_total", ())]


def test_percentiles_and_timings() -> None:
    ordered = [float(i) for i in range(1, 1001)]
    assert percentile(ordered, 50) == 501.0  # the upper median
    assert percentile(ordered, 99) == 991.0  # rank 990, exactly (0.99 is not a float)
    assert percentile(ordered, 100) == 1000.0
    times, result = timed(lambda: sum(range(1000)), 3)
    assert len(times) == 3 and all(t >= 0 for t in times) and result == 499500
    assert len(timed(lambda: None, 0)[0]) == 1  # at least one run


def test_tables_render_markdown_with_every_figure() -> None:
    out = render(["system", "Jobs", "all admitted s", "share"], [["Muster", 1000, 12.345, None]])
    lines = out.splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == [
        "system",
        "Jobs",
        "all admitted s",
        "share",
    ]
    assert set(lines[1]) <= {"|", "-", ":", " "}
    assert [c.strip() for c in lines[2].strip("|").split("|")] == ["Muster", "1000", "12.35", "-"]


def test_py_spy_samples_are_split_by_process_thread_and_activity() -> None:
    from bench.harness.spy import parse

    controller = 'process 10:"python muster controller --kubeconfig k"'
    webhook = 'process 11:"python -m controllers.webhooks.process --listen-fd 9"'
    text = "\n".join(
        [
            f"{controller};thread (12): informer-workloads-3;run (controllers/runtime/"
            "informer.py:90);loads (json/__init__.py:346);JSONDecoder.decode "
            "(json/decoder.py:337) 6",
            f"{controller};thread (13): admission;cycle (quota/admission/cycle.py:10) 3",
            f"{webhook};thread (14): MainThread;handle (controllers/webhooks/server.py:5) 1",
            f"{controller};thread (15): worker-job-1;WorkQueue.get (controllers/runtime/"
            "workqueue.py:119);Condition.wait (threading.py:331) 40",
            "a line py-spy never writes",
        ]
    )
    breakdown = parse(text)
    assert breakdown.samples == 10  # a thread waiting in Condition.wait is not running
    assert breakdown.idle == 40
    assert breakdown.processes == {"controller": 9, "webhook server": 1}
    assert breakdown.threads["controller: informer-workloads"] == 6
    # The innermost matching frame decides, so the activities add up to the samples.
    assert breakdown.activities == {
        "decoding JSON": 6,
        "the admission cycle's decisions (quota/)": 3,
        "the webhook server's requests": 1,
    }
    seconds = breakdown.seconds(20.0)
    assert seconds["by_process"] == {"controller": 18.0, "webhook server": 2.0}
    assert next(iter(seconds["by_thread"])) == "controller: informer-workloads"
    assert parse("").seconds(5.0)["by_thread"] == {}


def test_usage_by_role_reads_this_process() -> None:
    import os

    from bench.harness.spy import usage_by_role, usage_since

    roles = usage_by_role(os.getpid())
    assert len(roles) >= 1
    cpu, peak = next(iter(roles.values()))
    assert cpu >= 0 and peak > 0
    since = usage_since(os.getpid(), roles)
    assert all(v["cpu_seconds"] >= 0 for v in since.values())
