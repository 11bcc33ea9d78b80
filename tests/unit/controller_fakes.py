"""An in-memory stand-in for the apiserver, for unit tests of one reconciler or one runtime
piece at a time. It keeps what the real one guarantees and the controller relies on:
resourceVersions that grow with every write, 409 on a stale resourceVersion, 409 on
creating an existing name, merge-patch semantics, JSON patches whose failed `test` is a
422 (a missing member tests equal to null, as the apiserver's patch library has it), and
uid/resourceVersion preconditions on delete. The end-to-end tests are the proof against the
real apiserver."""

from __future__ import annotations

import copy
import itertools
import json
import threading
import uuid
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from controllers.runtime.resources import Kind, Kube, Obj


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def _error(status: int, reason: str) -> ApiException:
    error = ApiException(status=status, reason=reason)
    # What the apiserver answers a JSON patch that does not apply: no details.
    error.body = json.dumps({"kind": "Status", "code": status, "message": reason, "details": {}})
    return error


def apply_json_patch(target: Obj, ops: Any) -> Obj:
    """RFC 6902 over plain dicts (paths through objects only, as Muster writes them)."""
    doc = copy.deepcopy(target)
    for op in ops:
        *parents, last = [
            t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]
        ]
        node: Any = doc
        for token in parents:
            if not isinstance(node, dict) or token not in node:
                raise _error(422, f"jsonpatch {op['op']}: missing {op['path']}")
            node = node[token]
        if op["op"] == "test":
            if node.get(last) != op["value"]:
                raise _error(422, f"testing value {op['path']} failed: test failed")
        elif op["op"] == "remove" or (op["op"] == "replace" and last not in node):
            if last not in node:
                raise _error(422, f"jsonpatch remove: missing {op['path']}")
            del node[last]
        if op["op"] in ("add", "replace"):
            node[last] = copy.deepcopy(op["value"])
    return doc


class FakeKube(Kube):
    """Dict-valued objects keyed by (kind name, namespace, name)."""

    def __init__(self) -> None:  # no ApiClient: nothing here goes over the wire
        self.objects: dict[tuple[str, str | None, str], Obj] = {}
        self._rv = itertools.count(1)
        self._lock = threading.RLock()
        self.writes: list[tuple[str, str, str]] = []  # (verb, kind, name)
        # Called before a write is applied; may raise to inject a failure.
        self.before_write: Callable[[str, Kind, str], None] | None = None

    def _key(self, kind: Kind, namespace: str | None, name: str) -> tuple[str, str | None, str]:
        return (kind.name, namespace if kind.namespaced else None, name)

    def put(self, kind: Kind, obj: Obj) -> Obj:
        """Store an object as if someone else created it."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = str(next(self._rv))
        self.objects[self._key(kind, meta.get("namespace"), meta["name"])] = obj
        return copy.deepcopy(obj)

    def get(self, kind: Kind, namespace: str | None, name: str) -> Obj | None:
        found = self.objects.get(self._key(kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[Obj], str]:
        items = []
        for (kind_name, ns, _), obj in sorted(self.objects.items(), key=lambda kv: str(kv[0])):
            if kind_name != kind.name or (namespace is not None and ns != namespace):
                continue
            if label_selector and not _matches(obj, label_selector):
                continue
            items.append(copy.deepcopy(obj))
        return items, str(next(self._rv))

    def create(self, kind: Kind, namespace: str | None, body: Obj) -> Obj:
        with self._lock:
            name = body["metadata"]["name"]
            if self.before_write:
                self.before_write("create", kind, name)
            if self._key(kind, namespace, name) in self.objects:
                raise _error(409, "AlreadyExists")
            self.writes.append(("create", kind.name, name))
            return self.put(kind, body)

    def patch(
        self, kind: Kind, namespace: str | None, name: str, patch: Obj, *, status: bool = False
    ) -> Obj:
        def change(current: Obj) -> Obj:
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
                raise _error(409, "Conflict")
            part = (
                {"status": patch.get("status")}
                if status
                else {k: v for k, v in patch.items() if k != "status"}
            )
            return apply_merge_patch(current, part)

        return self._change(kind, namespace, name, change, status=status)

    def patch_ops(self, kind: Kind, namespace: str | None, name: str, ops: Any) -> Obj:
        def change(current: Obj) -> Obj:
            updated = apply_json_patch(current, ops)
            # The main resource ignores status.
            updated.pop("status", None)
            if "status" in current:
                updated["status"] = current["status"]
            return updated

        return self._change(kind, namespace, name, change, status=False)

    def _change(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        change: Callable[[Obj], Obj],
        *,
        status: bool,
    ) -> Obj:
        """Write `change(current)` as the object's next version (a spec change moves the
        generation), or raise what `change` raises."""
        with self._lock:
            if self.before_write:
                self.before_write("patch", kind, name)
            key = self._key(kind, namespace, name)
            current = self.objects.get(key)
            if current is None:
                raise _error(404, "NotFound")
            updated = change(current)
            if not status and updated.get("spec") != current.get("spec"):
                updated["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
            updated["metadata"]["resourceVersion"] = str(next(self._rv))
            self.objects[key] = updated
            self.writes.append(("patch" + ("/status" if status else ""), kind.name, name))
            return copy.deepcopy(updated)

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
        with self._lock:
            key = self._key(kind, namespace, name)
            current = self.objects.get(key)
            if current is None:
                return False
            if uid and current["metadata"]["uid"] != uid:
                raise _error(409, "Conflict")
            if resource_version and current["metadata"]["resourceVersion"] != resource_version:
                raise _error(409, "Conflict")
            del self.objects[key]
            self.writes.append(("delete", kind.name, name))
            return True


def _matches(obj: Obj, selector: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in selector.split(","):
        if "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key) != value:
                return False
        elif term not in labels:
            return False
    return True
