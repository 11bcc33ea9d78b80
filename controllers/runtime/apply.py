"""Optimistic-concurrency writes: change a copy of the object, send the difference as a
merge patch that is conditional on the resourceVersion the change was computed from, and on
409 Conflict read the object again and recompute. Nothing is ever written blind over a
version the writer did not see.
"""

from __future__ import annotations

import copy
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


def update(
    kube: Kube,
    kind: Kind,
    key: str,
    mutate: Mutation,
    *,
    cache: Informer | None = None,
    current: Obj | None = None,
    status: bool = False,
    attempts: int = 5,
) -> Obj | None:
    """Apply `mutate` to the object and write the result, retrying on conflict.

    Starts from `current` (or the cache, or a live read), so the common case costs one
    request. Returns the object as written, the unchanged object if `mutate` returned False,
    or None if the object does not exist. The written object is fed back into `cache`."""
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
        patch = merge_patch(_part(obj, status), _part(desired, status))
        if not patch:
            return obj
        patch.setdefault("metadata", {})["resourceVersion"] = obj["metadata"]["resourceVersion"]
        try:
            written = kube.patch(kind, namespace, name, patch, status=status)
        except ApiException as error:
            if error.status == 409:
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
