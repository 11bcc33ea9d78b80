"""AdmissionReviews: the path each webhook is served at, the request routed by its path to
the decision (`decisions.py`), and the answer envelope with its JSON patch."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from typing import Any

from controllers.webhooks.decisions import (
    malformed_job,
    mutate_job,
    mutate_pod,
    mutate_suspend,
    validate_job,
    validate_queue_object,
)
from quota.api.names import SCHEDULER_NAME

MUTATE_JOB_PATH = "/mutate-batch-v1-job"
VALIDATE_JOB_PATH = "/validate-batch-v1-job"
VALIDATE_QUEUES_PATH = "/validate-muster-dev-v1alpha1"
MUTATE_SUSPEND_PATH = "/mutate-suspend"
MUTATE_POD_PATH = "/mutate-v1-pod"


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
