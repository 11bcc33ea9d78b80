"""Optimistic-concurrency writes: change a copy of the object, send the difference as a
merge patch that is conditional on the resourceVersion the change was computed from, and on
409 Conflict read the object again and recompute. Nothing is ever written blind over a
version the writer did not see.

A write that changes only an object's spec (and single labels or annotations) can instead be
conditional on the spec alone (`spec_guarded`): a JSON patch whose `test` operations require
the same uid and metadata.generation, which moves only when the spec does. Another
controller's status write then no longer fails it: the Job controller records a suspended
Job's condition just as Muster unsuspends it, and with a resourceVersion precondition one
admission in eight paid a refused write, a read and a second write.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from controllers.runtime.informer import Informer
from controllers.runtime.resources import Kind, Kube, Obj, object_key, split_key

log = logging.getLogger(__name__)

# Change a deep copy of the object in place; return False to write nothing (the object is
# already as wanted, or the change no longer applies to this version).
Mutation = Callable[[Obj], bool]


class ConflictRetriesExhausted(RuntimeError):
    """The object kept changing under us; the caller should requeue and try later."""


def merge_patch(old: Any, new: Any) -> Any:
    """The RFC 7386 JSON merge patch that turns `old` into `new` (lists are replaced whole;
    removed keys become null)."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return copy.deepcopy(new)
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        if key not in old:
            patch[key] = copy.deepcopy(value)
        elif old[key] != value:
            if isinstance(old[key], Mapping) and isinstance(value, Mapping):
                patch[key] = merge_patch(old[key], value)
            else:
                patch[key] = copy.deepcopy(value)
    return patch


def _part(obj: Obj, status: bool) -> Obj:
    """The part of an object a write touches: the status subresource sees only status,
    the main resource ignores status."""
    if status:
        return {"status": obj.get("status") or {}}
    return {k: v for k, v in obj.items() if k != "status"}


def _pointer(path: str, key: str) -> str:
    """`path` extended by one RFC 6901 reference token."""
    return f"{path}/{key.replace('~', '~0').replace('/', '~1')}"


def _diff_ops(path: str, old: Any, new: Any) -> list[Obj]:
    """Operations turning `old` into `new` at `path`, where `old` is known to be there
    (lists are replaced whole)."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return [{"op": "replace", "path": path, "value": copy.deepcopy(new)}]
    ops: list[Obj] = [{"op": "remove", "path": _pointer(path, k)} for k in old if k not in new]
    for k, value in new.items():
        if k not in old:
            ops.append({"op": "add", "path": _pointer(path, k), "value": copy.deepcopy(value)})
        elif old[k] != value:
            ops.extend(_diff_ops(_pointer(path, k), old[k], value))
    return ops


def _map_ops(path: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[Obj]:
    """Operations for a labels or annotations map, key by key, so a key another writer set
    meanwhile is kept; a map that was absent must still be absent (or empty) to be added."""
    old_map, new_map = old or {}, new or {}
    if old_map == new_map:
        return []
    if not old_map:
        return [
            {"op": "test", "path": path, "value": old},
            {"op": "add", "path": path, "value": copy.deepcopy(dict(new_map))},
        ]
    ops: list[Obj] = [
        {"op": "remove", "path": _pointer(path, k)} for k in old_map if k not in new_map
    ]
    ops.extend(
        {"op": "add", "path": _pointer(path, k), "value": v}
        for k, v in new_map.items()
        if k not in old_map or old_map[k] != v
    )
    return ops


def spec_ops(old: Obj, new: Obj) -> list[Obj] | None:
    """The JSON patch turning `old` into `new` on condition that the object still has the
    uid and generation `old` was read at; None if the change reaches beyond the spec and
    single labels and annotations (then only a resourceVersion precondition will do)."""
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    uid, generation = old_meta.get("uid"), old_meta.get("generation")
    if uid is None or generation is None:
        return None
    for key in old.keys() | new.keys():
        if key not in ("spec", "metadata", "status") and old.get(key) != new.get(key):
            return None
    for key in old_meta.keys() | new_meta.keys():
        if key not in ("labels", "annotations") and old_meta.get(key) != new_meta.get(key):
            return None
    if ("spec" in old) != ("spec" in new):
        return None
    ops: list[Obj] = [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": "/metadata/generation", "value": generation},
    ]
    for field in ("labels", "annotations"):
        ops.extend(_map_ops(f"/metadata/{field}", old_meta.get(field), new_meta.get(field)))
    if old.get("spec") != new.get("spec"):
        ops.extend(_diff_ops("/spec", old["spec"], new["spec"]))
    return ops if len(ops) > 2 else []


def _failed_test(error: ApiException) -> bool:
    """A JSON patch that no longer applies to the object: a `test` precondition failed, or
    a member it removes is gone. The apiserver says only "the server rejected our request
    due to an error in our request" (422, no details), where a refusal by validation names
    the object and its fields."""
    if error.status != 422:
        return False
    try:
        details = json.loads(error.body or "{}").get("details") or {}
    except (ValueError, AttributeError):
        return False
    return not details.get("name") and not details.get("causes")


def update(
    kube: Kube,
    kind: Kind,
    key: str,
    mutate: Mutation,
    *,
    cache: Informer | None = None,
    current: Obj | None = None,
    status: bool = False,
    spec_guarded: bool = False,
    attempts: int = 5,
) -> Obj | None:
    """Apply `mutate` to the object and write the result, retrying on conflict.

    Starts from `current` (or the cache, or a live read), so the common case costs one
    request. Returns the object as written, the unchanged object if `mutate` returned False,
    or None if the object does not exist. The written object is fed back into `cache`.
    With `spec_guarded`, a change within the spec (and single labels and annotations) is
    conditional on the spec it was computed from, not on the whole object's version."""
    namespace, name = split_key(key)
    obj = current if current is not None else (cache.get(key) if cache else None)
    if obj is None:
        obj = kube.get(kind, namespace, name)
    for _ in range(attempts):
        if obj is None:
            return None
        desired = copy.deepcopy(obj)
        if not mutate(desired):
            return obj
        guarded = spec_guarded and not status  # a status write has no spec to guard
        ops = spec_ops(_part(obj, False), _part(desired, False)) if guarded else None
        try:
            if ops is not None:
                if not ops:
                    return obj
                written = kube.patch_ops(kind, namespace, name, ops)
            else:
                patch = merge_patch(_part(obj, status), _part(desired, status))
                if not patch:
                    return obj
                version = obj["metadata"]["resourceVersion"]
                patch.setdefault("metadata", {})["resourceVersion"] = version
                written = kube.patch(kind, namespace, name, patch, status=status)
        except ApiException as error:
            if error.status == 409 or (ops and _failed_test(error)):
                log.debug("conflict; re-reading", extra={"object": f"{kind.name}/{key}"})
                obj = kube.get(kind, namespace, name)
                if obj is not None and cache is not None:
                    cache.write_through(obj)
                continue
            if error.status == 404:
                if cache is not None:
                    cache.forget(key)
                return None
            raise
        if cache is not None:
            cache.write_through(written)
        return written
    raise ConflictRetriesExhausted(
        f"{kind.name} {key} kept changing: gave up after {attempts} conflicting writes"
    )


