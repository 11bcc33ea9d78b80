"""The physical limit: the writes Muster makes to admit one Job, made by the thinnest client
there is, as fast as the apiserver takes them.

For every suspended Job in the given namespaces: create its Workload (owned by the Job, as
Muster's Job integration writes it), patch the Workload's status to admitted (the admission
write of Muster's cycle), and patch the Job to run (`spec.suspend: false`). Three writes per
Job, no reads, no decisions, no Events; `--concurrency` keep-alive HTTPS connections, one
per thread, each working through its share of the Jobs. What this loop reaches is what the
apiserver allows on this machine; bench/kueue_bench.py runs it as a process of its own (so
its CPU is counted apart) and puts Muster's throughput next to it.

    python bench/raw_client_loop.py --kubeconfig PATH --namespace NS [--namespace NS2 ...]
        [--concurrency 16] [--queue q] [--cluster-queue CQ] [--flavor F] [--follow N]

With `--follow N` it does not list the Jobs once but watches the namespaces and works on
each suspended Job as it is created, until N were done: the floor of a path whose Jobs
arrive while it runs (bench/scheduler_bench.py's `kai-floor`).

Prints one JSON object: Jobs, writes, seconds, Jobs per second, writes refused.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import queue as queues
import ssl
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from controllers.state import workloads as wls

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


class Connection:
    """One keep-alive HTTPS connection to the apiserver with the kubeconfig's client cert."""

    def __init__(self, kubeconfig: str) -> None:
        config = yaml.safe_load(Path(kubeconfig).read_text())
        context_name = config.get("current-context") or config["contexts"][0]["name"]
        context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        url = urlparse(cluster["server"])
        tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
        tls.load_cert_chain(user["client-certificate"], user["client-key"])
        self.connection = http.client.HTTPSConnection(
            url.hostname or "127.0.0.1", url.port or 443, context=tls, timeout=60
        )

    def watch(self, path: str) -> Iterator[dict[str, Any]]:
        """The events of a watch on `path` (a collection), as they come."""
        self.connection.request("GET", f"{path}?watch=1", headers={"Accept": "application/json"})
        response = self.connection.getresponse()
        if response.status != 200:
            raise SystemExit(f"watching {path}: {response.status} {response.read()[:300]!r}")
        buffered = b""
        while chunk := response.read1(65536):
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                if line.strip():
                    yield json.loads(line)

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, dict[str, Any]]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        self.connection.request(method, path, body=data, headers=headers)
        response = self.connection.getresponse()
        payload = response.read()
        return response.status, json.loads(payload) if payload else {}


def workload_for(job: dict[str, Any], queue: str) -> dict[str, Any]:
    """The Workload Muster's Job integration writes for a one-pod-set Job."""
    spec = job["spec"]
    containers = spec["template"]["spec"]["containers"]
    requests: dict[str, str] = {}
    for container in containers:
        requests.update((container.get("resources") or {}).get("requests") or {})
    body = {
        "queueName": queue,
        "podSets": [
            {"name": "main", "count": int(spec.get("parallelism") or 1), "requests": requests}
        ],
    }
    name = f"job-{job['metadata']['name']}"
    wl = wls.new_workload(name, job["metadata"]["namespace"], job, body)
    # No controller runs to take Muster's finalizer off again when the namespace goes; the
    # create is the same write without it.
    wl["metadata"].pop("finalizers", None)
    return wl


def admitted_status(wl: dict[str, Any], cluster_queue: str, flavor: str) -> dict[str, Any]:
    """The status Muster's admission write gives it (QuotaReserved and Admitted, assignment)."""
    pod_set = wl["spec"]["podSets"][0]
    admission = wls.admission_status(
        cluster_queue,
        [
            (
                pod_set["name"],
                pod_set["count"],
                dict.fromkeys(pod_set["requests"], flavor),
                dict(pod_set["requests"]),
            )
        ],
    )
    wls.mark_admitted(wl, admission, "admitted by the raw client loop", dt.datetime.now(dt.UTC))
    return {"status": wl["status"]}


