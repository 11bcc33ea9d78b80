"""Admission webhooks, served by the controller over TLS, and the configurations that
register them with the apiserver.

Where the apiserver serves MutatingAdmissionPolicy (Kubernetes 1.36+), the Job, JobSet,
TrainJob and pod rules below are registered as admission policies instead (`policies.py`,
the same decisions in CEL, evaluated inside the apiserver) and only the queue objects'
webhook is called; the handlers here then serve clusters without policies.

- Mutating, Jobs with the queue-name label, on CREATE: set `spec.suspend: true` (users need
  not), hand the pods to Muster's scheduler (`spec.template.spec.schedulerName`, unless
  the user chose a scheduler of their own or Muster's scheduler is off), and for elastic
  Jobs add the `muster.dev/admission` scheduling gate and the elastic pod label to the pod
  template. It also validates the new Job (a mutating webhook may refuse), so creating a
  Job costs one webhook call, not two.
- Validating, Jobs with the queue-name label, on UPDATE (and, through the mutating webhook,
  CREATE): elastic together with partial admission is refused; a malformed
  min-parallelism is refused; the queue name cannot change while the Job runs; the
  elastic annotation cannot be added or removed; a running non-elastic Job cannot grow
  (Muster never runs more pods than it admitted: resizing is what elastic Jobs do). A
  LocalQueue that does not exist is accepted (the Workload's condition says so, and the
  queue may be created later).
- Validating, Muster's queue objects: the full API model check, which covers rules CEL
  cannot express (exact quantities, unique names), plus warnings for cross-object problems
  (missing parent, cycle, LocalQueue at a parent queue) that the Active condition reports.

Failure policy (see docs/controller.md): the Job webhooks select only Jobs carrying
`muster.dev/queue-name` (objectSelector), so an unavailable controller never touches any
other workload in the cluster; for those Jobs the policy is Fail with a 5 s timeout,
because a labelled Job that slipped through unsuspended would run outside its quota. The
queue-object webhook uses Ignore: an administrator must be able to repair queues while
the controller is down, and the Active condition reports every cross-object problem anyway.

Why one module of this size: every handler shares the request parsing, the JSON patch
building and the answer envelope with the server that dispatches to it; it stays one module
until a second workload kind brings handlers of its own.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import re
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from controllers.jobs.batchjob import (
    is_elastic,
    min_parallelism,
    queue_name,
)
from controllers.metrics import definitions as metrics
from controllers.runtime import apply
from controllers.runtime.resources import MUTATING_WEBHOOK, VALIDATING_WEBHOOK, Kube, Obj
from controllers.webhooks import policies as admission_policies
from controllers.webhooks.certs import CertBundle, KeyPair
from quota.api import ManifestError, parse_manifest
from quota.api.names import (
    ADMISSION_GATE,
    ELASTIC_ANNOTATION,
    ELASTIC_POD_LABEL,
    MIN_PARALLELISM_ANNOTATION,
    OWNER_UID_POD_LABEL,
    QUEUE_LABEL,
    SCHEDULER_NAME,
)

log = logging.getLogger(__name__)

CONFIGURATION_NAME = "muster-webhooks"
MUTATE_JOB_PATH = "/mutate-batch-v1-job"
VALIDATE_JOB_PATH = "/validate-batch-v1-job"
VALIDATE_QUEUES_PATH = "/validate-muster-dev-v1alpha1"
MUTATE_SUSPEND_PATH = "/mutate-suspend"
MUTATE_POD_PATH = "/mutate-v1-pod"
TIMEOUT_SECONDS = 5


# ------------------------------------------------------------------ decisions


def mutate_suspend(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSON patch for a labelled JobSet or TrainJob being created: created suspended, so that
    nothing runs before Muster admits it (its pods get Muster's scheduler at admission,
    through the owner label and `mutate_pod`)."""
    if not queue_name(obj) or not isinstance(obj.get("spec"), Mapping):
        return []
    if obj["spec"].get("suspend"):
        return []
    return [{"op": "add", "path": "/spec/suspend", "value": True}]


def mutate_pod(
    pod: Mapping[str, Any], scheduler_name: str = SCHEDULER_NAME
) -> list[dict[str, Any]]:
    """JSON patch for a pod of an admitted JobSet or TrainJob (it carries the owner label
    Muster put on its template at admission): Muster's scheduler places it, unless the user
    chose another scheduler by name or Muster's scheduler is off."""
    spec = pod.get("spec")
    if not scheduler_name or not isinstance(spec, Mapping):
        return []
    if (spec.get("schedulerName") or DEFAULT_SCHEDULER) != DEFAULT_SCHEDULER:
        return []
    return [{"op": "add", "path": "/spec/schedulerName", "value": scheduler_name}]