def create(kube: Kube, kind: Kind, body: Obj, *, cache: Informer | None = None) -> tuple[Obj, bool]:
    """Create an object; if one with that name exists, return it instead. The flag says
    whether this call created it (deterministic names make creation idempotent)."""
    namespace = (body.get("metadata") or {}).get("namespace")
    try:
        created = kube.create(kind, namespace, body)
    except ApiException as error:
        if error.status != 409:
            raise
        existing = kube.get(kind, namespace, body["metadata"]["name"])
        if existing is None:  # deleted in between; the next reconcile creates it
            raise
        if cache is not None:
            cache.write_through(existing)
        return existing, False
    if cache is not None:
        cache.write_through(created)
    return created, True


def delete(
    kube: Kube,
    kind: Kind,
    obj: Obj,
    *,
    cache: Informer | None = None,
    unchanged: bool = False,
) -> bool:
    """Delete exactly this object (uid precondition), so a newer one of the same name is
    never removed by mistake; with `unchanged`, only if nobody wrote it since we read it
    (resourceVersion precondition). False if it was not deleted."""
    meta = obj["metadata"]
    version = meta.get("resourceVersion") if unchanged else None
    try:
        gone = kube.delete(
            kind, meta.get("namespace"), meta["name"], uid=meta.get("uid"), resource_version=version
        )
    except ApiException as error:
        if error.status != 409:
            raise
        # A failed precondition: the object still exists (written since we read it, e.g. a
        # pending slice admitted meanwhile). Keep it in the cache; the watch brings the newer
        # version. Forgetting it here hid it from every reconcile until its next change.
        return False
    if cache is not None:
        cache.forget(object_key(obj))  # deleted now, or already gone (404)
    return gone


def converge(kube: Kube, kind: Kind, desired: Obj, fields: tuple[str, ...]) -> bool:
    """Create a cluster-scoped object of ours, or bring an existing one's `fields` and
    labels to what `desired` has (other labels and fields are left alone). Whether this
    call created it."""
    _, created = create(kube, kind, desired)
    if created:
        return True

    def mutate(obj: Obj) -> bool:
        changed = False
        for field in fields:
            if obj.get(field) != desired[field]:
                obj[field] = copy.deepcopy(desired[field])
                changed = True
        labels = obj["metadata"].setdefault("labels", {})
        for k, v in desired["metadata"].get("labels", {}).items():
            if labels.get(k) != v:
                labels[k] = v
                changed = True
        return changed

    update(kube, kind, desired["metadata"]["name"], mutate)
    return False