def run(
    kubeconfig: str,
    jobs: Iterable[dict[str, Any]],
    concurrency: int,
    queue: str,
    cluster_queue: str,
    flavor: str,
) -> dict[str, Any]:
    refused: list[str] = []
    writes = [0] * concurrency
    lock = threading.Lock()

    work: queues.Queue[dict[str, Any] | None] = queues.Queue()
    count = 0

    def feed() -> None:
        nonlocal count
        for job in jobs:
            count += 1
            work.put(job)
        for _ in range(concurrency):
            work.put(None)

    def worker(index: int) -> None:
        conn = Connection(kubeconfig)
        while (job := work.get()) is not None:
            ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
            wl = workload_for(job, queue)
            base = f"/apis/muster.dev/v1alpha1/namespaces/{ns}/workloads"
            steps = [
                ("POST", base, wl, "application/json"),
                (
                    "PATCH",
                    f"{base}/{wl['metadata']['name']}/status",
                    admitted_status(wl, cluster_queue, flavor),
                    MERGE,
                ),
                (
                    "PATCH",
                    f"/apis/batch/v1/namespaces/{ns}/jobs/{name}",
                    {"spec": {"suspend": False}},
                    STRATEGIC,
                ),
            ]
            for method, path, body, content_type in steps:
                status, answer = conn.request(method, path, body, content_type)
                writes[index] += 1
                if status >= 300:
                    with lock:
                        refused.append(f"{method} {path}: {status} {answer.get('message', '')}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    started = time.monotonic()
    for t in threads:
        t.start()
    feed()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    return {
        "jobs": count,
        "writes": sum(writes),
        "seconds": round(elapsed, 3),
        "jobs_per_second": round(count / elapsed, 1) if elapsed else None,
        "concurrency": concurrency,
        "refused": len(refused),
        "refused_first": refused[:3],
    }


def list_jobs(kubeconfig: str, namespaces: list[str]) -> list[dict[str, Any]]:
    conn = Connection(kubeconfig)
    jobs: list[dict[str, Any]] = []
    for ns in namespaces:
        status, body = conn.request("GET", f"/apis/batch/v1/namespaces/{ns}/jobs")
        if status != 200:
            raise SystemExit(f"listing Jobs in {ns}: {status} {body.get('message', '')}")
        for job in body.get("items") or []:
            job.setdefault("apiVersion", "batch/v1")
            job.setdefault("kind", "Job")
            jobs.append(job)
    return sorted(jobs, key=lambda j: (j["metadata"]["namespace"], j["metadata"]["name"]))


def follow_jobs(kubeconfig: str, namespaces: list[str], count: int) -> Iterator[dict[str, Any]]:
    """Each suspended Job of the namespaces, once, as it is created, until `count` of them."""
    found: queues.Queue[dict[str, Any]] = queues.Queue()

    def watch(ns: str) -> None:
        for event in Connection(kubeconfig).watch(f"/apis/batch/v1/namespaces/{ns}/jobs"):
            job = event.get("object") or {}
            if event.get("type") == "ADDED" and (job.get("spec") or {}).get("suspend"):
                found.put(job)

    for ns in namespaces:
        threading.Thread(target=watch, args=(ns,), daemon=True).start()
    for _ in range(count):
        yield found.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", action="append", required=True)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--queue", default="q")
    parser.add_argument("--cluster-queue", default="raw")
    parser.add_argument("--flavor", default="raw")
    parser.add_argument(
        "--follow", type=int, default=0, help="watch for this many Jobs instead of listing once"
    )
    args = parser.parse_args()
    jobs: Iterable[dict[str, Any]] = (
        follow_jobs(args.kubeconfig, args.namespace, args.follow)
        if args.follow
        else list_jobs(args.kubeconfig, args.namespace)
    )
    result = run(
        args.kubeconfig, jobs, args.concurrency, args.queue, args.cluster_queue, args.flavor
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