def _escape(segment: str) -> str:
    """JSON-pointer escaping of one path segment."""
    return segment.replace("~", "~0").replace("/", "~1")


# What an unset spec.schedulerName means: the pod is kube-scheduler's.
DEFAULT_SCHEDULER = "default-scheduler"


def mutate_job(
    job: Mapping[str, Any], scheduler_name: str = SCHEDULER_NAME
) -> list[dict[str, Any]]:
    """JSON patch operations for a labelled Job being created.

    `scheduler_name` is the scheduler that places the Job's pods ("" leaves them to
    kube-scheduler). A schedulerName the user set to another scheduler is kept: they asked
    for it by name, and Muster still admits the Job under quota either way.
    """
    if not queue_name(job):
        return []
    ops: list[dict[str, Any]] = []
    if not (job.get("spec") or {}).get("suspend"):
        ops.append({"op": "add", "path": "/spec/suspend", "value": True})
    pod_spec = ((job.get("spec") or {}).get("template") or {}).get("spec")
    current = (pod_spec or {}).get("schedulerName") or DEFAULT_SCHEDULER
    if scheduler_name and isinstance(pod_spec, Mapping) and current == DEFAULT_SCHEDULER:
        # A pod's schedulerName is immutable: this is the one chance to set it.
        ops.append(
            {"op": "add", "path": "/spec/template/spec/schedulerName", "value": scheduler_name}
        )
    if is_elastic(job):
        template = (job.get("spec") or {}).get("template") or {}
        meta = template.get("metadata")
        if meta is None:
            ops.append({"op": "add", "path": "/spec/template/metadata", "value": {}})
            meta = {}
        labels = meta.get("labels")
        if labels is None:
            ops.append(
                {
                    "op": "add",
                    "path": "/spec/template/metadata/labels",
                    "value": {ELASTIC_POD_LABEL: "true"},
                }
            )
        elif labels.get(ELASTIC_POD_LABEL) != "true":
            ops.append(
                {
                    "op": "add",
                    "path": f"/spec/template/metadata/labels/{_escape(ELASTIC_POD_LABEL)}",
                    "value": "true",
                }
            )
        gates = (template.get("spec") or {}).get("schedulingGates")
        if gates is None:
            ops.append(
                {
                    "op": "add",
                    "path": "/spec/template/spec/schedulingGates",
                    "value": [{"name": ADMISSION_GATE}],
                }
            )
        elif not any(g.get("name") == ADMISSION_GATE for g in gates):
            ops.append(
                {
                    "op": "add",
                    "path": "/spec/template/spec/schedulingGates/-",
                    "value": {"name": ADMISSION_GATE},
                }
            )
    return ops


def validate_job(job: Mapping[str, Any], old: Mapping[str, Any] | None) -> str | None:
    """Why a labelled Job is refused, or None."""
    if not queue_name(job) and not (old and queue_name(old)):
        return None
    name = (job.get("metadata") or {}).get("name") or "(generated)"
    minimum = min_parallelism(job)
    if is_elastic(job) and minimum is not None:
        return (
            f"Job {name}: annotations {ELASTIC_ANNOTATION} and {MIN_PARALLELISM_ANNOTATION} "
            "cannot be combined: an elastic Job changes size by scaling its parallelism, "
            "while partial admission fixes the size when the Job is admitted; remove one of "
            "the two annotations"
        )
    if minimum is not None:
        parallelism = (job.get("spec") or {}).get("parallelism")
        parallelism = 1 if parallelism is None else int(parallelism)
        # At most 9 ASCII digits, as the admission policy's CEL rule reads them.
        if not re.fullmatch("[0-9]{1,9}", minimum) or not 1 <= int(minimum) <= parallelism:
            return (
                f"Job {name}: annotation {MIN_PARALLELISM_ANNOTATION} must be a whole number "
                f'between 1 and spec.parallelism ({parallelism}), got "{minimum}"'
            )
    if old is not None:
        running = not (old.get("spec") or {}).get("suspend")
        if running and queue_name(old) != queue_name(job):
            return (
                f"Job {name}: label {QUEUE_LABEL} cannot change while the Job runs "
                f'("{queue_name(old) or ""}" -> "{queue_name(job) or ""}"); suspend the Job first'
            )
        if is_elastic(old) != is_elastic(job):
            # Its pods and its Workloads were made for one path or the other (gated pods
            # and slices, or suspension): switching would strand one or the other.
            return (
                f"Job {name}: annotation {ELASTIC_ANNOTATION} cannot be added or removed "
                "once the Job exists; create a new Job to change it"
            )
        grown = _grown_while_running(job, old) if running and not is_elastic(job) else None
        if grown is not None:
            return (
                f"Job {name}: spec.parallelism cannot grow while the Job runs ({grown[0]} -> "
                f"{grown[1]} pods): Muster admitted {grown[0]} and never runs more than it "
                f'admitted. Create the Job with annotation {ELASTIC_ANNOTATION}: "true" to '
                "resize it while it runs, or delete it and create it again at the new size"
            )
    return None


