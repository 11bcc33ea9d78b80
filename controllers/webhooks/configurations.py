"""The MutatingWebhookConfiguration and ValidatingWebhookConfiguration that register Muster's
webhooks with the apiserver, and their registration.

Where the apiserver serves MutatingAdmissionPolicy (Kubernetes 1.36+), the rules of the
workload kinds and their pods are registered as admission policies instead (`policies.py`,
the same decisions in CEL, evaluated inside the apiserver) and only the queue objects'
webhook is called; the webhooks then serve clusters without policies. The workload kinds'
rules come from their registrations (`controllers.jobs.kinds`).

Failure policy (see docs/controller.md): the workload webhooks select only objects
carrying `muster.dev/queue-name` (objectSelector), so an unavailable controller never
touches any other workload in the cluster; for those the policy is Fail with a 5 s timeout,
because a labelled object that slipped through unsuspended would run outside its quota.
The queue-object webhook uses Ignore: an administrator must be able to repair queues while
the controller is down, and the Active condition reports every cross-object problem anyway.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

from controllers.jobs.framework import Admission
from controllers.jobs.kinds import admitted_by, managed_webhook_rules, suspend_rules
from controllers.runtime import apply
from controllers.runtime.resources import MUTATING_WEBHOOK, VALIDATING_WEBHOOK, Kube, Obj
from controllers.state.ownergroups import OWNER_KINDS
from controllers.webhooks import policies as admission_policies
from controllers.webhooks.reviews import (
    MUTATE_JOB_PATH,
    MUTATE_MANAGED_JOB_PATH,
    MUTATE_MANAGED_SUSPEND_PATH,
    MUTATE_OWNER_PATH,
    MUTATE_POD_PATH,
    MUTATE_QUEUED_POD_PATH,
    MUTATE_SUSPEND_PATH,
    VALIDATE_JOB_PATH,
    VALIDATE_MANAGED_PATH,
    VALIDATE_QUEUES_PATH,
)
from quota.api.names import OWNER_UID_POD_LABEL

log = logging.getLogger(__name__)

CONFIGURATION_NAME = "muster-webhooks"
TIMEOUT_SECONDS = 5


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


def _webhook(
    name: str,
    client_config: dict[str, Any],
    rules: list[dict[str, Any]],
    object_selector: dict[str, Any],
    *,
    system: bool = False,
    failure: str = "Fail",
    namespaces: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One webhook of a configuration (`system`: kube-system's objects too; `namespaces`:
    only those the managed-namespace selector picks, never kube-system)."""
    selector: dict[str, Any] = {} if system else admission_policies.NOT_SYSTEM
    if namespaces is not None:
        selector = {
            **({"matchLabels": namespaces["matchLabels"]} if namespaces.get("matchLabels") else {}),
            "matchExpressions": [
                *admission_policies.NOT_SYSTEM["matchExpressions"],
                *(namespaces.get("matchExpressions") or []),
            ],
        }
    return {
        "name": name,
        "clientConfig": client_config,
        "rules": rules,
        "objectSelector": object_selector,
        "namespaceSelector": selector,
        "failurePolicy": failure,
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "admissionReviewVersions": ["v1"],
    }


def _configuration(kind: str, webhooks: list[dict[str, Any]]) -> Obj:
    # part-of, not managed-by: the Helm chart owns these objects and Helm checks managed-by.
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": CONFIGURATION_NAME, "labels": {"app.kubernetes.io/part-of": "muster"}},
        "webhooks": webhooks,
    }


