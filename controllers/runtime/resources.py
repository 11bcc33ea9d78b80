"""Raw-dict access to the Kubernetes kinds the controller reads and writes, through the
official client.

Objects travel as the JSON dicts the apiserver sends rather than as the client's generated
models: the cache then holds exactly what the server holds, a
merge patch computed from two dicts loses no field the client library does not know, and
1,000 Jobs do not pay for model validation on every watch event.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

Obj = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    """One kind of object: where the apiserver serves it, and whether it is namespaced."""

    name: str
    namespaced: bool
    group: str = ""  # "" for the core group
    version: str = ""
    plural: str = ""
    # A kind every apiserver serves (no CRD to install, no discovery to ask first).
    builtin: bool = False

    @property
    def custom(self) -> bool:
        return not self.builtin

    @property
    def base(self) -> str:
        """Its API group version's path: /api/v1, /apis/batch/v1."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The path of its collection (in `namespace`, or all of them), or of one object."""
        out = self.base
        if self.namespaced and namespace is not None:
            out += f"/namespaces/{quote(namespace, safe='')}"
        out += f"/{self.plural}"
        return out if name is None else f"{out}/{quote(name, safe='')}"


def _builtin(name: str, namespaced: bool, group: str, version: str, plural: str) -> Kind:
    return Kind(name, namespaced, group, version, plural, builtin=True)


JOB = _builtin("Job", True, "batch", "v1", "jobs")
POD = _builtin("Pod", True, "", "v1", "pods")
NODE = _builtin("Node", False, "", "v1", "nodes")
EVENT = _builtin("Event", True, "", "v1", "events")
SECRET = _builtin("Secret", True, "", "v1", "secrets")
NAMESPACE = _builtin("Namespace", False, "", "v1", "namespaces")
LEASE = _builtin("Lease", True, "coordination.k8s.io", "v1", "leases")
PRIORITY_CLASS = _builtin("PriorityClass", False, "scheduling.k8s.io", "v1", "priorityclasses")
PDB = _builtin("PodDisruptionBudget", True, "policy", "v1", "poddisruptionbudgets")
DEPLOYMENT = _builtin("Deployment", True, "apps", "v1", "deployments")
STATEFUL_SET = _builtin("StatefulSet", True, "apps", "v1", "statefulsets")
SELF_SUBJECT_REVIEW = _builtin(
    "SelfSubjectReview", False, "authentication.k8s.io", "v1", "selfsubjectreviews"
)
_ADMISSION = "admissionregistration.k8s.io"
MUTATING_WEBHOOK = _builtin(
    "MutatingWebhookConfiguration", False, _ADMISSION, "v1", "mutatingwebhookconfigurations"
)
VALIDATING_WEBHOOK = _builtin(
    "ValidatingWebhookConfiguration", False, _ADMISSION, "v1", "validatingwebhookconfigurations"
)
MUTATING_POLICY = _builtin(
    "MutatingAdmissionPolicy", False, _ADMISSION, "v1", "mutatingadmissionpolicies"
)
MUTATING_POLICY_BINDING = _builtin(
    "MutatingAdmissionPolicyBinding", False, _ADMISSION, "v1", "mutatingadmissionpolicybindings"
)
VALIDATING_POLICY = _builtin(
    "ValidatingAdmissionPolicy", False, _ADMISSION, "v1", "validatingadmissionpolicies"
)
VALIDATING_POLICY_BINDING = _builtin(
    "ValidatingAdmissionPolicyBinding",
    False,
    _ADMISSION,
    "v1",
    "validatingadmissionpolicybindings",
)


def muster_kind(name: str, plural: str, namespaced: bool) -> Kind:
    """A kind of the muster.dev/v1alpha1 API group."""
    return Kind(name, namespaced, group="muster.dev", version="v1alpha1", plural=plural)


WORKLOAD = muster_kind("Workload", "workloads", True)
CLUSTER_QUEUE = muster_kind("ClusterQueue", "clusterqueues", False)
LOCAL_QUEUE = muster_kind("LocalQueue", "localqueues", True)
RESOURCE_FLAVOR = muster_kind("ResourceFlavor", "resourceflavors", False)
POD_GROUP = muster_kind("PodGroup", "podgroups", True)
TOPOLOGY = muster_kind("Topology", "topologies", False)
WORKER_CLUSTER = muster_kind("WorkerCluster", "workerclusters", False)