def _pods_at_once(job: Mapping[str, Any]) -> int | None:
    """min(parallelism, completions) as written now; None if either is not a number."""
    spec = job.get("spec") or {}
    parallelism = spec.get("parallelism", 1)
    completions = spec.get("completions")
    if not isinstance(parallelism, int) or isinstance(parallelism, bool):
        return None
    if completions is None:
        return parallelism
    if not isinstance(completions, int) or isinstance(completions, bool):
        return None
    return min(parallelism, completions)


def _grown_while_running(job: Mapping[str, Any], old: Mapping[str, Any]) -> tuple[int, int] | None:
    """(before, after) pods at once if a running Job asks for more than before."""
    before, after = _pods_at_once(old), _pods_at_once(job)
    if before is None or after is None or after <= before:
        return None
    return before, after


def malformed_job(job: object) -> str | None:
    """Which field of a Job has the wrong shape for the rules above, or None. The apiserver
    checks Jobs before any webhook sees them; this keeps a malformed review from becoming a
    server error."""
    if not isinstance(job, Mapping):
        return "a Job must be a mapping"
    shapes: list[tuple[str, object, type]] = [
        ("metadata", job.get("metadata"), dict),
        ("spec", job.get("spec"), dict),
    ]
    meta = job.get("metadata") if isinstance(job.get("metadata"), Mapping) else {}
    spec = job.get("spec") if isinstance(job.get("spec"), Mapping) else {}
    template = spec.get("template") if isinstance(spec.get("template"), Mapping) else {}
    shapes += [
        ("metadata.labels", meta.get("labels"), dict),
        ("metadata.annotations", meta.get("annotations"), dict),
        ("spec.template", spec.get("template"), dict),
        ("spec.template.metadata", template.get("metadata"), dict),
        ("spec.template.spec", template.get("spec"), dict),
    ]
    pod_spec = template.get("spec") if isinstance(template.get("spec"), Mapping) else {}
    shapes.append(("spec.template.spec.schedulingGates", pod_spec.get("schedulingGates"), list))
    for field, value, kind in shapes:
        if value is not None and not isinstance(value, kind):
            return f"{field} must be a {'mapping' if kind is dict else 'list'}"
    for field in ("labels", "annotations"):
        values = meta.get(field) or {}
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
            return f"metadata.{field} must map strings to strings"
    for field in ("parallelism", "completions"):
        value = spec.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return f"spec.{field} must be a whole number (got {value!r})"
    if not all(isinstance(g, Mapping) for g in pod_spec.get("schedulingGates") or []):
        return "spec.template.spec.schedulingGates entries must be mappings"
    return None


def validate_queue_object(
    obj: Mapping[str, Any], warnings_for: Callable[[Mapping[str, Any]], list[str]] | None = None
) -> tuple[str | None, list[str]]:
    """(refusal, warnings) for a Muster queue object."""
    doc = copy.deepcopy(dict(obj))
    # Server-populated metadata is not part of what the user wrote; the model would accept
    # most of it, but managedFields is noise for validation.
    if isinstance(doc.get("metadata"), dict):
        doc["metadata"].pop("managedFields", None)
    try:
        parse_manifest(doc, 0)
    except ManifestError as error:
        return str(error).replace("document 0 (", "(", 1), []
    return None, (warnings_for(obj) if warnings_for else [])


# ----------------------------------------------------------------- the server


def review_response(
    uid: str,
    *,
    allowed: bool,
    message: str | None = None,
    patch: list[dict[str, Any]] | None = None,
    warnings: list[str] | None = None,
) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if message:
        response["status"] = {"code": 403 if not allowed else 200, "message": message}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if warnings:
        response["warnings"] = warnings[:10]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


