"""The requests `Kube` sends, by path through the client's ApiClient: method, path, query,
content type and body, checked against a local HTTP server that records them (the e2e suites
send the same requests to a real apiserver)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controllers.runtime.client import FencedKube, NotLeaderError
from controllers.runtime.resources import JOB, NODE, POD, WORKLOAD, Kube


class Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]]
    answers: dict[tuple[str, str], tuple[int, Any]]

    def _answer(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.seen.append(
            {
                "method": self.command,
                "path": url.path,
                "query": dict(parse_qsl(url.query)),
                "content_type": self.headers.get("Content-Type"),
                "body": body,
            }
        )
        status, answer = self.answers.get((self.command, url.path), (200, {"kind": "Ok"}))
        data = (answer if isinstance(answer, str) else json.dumps(answer)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[Kube, list[dict[str, Any]], dict[tuple[str, str], Any]]]:
    seen: list[dict[str, Any]] = []
    answers: dict[tuple[str, str], Any] = {}
    handler = type("H", (Recorder,), {"seen": seen, "answers": answers})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{httpd.server_address[1]}"
    api = client.ApiClient(configuration)
    try:
        yield Kube(api), seen, answers
    finally:
        httpd.shutdown()
        api.close()


def test_reads_name_the_kinds_paths_and_their_queries(server: Any) -> None:
    kube, seen, answers = server
    answers[("GET", "/apis/batch/v1/namespaces/team-a/jobs/gone")] = (404, {"kind": "Status"})
    assert kube.get(JOB, "team-a", "gone") is None
    kube.get(NODE, None, "gpu-1")
    kube.list_page(POD, None, label_selector="a=b", field_selector="spec.nodeName!=")
    kube.list_page(WORKLOAD, "team-a", continue_token="tok", limit=5)
    assert [(s["method"], s["path"], s["query"]) for s in seen] == [
        ("GET", "/apis/batch/v1/namespaces/team-a/jobs/gone", {}),
        ("GET", "/api/v1/nodes/gpu-1", {}),
        (
            "GET",
            "/api/v1/pods",
            {"limit": "500", "labelSelector": "a=b", "fieldSelector": "spec.nodeName!="},
        ),
        (
            "GET",
            "/apis/muster.dev/v1alpha1/namespaces/team-a/workloads",
            {"limit": "5", "continue": "tok"},
        ),
    ]


def test_a_watch_streams_decoded_events_from_a_resource_version(server: Any) -> None:
    kube, seen, answers = server
    lines = [{"type": "ADDED", "object": {"metadata": {"name": "a"}}}, {"type": "BOOKMARK"}]
    # One event a line, each ended by a newline, as the apiserver streams them.
    answers[("GET", "/apis/batch/v1/jobs")] = (200, "".join(json.dumps(e) + "\n" for e in lines))
    response, events = kube.watch(JOB, "42", label_selector="q")
    assert list(events) == lines
    response.release_conn()
    assert seen[0]["query"] == {
        "watch": "true",
        "resourceVersion": "42",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "300",
        "labelSelector": "q",
    }


def test_writes_carry_their_content_types_bodies_and_preconditions(server: Any) -> None:
    kube, seen, _ = server
    kube.create(JOB, "ns", {"kind": "Job"}, dry_run=True)
    kube.patch(WORKLOAD, "ns", "w", {"status": {"x": 1}}, status=True)
    kube.patch_ops(JOB, "ns", "j", [{"op": "test", "path": "/spec/suspend", "value": True}])
    kube.create_subresource(POD, "ns", "p", "binding", {"target": {"name": "n"}})
    assert kube.delete(JOB, "ns", "j", uid="u1") is True
    got = [(s["method"], s["path"], s["query"], s["content_type"], s["body"]) for s in seen]
    assert got == [
        ("POST", "/apis/batch/v1/namespaces/ns/jobs", {"dryRun": "All"}, "application/json",
         {"kind": "Job"}),
        ("PATCH", "/apis/muster.dev/v1alpha1/namespaces/ns/workloads/w/status", {},
         "application/merge-patch+json", {"status": {"x": 1}}),
        ("PATCH", "/apis/batch/v1/namespaces/ns/jobs/j", {}, "application/json-patch+json",
         [{"op": "test", "path": "/spec/suspend", "value": True}]),
        ("POST", "/api/v1/namespaces/ns/pods/p/binding", {}, "application/json",
         {"target": {"name": "n"}}),
        ("DELETE", "/apis/batch/v1/namespaces/ns/jobs/j", {}, "application/json",
         {"propagationPolicy": "Background", "preconditions": {"uid": "u1"}}),
    ]  # fmt: skip


def test_errors_are_the_clients_api_exceptions(server: Any) -> None:
    kube, _, answers = server
    answers[("PATCH", "/apis/batch/v1/namespaces/ns/jobs/j")] = (409, {"reason": "Conflict"})
    with pytest.raises(ApiException) as raised:
        kube.patch(JOB, "ns", "j", {})
    assert raised.value.status == 409 and "Conflict" in str(raised.value.body)
    answers[("DELETE", "/apis/batch/v1/namespaces/ns/jobs/j")] = (404, {})
    assert kube.delete(JOB, "ns", "j") is False
    answers[("GET", "/apis/muster.dev/v1alpha1")] = (404, {})
    assert kube.serves(WORKLOAD) is False
    answers[("GET", "/apis/batch/v1")] = (200, {"resources": [{"kind": "Job"}]})
    assert kube.serves(JOB) is True


def test_a_replica_out_of_lead_sends_no_write_and_still_reads(server: Any) -> None:
    kube, seen, _ = server
    left = [0.5]
    fenced = FencedKube(kube.api_client, lambda: left[0])
    fenced.get(JOB, "ns", "j")
    with pytest.raises(NotLeaderError, match="PATCH /apis/batch/v1/namespaces/ns/jobs/j"):
        fenced.patch(JOB, "ns", "j", {})
    assert fenced.refused == 1
    assert [s["method"] for s in seen] == ["GET"], "the refused write never left"
    left[0] = 20.0
    fenced.patch(JOB, "ns", "j", {})
    assert [s["method"] for s in seen] == ["GET", "PATCH"]
