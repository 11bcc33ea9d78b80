"""AdmissionReviews: the path each webhook is served at, the request routed by its path to
the decision (`decisions.py`), and the answer envelope with its JSON patch."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from typing import Any

from controllers.state.ownergroups import OWNER_KINDS
from controllers.webhooks.decisions import (
    malformed_job,
    mutate_job,
    mutate_owner,
    mutate_pod,
    mutate_queued_pod,
    mutate_suspend,
    refuse_pod,
    refuse_start,
    refuse_toleration,
    validate_job,
    validate_queue_object,
)
from quota.api.names import SCHEDULER_NAME

MUTATE_JOB_PATH = "/mutate-batch-v1-job"
VALIDATE_JOB_PATH = "/validate-batch-v1-job"
VALIDATE_QUEUES_PATH = "/validate-muster-dev-v1alpha1"
MUTATE_SUSPEND_PATH = "/mutate-suspend"
MUTATE_POD_PATH = "/mutate-v1-pod"
MUTATE_QUEUED_POD_PATH = "/mutate-queued-pod"
# Kinds queued by their pods: one path per kind, `MUTATE_OWNER_PATH` + its resource.
MUTATE_OWNER_PATH = "/mutate-owner-"
# Managed namespaces (docs/tenancy.md): the webhooks that select them say so by their path.
MUTATE_MANAGED_JOB_PATH = "/mutate-managed-batch-v1-job"
MUTATE_MANAGED_SUSPEND_PATH = "/mutate-managed-suspend"
VALIDATE_MANAGED_PATH = "/validate-managed"


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
    """Routes AdmissionReview requests to the decisions (`decisions.py`).

    `scheduler_name` goes into the pods of every labelled Job created ("" leaves them to
    kube-scheduler); the controller sets it from `--scheduler-name`. In managed namespaces,
    `controller_user` is Muster's username and `flavors` the ResourceFlavors (name and
    `spec.nodeTaints`), which the controller sends whenever they change.
    """

    def __init__(
        self,
        queue_warnings: Callable[[Mapping[str, Any]], list[str]] | None = None,
        *,
        scheduler_name: str = SCHEDULER_NAME,
        controller_user: str = "",
    ):
        self.queue_warnings = queue_warnings
        self.scheduler_name = scheduler_name
        self.controller_user = controller_user
        self.flavors: list[Mapping[str, Any]] = []

    def _managed(self, request: Mapping[str, Any], obj: Mapping[str, Any]) -> str | None:
        """Why an object in a managed namespace is refused (`decisions.refuse_*`), or None."""
        old = request.get("oldObject")
        user_info = request.get("userInfo") or {}
        user = str(user_info.get("username") or "")
        if obj.get("kind") != "Pod":
            return refuse_start(obj, old, user, self.controller_user)
        groups = [str(g) for g in user_info.get("groups") or []]
        refusal = refuse_pod(obj, old, user, groups, self.controller_user)
        for flavor in self.flavors:
            if refusal is not None:
                break
            refusal = refuse_toleration(
                obj, old, flavor, scheduler_name=self.scheduler_name, user=user
            )
        return refusal

    def handle(self, path: str, review: Mapping[str, Any]) -> dict[str, Any]:
        request = review.get("request") if isinstance(review, Mapping) else None
        if not isinstance(request, Mapping):
            return review_response("", allowed=False, message="not an AdmissionReview request")
        uid = str(request.get("uid", ""))
        obj = request.get("object") or {}
        old = request.get("oldObject")
        managed = path in (MUTATE_MANAGED_JOB_PATH, MUTATE_MANAGED_SUSPEND_PATH)
        if managed:
            path = MUTATE_JOB_PATH if path == MUTATE_MANAGED_JOB_PATH else MUTATE_SUSPEND_PATH
        if path == VALIDATE_MANAGED_PATH:
            if not isinstance(obj, Mapping) or not isinstance(old or {}, Mapping):
                return review_response(uid, allowed=False, message="object must be a mapping")
            # A new object may not carry its namespace yet; the refusals name it.
            meta = {"namespace": request.get("namespace"), **(obj.get("metadata") or {})}
            refusal = self._managed(request, {**obj, "metadata": meta})
            return review_response(uid, allowed=refusal is None, message=refusal)
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
            patch = mutate_job(obj, self.scheduler_name, managed)
            return review_response(uid, allowed=True, patch=patch)
        if path == VALIDATE_JOB_PATH:
            refusal = validate_job(obj, old)
            return review_response(uid, allowed=refusal is None, message=refusal)
        if path == MUTATE_SUSPEND_PATH:
            if not isinstance(obj, Mapping):
                return review_response(uid, allowed=False, message="object must be a mapping")
            return review_response(uid, allowed=True, patch=mutate_suspend(obj, managed))
        if path == MUTATE_POD_PATH:
            if not isinstance(obj, Mapping):
                return review_response(uid, allowed=False, message="object must be a mapping")
            return review_response(uid, allowed=True, patch=mutate_pod(obj, self.scheduler_name))
        if path == MUTATE_QUEUED_POD_PATH:
            if not isinstance(obj, Mapping):
                return review_response(uid, allowed=False, message="object must be a mapping")
            patch = mutate_queued_pod(obj, self.scheduler_name)
            return review_response(uid, allowed=True, patch=patch)
        if path.startswith(MUTATE_OWNER_PATH):
            kind = next((k for k in OWNER_KINDS if path == MUTATE_OWNER_PATH + k.resource), None)
            if kind is None or not isinstance(obj, Mapping):
                return review_response(uid, allowed=False, message="object must be a mapping")
            return review_response(uid, allowed=True, patch=mutate_owner(obj, kind))
        if path == VALIDATE_QUEUES_PATH:
            if not isinstance(obj, Mapping):
                return review_response(uid, allowed=False, message="object must be a mapping")
            refusal, warnings = validate_queue_object(obj, self.queue_warnings)
            return review_response(uid, allowed=refusal is None, message=refusal, warnings=warnings)
        return review_response(uid, allowed=True)