class WebhookHandlers:
    """Routes AdmissionReview requests to the decisions above.

    `scheduler_name` goes into the pods of every labelled Job created ("" leaves them to
    kube-scheduler); the controller sets it from `--scheduler-name`.
    """

    def __init__(
        self,
        queue_warnings: Callable[[Mapping[str, Any]], list[str]] | None = None,
        *,
        scheduler_name: str = SCHEDULER_NAME,
    ):
        self.queue_warnings = queue_warnings
        self.scheduler_name = scheduler_name

    def handle(self, path: str, review: Mapping[str, Any]) -> dict[str, Any]:
        request = review.get("request") if isinstance(review, Mapping) else None
        if not isinstance(request, Mapping):
            return review_response("", allowed=False, message="not an AdmissionReview request")
        uid = str(request.get("uid", ""))
        obj = request.get("object") or {}
        old = request.get("oldObject")
        if path in (MUTATE_JOB_PATH, VALIDATE_JOB_PATH):
            for which, job in (("object", obj), ("oldObject", old)):
                problem = None if job is None and which == "oldObject" else malformed_job(job)
                if problem is not None:
                    return review_response(uid, allowed=False, message=f"{which}: {problem}")
        if path == MUTATE_JOB_PATH:
            # Creation is validated here too: one webhook call per Job instead of two.
            refusal = validate_job(obj, None)
            if refusal is not None:
                return review_response(uid, allowed=False, message=refusal)
            return review_response(uid, allowed=True, patch=mutate_job(obj, self.scheduler_name))
        if path == VALIDATE_JOB_PATH:
            refusal = validate_job(obj, old)
            return review_response(uid, allowed=refusal is None, message=refusal)
        if path == MUTATE_SUSPEND_PATH:
            if not isinstance(obj, Mapping):
                return review_response(uid, allowed=False, message="object must be a mapping")
            return review_response(uid, allowed=True, patch=mutate_suspend(obj))
        if path == MUTATE_POD_PATH:
            if not isinstance(obj, Mapping):
                return review_response(uid, allowed=False, message="object must be a mapping")
            return review_response(uid, allowed=True, patch=mutate_pod(obj, self.scheduler_name))
        if path == VALIDATE_QUEUES_PATH:
            if not isinstance(obj, Mapping):
                return review_response(uid, allowed=False, message="object must be a mapping")
            refusal, warnings = validate_queue_object(obj, self.queue_warnings)
            return review_response(uid, allowed=refusal is None, message=refusal, warnings=warnings)
        return review_response(uid, allowed=True)