def object_key(obj: Mapping[str, Any]) -> str:
    """The cache key of an object: "namespace/name", or "name" when cluster-scoped."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


def split_key(key: str) -> tuple[str | None, str]:
    """Inverse of `object_key`."""
    if "/" in key:
        namespace, name = key.split("/", 1)
        return namespace, name
    return None, key


def is_status(error: BaseException, *codes: int) -> bool:
    """Whether an exception is an API error with one of the given HTTP status codes."""
    return isinstance(error, ApiException) and error.status in codes


class WriteCounter:
    """Counts requests by HTTP method, by wrapping the ApiClient's single request entry point
    (the benchmark reports API writes per admitted Job from it)."""

    WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})

    def __init__(self, api_client: client.ApiClient) -> None:
        self._lock = threading.Lock()
        self.by_method: Counter[str] = Counter()
        original = api_client.call_api

        def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.by_method[method.upper()] += 1
            return original(method, url, *args, **kwargs)

        api_client.call_api = counted  # type: ignore[method-assign]

    @property
    def writes(self) -> int:
        with self._lock:
            return sum(n for m, n in self.by_method.items() if m in self.WRITES)


class Kube:
    """Typed-by-Kind, dict-valued access to the apiserver. Thread-safe (the client's urllib3
    pool is), so one instance serves every worker.

    Requests go through the official client's `ApiClient` (its configuration, credentials,
    TLS and connection pool) by path, not through its generated API classes: those load
    ~35 MiB of modules into every process (CoreV1Api alone 15 MiB) and validate every call's
    arguments with pydantic, for calls whose answers are read as plain JSON anyway."""

    def __init__(self, api_client: client.ApiClient, *, request_timeout: float = 30.0) -> None:
        self.api_client = api_client
        self._timeout = request_timeout

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
        timeout: Any = None,
    ) -> Any:
        """Send one request; the urllib3 response, unread (raises ApiException unless 2xx)."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        serialized = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        answer = self.api_client.call_api(
            *serialized, _request_timeout=timeout if timeout is not None else self._timeout
        )
        if not 200 <= answer.status <= 299:
            answer.read()
            raise ApiException.from_response(http_resp=answer, body=None, data=None)
        return answer.response

    @staticmethod
    def _json(response: Any) -> Obj:
        data = response.data
        result: Obj = json.loads(data) if data else {}
        return result

    def _call(self, method: str, path: str, **kwargs: Any) -> Obj:
        return self._json(self.request(method, path, **kwargs))

    # ------------------------------------------------------------------ reads
    def serves(self, kind: Kind) -> bool:
        """Whether the apiserver serves this kind (its API group version's discovery)."""
        try:
            resources = self._call("GET", kind.base).get("resources") or []
        except ApiException as error:
            if error.status == 404:
                return False  # the group version itself is not served
            raise
        return any(r.get("kind") == kind.name for r in resources)

    def get(self, kind: Kind, namespace: str | None, name: str) -> Obj | None:
        """The object as the apiserver has it now (a quorum read), or None if absent."""
        try:
            return self._call("GET", kind.path(namespace, name))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def list_page(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
        continue_token: str | None = None,
    ) -> Obj:
        """One page of a list; the result carries metadata.resourceVersion and continue."""
        query = [("limit", str(limit))]
        query += _selectors(label_selector, field_selector)
        if continue_token:
            query.append(("continue", continue_token))
        return self._call("GET", kind.path(namespace), query=query)

    def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[Obj], str]:
        """Every object (paged), and the resourceVersion to watch from."""
        items: list[Obj] = []
        token: str | None = None
        while True:
            page = self.list_page(
                kind,
                namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                continue_token=token,
            )
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    def watch(
        self,
        kind: Kind,
        resource_version: str,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> tuple[Any, Iterator[Obj]]:
        """Open a watch from a resourceVersion: the open response (close it to stop) and an
        iterator of decoded events ({"type", "object"})."""
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
            *_selectors(label_selector, field_selector),
        ]
        # The server closes the watch after timeout_seconds; the read timeout only catches a
        # connection that died silently.
        response = self.request(
            "GET", kind.path(namespace), query=query, timeout=(10, timeout_seconds + 30)
        )

        def events() -> Iterator[Obj]:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if line.strip():
                    event: Obj = json.loads(line)
                    yield event

        return response, events()

    # ----------------------------------------------------------------- writes
    def create(self, kind: Kind, namespace: str | None, body: Obj, *, dry_run: bool = False) -> Obj:
        """Create an object; raises ApiException 409 if it exists. With `dry_run`, the
        apiserver admits and validates it and stores nothing."""
        query = [("dryRun", "All")] if dry_run else []
        return self._call("POST", kind.path(namespace), query=query, body=body)

    def create_subresource(
        self, kind: Kind, namespace: str | None, name: str, subresource: str, body: Obj
    ) -> Obj:
        """POST to an object's subresource (a pod's binding)."""
        return self._call("POST", f"{kind.path(namespace, name)}/{subresource}", body=body)

    def patch(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        patch: Obj,
        *,
        status: bool = False,
    ) -> Obj:
        """Apply a JSON merge patch (to the status subresource if `status`). A patch that
        carries metadata.resourceVersion is conditional: the server answers 409 if the object
        changed since that version, so the caller's view is never silently overwritten."""
        path = kind.path(namespace, name) + ("/status" if status else "")
        return self._call("PATCH", path, body=patch, content_type=MERGE_PATCH)

    def patch_ops(self, kind: Kind, namespace: str | None, name: str, ops: Sequence[Obj]) -> Obj:
        """Apply an RFC 6902 JSON patch to the main resource. Its `test` operations are
        preconditions: the server answers 422 and changes nothing if one fails."""
        return self._call(
            "PATCH", kind.path(namespace, name), body=list(ops), content_type=JSON_PATCH
        )

    def delete(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation: str = "Background",
    ) -> bool:
        """Delete an object (optionally only if it still has this uid / resourceVersion);
        False if it was already gone."""
        body: Obj = {"propagationPolicy": propagation}
        preconditions = {
            k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v
        }
        if preconditions:
            body["preconditions"] = preconditions
        try:
            self._call("DELETE", kind.path(namespace, name), body=body)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True


def _selectors(label_selector: str | None, field_selector: str | None) -> list[tuple[str, str]]:
    out = []
    if label_selector:
        out.append(("labelSelector", label_selector))
    if field_selector:
        out.append(("fieldSelector", field_selector))
    return out