def configurations(
    ca_bundle: bytes,
    *,
    url_base: str | None = None,
    service: tuple[str, str, int] | None = None,
    policies: bool = True,
    managed: admission_policies.Managed | None = None,
) -> tuple[Obj | None, Obj]:
    """The MutatingWebhookConfiguration and ValidatingWebhookConfiguration to register.

    With `policies` (the apiserver evaluates Muster's admission policies, `policies.py`),
    the workload kinds and their pods are left to those and only the queue objects'
    webhook remains: there is then no MutatingWebhookConfiguration (None). Without them,
    `managed` namespaces get webhooks of their own (the managed policies' work)."""
    # The same scope as the admission policies: labelled objects, never kube-system.
    labelled = admission_policies.LABELLED

    def cc(path: str) -> dict[str, Any]:
        return _client_config(path, ca_bundle, url_base=url_base, service=service)

    def job_rules(operation: str) -> list[dict[str, Any]]:
        return [
            {**k.rule(), "scope": "Namespaced", "operations": [operation]}
            for k in admitted_by(Admission.BATCH_JOB)
        ]

    queues = _webhook(
        "vqueues.muster.dev",
        cc(VALIDATE_QUEUES_PATH),
        [
            {
                "apiGroups": ["muster.dev"],
                "apiVersions": ["v1alpha1"],
                "resources": ["clusterqueues", "localqueues", "resourceflavors"],
                "operations": ["CREATE", "UPDATE"],
                "scope": "*",
            }
        ],
        {},
        system=True,
        failure="Ignore",
    )
    if policies:
        return None, _configuration("ValidatingWebhookConfiguration", [queues])
    # Pods of admitted objects of the other kinds (the owner label Muster put on their
    # templates): to Muster's scheduler. No other pod is ever sent here.
    pod_rule = {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "resources": ["pods"],
        "scope": "Namespaced",
        "operations": ["CREATE"],
    }
    owned = {"matchExpressions": [{"key": OWNER_UID_POD_LABEL, "operator": "Exists"}]}
    mutating_hooks = [
        {
            **_webhook("mjob.muster.dev", cc(MUTATE_JOB_PATH), job_rules("CREATE"), labelled),
            "reinvocationPolicy": "IfNeeded",
        },
        # The kinds Muster's generic rule admits, with the queue label: created suspended.
        _webhook("msuspend.muster.dev", cc(MUTATE_SUSPEND_PATH), suspend_rules(), labelled),
        _webhook("mpod.muster.dev", cc(MUTATE_POD_PATH), [pod_rule], owned),
        # Kinds queued by their pods: the queue label into their templates, and their pods
        # (any labelled pod of no object queued by its uid) gated.
        *(
            _webhook(
                f"mowner-{k.resource}.muster.dev",
                cc(MUTATE_OWNER_PATH + k.resource),
                [{**k.rule(), "scope": "Namespaced", "operations": ["CREATE", "UPDATE"]}],
                labelled,
            )
            for k in OWNER_KINDS
        ),
        _webhook(
            "mqpod.muster.dev",
            cc(MUTATE_QUEUED_POD_PATH),
            [pod_rule],
            admission_policies.QUEUED_POD,
        ),
    ]
    vjob = _webhook("vjob.muster.dev", cc(VALIDATE_JOB_PATH), job_rules("UPDATE"), labelled)
    validating_hooks = [vjob, queues]
    if managed is not None:
        # Every object of the managed namespaces: the path tells the handler they are.
        ns = managed.selector
        mutating_hooks += [
            {
                **_webhook(
                    "mjob-managed.muster.dev",
                    cc(MUTATE_MANAGED_JOB_PATH),
                    job_rules("CREATE"),
                    {},
                    namespaces=ns,
                ),
                "reinvocationPolicy": "IfNeeded",
            },
            _webhook(
                "msuspend-managed.muster.dev",
                cc(MUTATE_MANAGED_SUSPEND_PATH),
                suspend_rules(),
                {},
                namespaces=ns,
            ),
        ]
        validating_hooks.append(
            _webhook(
                "vmanaged.muster.dev",
                cc(VALIDATE_MANAGED_PATH),
                managed_webhook_rules(),
                {},
                namespaces=ns,
            )
        )
    mutating = _configuration("MutatingWebhookConfiguration", mutating_hooks)
    return mutating, _configuration("ValidatingWebhookConfiguration", validating_hooks)


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