class _TLSServer(ThreadingHTTPServer):
    daemon_threads = True
    handlers: WebhookHandlers
    context: ssl.SSLContext
    # Where each request's (path, status, seconds) goes: the metrics registry, or, in the
    # webhook process, the batch sent to the controller (controllers/webhooks/process.py).
    observe: Callable[[str, int, float], None] = staticmethod(metrics.webhook)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = self.socket.accept()
        # Headers and body go out as separate writes; without this, Nagle's algorithm and
        # the client's delayed ACK add ~40 ms to every admission review.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Wrap with the context in force now (certificates rotate); the handshake happens in
        # the request's own thread so a slow client does not hold up accept().
        return self.context.wrap_socket(
            sock, server_side=True, do_handshake_on_connect=False
        ), address

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(10)
            request.do_handshake()
        except (OSError, ssl.SSLError) as error:
            log.debug("TLS handshake failed", extra={"error": str(error)})
            return
        super().finish_request(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _TLSServer
    protocol_version = "HTTP/1.1"
    # The apiserver keeps connections open between reviews: an idle one is closed after
    # this long (the apiserver opens a new one when it needs it).
    timeout = 120
    _started = 0.0

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("webhook request", extra={"request": format % args})

    def parse_request(self) -> bool:
        # The request line has just arrived (the wait before it is a kept-alive connection
        # being idle, not latency): a review's time starts here.
        self._started = time.monotonic()
        return super().parse_request()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        path = self.path.split("?", 1)[0]
        try:
            review = json.loads(self.rfile.read(length) or b"{}")
            answer = self.server.handlers.handle(path, review)
            status = 200
        except Exception as error:
            log.exception("webhook failed")
            answer = {"error": str(error)}
            status = 500
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.server.observe(path, status, time.monotonic() - self._started)

    def do_GET(self) -> None:
        # Health is served by the metrics port (/healthz, /readyz): a probe pointed here by
        # mistake must fail, not pass before anything is ready (issue 16, item 10).
        body = b"404 not found: the webhook server answers POSTed AdmissionReviews only\n"
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serving_context(serving: KeyPair) -> ssl.SSLContext:
    """A TLS server context for the serving certificate and key."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # load_cert_chain reads files; the key never touches disk longer than this call.
    with tempfile.TemporaryDirectory() as tmp:
        cert = Path(tmp) / "tls.crt"
        key = Path(tmp) / "tls.key"
        cert.write_bytes(serving.cert_pem)
        key.write_bytes(serving.key_pem)
        key.chmod(0o600)
        context.load_cert_chain(cert, key)
    return context


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) and listening (port 0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class WebhookServer:
    """HTTPS server for the webhooks, in background threads of this process; `reload` swaps
    certificates. The controller runs it in a process of its own (`process.py`), on a socket
    the controller bound: `sock`."""

    def __init__(
        self,
        host: str,
        port: int,
        handlers: WebhookHandlers,
        *,
        sock: socket.socket | None = None,
        observe: Callable[[str, int, float], None] | None = None,
    ) -> None:
        self.bind_host = host
        self.port = port
        self.handlers = handlers
        self._sock = sock
        self._observe = observe
        self._server: _TLSServer | None = None
        self._thread: threading.Thread | None = None

    def reload(self, bundle: CertBundle) -> None:
        self.reload_serving(bundle.serving)

    def reload_serving(self, serving: KeyPair) -> None:
        """Serve with this certificate and key from now on (new connections)."""
        context = serving_context(serving)
        if self._server is None:
            sock = self._sock or listening_socket(self.bind_host, self.port)
            server = _TLSServer(sock.getsockname()[:2], _Handler, bind_and_activate=False)
            server.socket.close()
            server.socket = sock
            server.server_address = sock.getsockname()[:2]
            server.handlers = self.handlers
            server.context = context
            if self._observe is not None:
                server.observe = self._observe
            self._server = server
            self.port = server.server_address[1]
        else:
            self._server.context = context
            log.info("webhook certificate reloaded")

    def start(self) -> None:
        assert self._server is not None, "reload() with certificates before start()"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="webhooks", daemon=True
        )
        self._thread.start()
        log.info("webhook server listening", extra={"port": self.port, "host": self.bind_host})

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


# ------------------------------------------------------------ configurations


def _client_config(
    path: str,
    ca_bundle: bytes,
    *,
    url_base: str | None,
    service: tuple[str, str, int] | None,
) -> dict[str, Any]:
    config: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode()}
    if service is not None:
        namespace, name, port = service
        config["service"] = {"namespace": namespace, "name": name, "path": path, "port": port}
    else:
        config["url"] = f"{url_base}{path}"
    return config


def configurations(
    ca_bundle: bytes,
    *,
    url_base: str | None = None,
    service: tuple[str, str, int] | None = None,
    policies: bool = True,
) -> tuple[Obj | None, Obj]:
    """The MutatingWebhookConfiguration and ValidatingWebhookConfiguration to register.

    With `policies` (the apiserver evaluates Muster's admission policies, `policies.py`),
    Jobs, JobSets, TrainJobs and pods are left to those and only the queue objects' webhook
    remains: there is then no MutatingWebhookConfiguration (None)."""
    # The same scope as the admission policies: labelled objects, never kube-system.
    labelled, not_system = admission_policies.LABELLED, admission_policies.NOT_SYSTEM

    def cc(path: str) -> dict[str, Any]:
        return _client_config(path, ca_bundle, url_base=url_base, service=service)

    job_rule = {
        "apiGroups": ["batch"],
        "apiVersions": ["v1"],
        "resources": ["jobs"],
        "scope": "Namespaced",
    }
    # part-of, not managed-by: the Helm chart owns these objects and Helm checks managed-by.
    labels = {"app.kubernetes.io/part-of": "muster"}
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION_NAME, "labels": labels},
        "webhooks": [
            {
                "name": "mjob.muster.dev",
                "clientConfig": cc(MUTATE_JOB_PATH),
                "rules": [{**job_rule, "operations": ["CREATE"]}],
                "objectSelector": labelled,
                "namespaceSelector": not_system,
                "failurePolicy": "Fail",
                "matchPolicy": "Equivalent",
                "sideEffects": "None",
                "timeoutSeconds": TIMEOUT_SECONDS,
                "admissionReviewVersions": ["v1"],
                "reinvocationPolicy": "IfNeeded",
            },
            {
                # JobSets and TrainJobs with the queue label: created suspended.
                "name": "msuspend.muster.dev",
                "clientConfig": cc(MUTATE_SUSPEND_PATH),
                "rules": [
                    {
                        "apiGroups": ["jobset.x-k8s.io"],
                        "apiVersions": ["v1alpha2"],
                        "resources": ["jobsets"],
                        "scope": "Namespaced",
                        "operations": ["CREATE"],
                    },
                    {
                        "apiGroups": ["trainer.kubeflow.org"],
                        "apiVersions": ["v1alpha1"],
                        "resources": ["trainjobs"],
                        "scope": "Namespaced",
                        "operations": ["CREATE"],
                    },
                ],
                "objectSelector": labelled,
                "namespaceSelector": not_system,
                "failurePolicy": "Fail",
                "matchPolicy": "Equivalent",
                "sideEffects": "None",
                "timeoutSeconds": TIMEOUT_SECONDS,
                "admissionReviewVersions": ["v1"],
            },
            {
                # Pods of admitted JobSets and TrainJobs (the owner label Muster put on their
                # templates): to Muster's scheduler. No other pod is ever sent here.
                "name": "mpod.muster.dev",
                "clientConfig": cc(MUTATE_POD_PATH),
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                        "operations": ["CREATE"],
                    }
                ],
                "objectSelector": {
                    "matchExpressions": [{"key": OWNER_UID_POD_LABEL, "operator": "Exists"}]
                },
                "namespaceSelector": not_system,
                "failurePolicy": "Fail",
                "matchPolicy": "Equivalent",
                "sideEffects": "None",
                "timeoutSeconds": TIMEOUT_SECONDS,
                "admissionReviewVersions": ["v1"],
            },
        ],
    }
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION_NAME, "labels": labels},
        "webhooks": [
            {
                "name": "vjob.muster.dev",
                "clientConfig": cc(VALIDATE_JOB_PATH),
                "rules": [{**job_rule, "operations": ["UPDATE"]}],
                "objectSelector": labelled,
                "namespaceSelector": not_system,
                "failurePolicy": "Fail",
                "matchPolicy": "Equivalent",
                "sideEffects": "None",
                "timeoutSeconds": TIMEOUT_SECONDS,
                "admissionReviewVersions": ["v1"],
            },
            {
                "name": "vqueues.muster.dev",
                "clientConfig": cc(VALIDATE_QUEUES_PATH),
                "rules": [
                    {
                        "apiGroups": ["muster.dev"],
                        "apiVersions": ["v1alpha1"],
                        "resources": ["clusterqueues", "localqueues", "resourceflavors"],
                        "operations": ["CREATE", "UPDATE"],
                        "scope": "*",
                    }
                ],
                "objectSelector": {},
                "namespaceSelector": {},
                "failurePolicy": "Ignore",
                "matchPolicy": "Equivalent",
                "sideEffects": "None",
                "timeoutSeconds": TIMEOUT_SECONDS,
                "admissionReviewVersions": ["v1"],
            },
        ],
    }
    if policies:
        validating["webhooks"] = [
            w for w in validating["webhooks"] if w["name"] != "vjob.muster.dev"
        ]
        return None, validating
    return mutating, validating


def register(kube: Kube, mutating: Obj | None, validating: Obj) -> None:
    """Create or update both configurations (with the resourceVersion read, retrying on
    conflict); with no mutating one (policies do its work), remove one left by an earlier
    version."""
    if mutating is None and admission_policies.remove_ours(
        kube, MUTATING_WEBHOOK, CONFIGURATION_NAME
    ):
        log.info("removed the Job webhooks: admission policies do their work")
    for kind, desired in ((MUTATING_WEBHOOK, mutating), (VALIDATING_WEBHOOK, validating)):
        if desired is not None and apply.converge(kube, kind, desired, ("webhooks",)):
            log.info("registered webhook configuration", extra={"kind": kind.name})


def unregister(kube: Kube, url_base: str) -> None:
    """Remove the configurations if they still point at this process (local mode, on a
    graceful shutdown: a stopped developer controller must not leave labelled Jobs
    failing to create)."""
    for kind in (MUTATING_WEBHOOK, VALIDATING_WEBHOOK):
        obj = kube.get(kind, None, CONFIGURATION_NAME)
        if obj is None:
            continue
        urls = {(w.get("clientConfig") or {}).get("url", "") for w in obj.get("webhooks") or []}
        if all(u.startswith(url_base) for u in urls):
            apply.delete(kube, kind, obj, unchanged=True)
