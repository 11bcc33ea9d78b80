"""Raw-dict access to the Kubernetes kinds the controller reads and writes, through the
official client.

Objects travel as the JSON dicts the apiserver sends (`_preload_content=False`) rather than
as the client's generated models: the cache then holds exactly what the server holds, a
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

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

Obj = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    """One kind of object: how the client names its calls, and whether it is namespaced."""

    name: str
    namespaced: bool
    # Built-in kinds: the API class and the snake-case suffix of its methods.
    api: type | None = None
    method: str = ""
    # Custom kinds: group, version and plural for CustomObjectsApi.
    group: str = ""
    version: str = ""
    plural: str = ""

    @property
    def custom(self) -> bool:
        return self.api is None


JOB = Kind("Job", True, client.BatchV1Api, "job")
POD = Kind("Pod", True, client.CoreV1Api, "pod")
NODE = Kind("Node", False, client.CoreV1Api, "node")
EVENT = Kind("Event", True, client.CoreV1Api, "event")
SECRET = Kind("Secret", True, client.CoreV1Api, "secret")
NAMESPACE = Kind("Namespace", False, client.CoreV1Api, "namespace")
LEASE = Kind("Lease", True, client.CoordinationV1Api, "lease")
PRIORITY_CLASS = Kind("PriorityClass", False, client.SchedulingV1Api, "priority_class")
PDB = Kind("PodDisruptionBudget", True, client.PolicyV1Api, "pod_disruption_budget")
DEPLOYMENT = Kind("Deployment", True, client.AppsV1Api, "deployment")
STATEFUL_SET = Kind("StatefulSet", True, client.AppsV1Api, "stateful_set")
MUTATING_WEBHOOK = Kind(
    "MutatingWebhookConfiguration",
    False,
    client.AdmissionregistrationV1Api,
    "mutating_webhook_configuration",
)
VALIDATING_WEBHOOK = Kind(
    "ValidatingWebhookConfiguration",
    False,
    client.AdmissionregistrationV1Api,
    "validating_webhook_configuration",
)
MUTATING_POLICY = Kind(
    "MutatingAdmissionPolicy", False, client.AdmissionregistrationV1Api, "mutating_admission_policy"
)
MUTATING_POLICY_BINDING = Kind(
    "MutatingAdmissionPolicyBinding",
    False,
    client.AdmissionregistrationV1Api,
    "mutating_admission_policy_binding",
)
VALIDATING_POLICY = Kind(
    "ValidatingAdmissionPolicy",
    False,
    client.AdmissionregistrationV1Api,
    "validating_admission_policy",
)
VALIDATING_POLICY_BINDING = Kind(
    "ValidatingAdmissionPolicyBinding",
    False,
    client.AdmissionregistrationV1Api,
    "validating_admission_policy_binding",
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
    pool is), so one instance serves every worker."""

    def __init__(self, api_client: client.ApiClient, *, request_timeout: float = 30.0) -> None:
        self.api_client = api_client
        self._apis: dict[type, Any] = {}
        self._custom = client.CustomObjectsApi(api_client)
        self._timeout = request_timeout

    def _api(self, kind: Kind) -> Any:
        assert kind.api is not None
        api = self._apis.get(kind.api)
        if api is None:
            api = self._apis[kind.api] = kind.api(self.api_client)
        return api

    @staticmethod
    def _json(response: Any) -> Obj:
        data = response.data
        result: Obj = json.loads(data) if data else {}
        return result

    def _call(
        self,
        verb: str,
        kind: Kind,
        namespace: str | None,
        *,
        suffix: str = "",
        **kwargs: Any,
    ) -> Obj:
        # Keyword arguments throughout: the generated methods disagree on positional order
        # (create takes namespace first, read/patch/delete take name first).
        kwargs.setdefault("_request_timeout", self._timeout)
        kwargs["_preload_content"] = False
        if kind.namespaced:
            kwargs["namespace"] = namespace
        if kind.custom:
            scope = "namespaced" if kind.namespaced else "cluster"
            fn = getattr(self._custom, f"{verb}_{scope}_custom_object{suffix}")
            kwargs.update(group=kind.group, version=kind.version, plural=kind.plural)
        else:
            scope = "namespaced_" if kind.namespaced else ""
            fn = getattr(self._api(kind), f"{verb}_{scope}{kind.method}{suffix}")
        return self._json(fn(**kwargs))

    # ------------------------------------------------------------------ reads
    def serves(self, kind: Kind) -> bool:
        """Whether the apiserver serves this built-in kind (its API group's discovery)."""
        response = self._api(kind).get_api_resources(
            _preload_content=False, _request_timeout=self._timeout
        )
        resources = self._json(response).get("resources") or []
        return any(r.get("kind") == kind.name for r in resources)

    def get(self, kind: Kind, namespace: str | None, name: str) -> Obj | None:
        """The object as the apiserver has it now (a quorum read), or None if absent."""
        verb = "get" if kind.custom else "read"
        try:
            return self._call(verb, kind, namespace, name=name)
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
        kwargs: dict[str, Any] = {"limit": limit}
        if label_selector:
            kwargs["label_selector"] = label_selector
        if field_selector:
            kwargs["field_selector"] = field_selector
        if continue_token:
            kwargs["_continue"] = continue_token
        kwargs["_request_timeout"] = self._timeout
        return self._json(self._list_call(kind, namespace, **kwargs))

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

    def _list_call(self, kind: Kind, namespace: str | None, **kwargs: Any) -> Any:
        if kind.custom:
            if kind.namespaced and namespace is None:
                return self._custom.list_custom_object_for_all_namespaces(
                    kind.group, kind.version, kind.plural, _preload_content=False, **kwargs
                )
            if kind.namespaced:
                kwargs["namespace"] = namespace
            scope = "namespaced" if kind.namespaced else "cluster"
            fn = getattr(self._custom, f"list_{scope}_custom_object")
            return fn(
                kind.group, kind.version, plural=kind.plural, _preload_content=False, **kwargs
            )
        api = self._api(kind)
        if kind.namespaced and namespace is None:
            fn = getattr(api, f"list_{kind.method}_for_all_namespaces")
            return fn(_preload_content=False, **kwargs)
        if kind.namespaced:
            fn = getattr(api, f"list_namespaced_{kind.method}")
            return fn(namespace, _preload_content=False, **kwargs)
        return getattr(api, f"list_{kind.method}")(_preload_content=False, **kwargs)

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
        kwargs: dict[str, Any] = {
            "watch": True,
            "resource_version": resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": timeout_seconds,
            # The server closes the watch after timeout_seconds; the read timeout only
            # catches a connection that died silently.
            "_request_timeout": (10, timeout_seconds + 30),
        }
        if label_selector:
            kwargs["label_selector"] = label_selector
        if field_selector:
            kwargs["field_selector"] = field_selector
        response = self._list_call(kind, namespace, **kwargs)

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
        if dry_run:
            return self._call("create", kind, namespace, body=body, dry_run="All")
        return self._call("create", kind, namespace, body=body)

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
        suffix = "_status" if status else ""
        return self._call(
            "patch",
            kind,
            namespace,
            suffix=suffix,
            name=name,
            body=patch,
            _content_type=MERGE_PATCH,
        )

    def patch_ops(self, kind: Kind, namespace: str | None, name: str, ops: Sequence[Obj]) -> Obj:
        """Apply an RFC 6902 JSON patch to the main resource. Its `test` operations are
        preconditions: the server answers 422 and changes nothing if one fails."""
        return self._call("patch", kind, namespace, name=name, body=ops, _content_type=JSON_PATCH)

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
            self._call("delete", kind, namespace, name=name, body=body)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True
