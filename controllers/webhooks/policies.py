"""Job admission as CEL policies the apiserver evaluates itself: a MutatingAdmissionPolicy
that creates labelled Jobs suspended (their pods for Muster's scheduler, elastic ones gated)
and a ValidatingAdmissionPolicy with the rules of `decisions.validate_job`.

Why policies and not the webhook: a webhook call leaves the apiserver for another process on
every labelled Job created and every Job patched. On a loaded control plane that call, not
the review (0.5 ms), is what creation waits for: 1,000 Jobs took 9x as long to create
through the webhook as without it (docs/benchmarks.md). A policy is evaluated in the
apiserver's own request, so it also never fails because the controller is away: a labelled
Job created while no replica serves is still created suspended and waits for its quota.

They need `admissionregistration.k8s.io/v1` MutatingAdmissionPolicy (GA and on by default
since Kubernetes 1.36). Where the apiserver does not serve it, the controller registers the
webhooks that make the same decisions instead (`configurations.configurations(policies=False)`);
`tests/e2e/test_admission_policies_e2e.py` sends the same cases through the real apiserver's
policies and through the webhook handlers and compares the outcome and the words.

With managed namespaces (`Managed`, docs/tenancy.md) more policies are bound to those
namespaces (`managed_policies`): unlabelled objects queued in LocalQueue `default`, and the
refusals of `decisions.refuse_start`, `refuse_pod` and `refuse_toleration`, with their words
(`tests/e2e/test_tenancy_e2e.py` compares them).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from controllers.jobs import kinds as workload_kinds
from controllers.jobs.framework import DEFAULT_LOCAL_QUEUE, Admission
from controllers.jobs.kinds import admitted_by
from controllers.runtime import apply
from controllers.runtime.resources import (
    MUTATING_POLICY,
    MUTATING_POLICY_BINDING,
    VALIDATING_POLICY,
    VALIDATING_POLICY_BINDING,
    WORKLOAD,
    Kind,
    Kube,
    Obj,
)
from controllers.state.foreigngroups import VOLCANO_POD_GROUP_ANNOTATIONS
from controllers.state.ownergroups import OWNER_KINDS
from controllers.webhooks.decisions import (
    JOB_CONTROLLERS,
    MANAGED_RULE,
    NODES_GROUP,
    POD_OWNER_LABELS,
)
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

GROUP_VERSION = "admissionregistration.k8s.io/v1"
# The mutating and the validating policy of Jobs share this name (they are different kinds).
JOBS_POLICY = "muster-jobs"
SUSPEND_POLICY = "muster-suspend"
PODS_POLICY = "muster-pods"
QUEUED_PODS_POLICY = "muster-queued-pods"
OWNERS_POLICY = "muster-owners"
PART_OF = "app.kubernetes.io/part-of"
LABELS = {PART_OF: "muster"}
# The scheduler name in the chart's copy: replaced by the Helm value.
_CHART_SCHEDULER = "CHART-SCHEDULER-NAME"

LABELLED = {"matchExpressions": [{"key": QUEUE_LABEL, "operator": "Exists"}]}
# The controller's own machinery is never subject to Muster's admission.
NOT_SYSTEM = {
    "matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
    ]
}


def _cel(value: str) -> str:
    """A CEL string literal (single-quoted; the names used here hold no quote)."""
    assert "'" not in value and "\\" not in value, value
    return f"'{value}'"


def _label(obj: str, key: str) -> str:
    """CEL: the value of label `key` of `obj`, '' when absent (an empty queue name is no queue
    name, as in `convert.job_queue_name`)."""
    return (
        f"{obj} != null && has({obj}.metadata.labels) && {_cel(key)} in {obj}.metadata.labels"
        f" ? {obj}.metadata.labels[{_cel(key)}] : ''"
    )


def _annotation(obj: str, key: str) -> str:
    return (
        f"{obj} != null && has({obj}.metadata.annotations)"
        f" && {_cel(key)} in {obj}.metadata.annotations"
        f" ? {obj}.metadata.annotations[{_cel(key)}] : ''"
    )


def _pods_at_once(obj: str) -> str:
    """CEL: min(parallelism, completions) of a Job (parallelism defaults to 1)."""
    parallelism = f"(has({obj}.spec.parallelism) ? {obj}.spec.parallelism : 1)"
    return (
        f"has({obj}.spec.completions) && {obj}.spec.completions < {parallelism}"
        f" ? {obj}.spec.completions : {parallelism}"
    )


def _unset_scheduler(pod_spec: str) -> str:
    """CEL: the pod spec leaves the choice of scheduler to kube-scheduler."""
    return (
        f"!has({pod_spec}.schedulerName) || {pod_spec}.schedulerName == ''"
        f" || {pod_spec}.schedulerName == 'default-scheduler'"
    )


def _policy(name: str, kind: str, spec: dict[str, Any]) -> Obj:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": kind,
        "metadata": {"name": name, "labels": dict(LABELS)},
        "spec": spec,
    }


def _binding(name: str, kind: str, extra: dict[str, Any] | None = None) -> Obj:
    return _policy(name, f"{kind}Binding", {"policyName": name, **(extra or {})})


def _match(
    rules: list[dict[str, Any]], operations: list[str], selector: dict[str, Any]
) -> dict[str, Any]:
    return {
        "resourceRules": [{**rule, "operations": operations} for rule in rules],
        "objectSelector": selector,
        "namespaceSelector": NOT_SYSTEM,
        "matchPolicy": "Equivalent",
    }


def _kind_rules(admission: Admission) -> list[dict[str, Any]]:
    """The resource rules of the workload kinds the apiserver admits by `admission`."""
    return [dict(k.rule()) for k in admitted_by(admission)]


POD_RULE = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
SUSPEND_MUTATION = "Object{spec: Object.spec{suspend: true}}"


def _mutating(
    name: str,
    match: dict[str, Any],
    mutations: list[dict[str, Any]],
    *,
    conditions: list[dict[str, str]] | None = None,
    variables: list[dict[str, str]] | None = None,
    reinvocation: str = "Never",
) -> list[Obj]:
    """A MutatingAdmissionPolicy (failing closed) and its binding."""
    spec: dict[str, Any] = {"matchConstraints": match}
    if conditions is not None:
        spec["matchConditions"] = conditions
    if variables is not None:
        spec["variables"] = variables
    spec |= {"mutations": mutations, "failurePolicy": "Fail", "reinvocationPolicy": reinvocation}
    kind = "MutatingAdmissionPolicy"
    return [_policy(name, kind, spec), _binding(name, kind)]


def _scheduler_variable(scheduler_name: str) -> dict[str, str]:
    """The scheduler Muster gives its pods ('' leaves them to kube-scheduler): the one place
    the name is written, so the chart can template it (`chart_template`)."""
    return {"name": "scheduler", "expression": _cel(scheduler_name)}


def _add(path: str, value: str) -> str:
    """CEL: a JSON patch "add" operation (both arguments are CEL expressions)."""
    return f"JSONPatch{{op: 'add', path: {path}, value: {value}}}"


def _apply(expression: str) -> dict[str, Any]:
    return {"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": expression}}


def _job_mutations() -> list[dict[str, Any]]:
    """What creating a Job in a queue sets, as one JSON patch."""
    # A JSON patch, not an apply configuration: the apiserver applies it without a typed
    # merge of the whole Job (0.45 ms per create in all, `controller_bench --baseline`).
    # Each operation is there only where its condition holds, so a plain Job gets suspend
    # and schedulerName and nothing else; "add" replaces a member that is already there.
    template = "object.spec.template"
    pod_spec = f"{template}.spec"
    gate = f"{{'name': {_cel(ADMISSION_GATE)}}}"
    has_gate = (
        f"has({pod_spec}.schedulingGates)"
        f" && {pod_spec}.schedulingGates.exists(g, g.name == {_cel(ADMISSION_GATE)})"
    )
    pod_label = f"{{{_cel(ELASTIC_POD_LABEL)}: 'true'}}"
    add_suspend = _add(_cel("/spec/suspend"), "true")
    add_scheduler = _add(_cel("/spec/template/spec/schedulerName"), "variables.scheduler")
    add_metadata = _add(_cel("/spec/template/metadata"), f"{{'labels': {pod_label}}}")
    add_labels = _add(_cel("/spec/template/metadata/labels"), pod_label)
    label_path = (
        f"'/spec/template/metadata/labels/' + jsonpatch.escapeKey({_cel(ELASTIC_POD_LABEL)})"
    )
    add_label = _add(label_path, "'true'")
    append_gate = _add(_cel("/spec/template/spec/schedulingGates/-"), gate)
    add_gates = _add(_cel("/spec/template/spec/schedulingGates"), f"[{gate}]")
    job_patch = (
        f"[{add_suspend}]"
        f" + (variables.scheduler != '' && ({_unset_scheduler(pod_spec)}) ? [{add_scheduler}] : [])"
        # Elastic: the pod label (into whichever of metadata and labels exists) and the gate.
        f" + (!variables.elastic ? [] : !has({template}.metadata) ? [{add_metadata}]"
        f" : !has({template}.metadata.labels) ? [{add_labels}] : [{add_label}])"
        f" + (!variables.elastic || ({has_gate}) ? []"
        f" : has({pod_spec}.schedulingGates) ? [{append_gate}] : [{add_gates}])"
    )
    return [{"patchType": "JSONPatch", "jsonPatch": {"expression": job_patch}}]


def _job_policy(
    name: str, selector: dict[str, Any], condition: dict[str, str], scheduler_name: str
) -> list[Obj]:
    """The mutating policy of the Jobs `condition` puts in a queue, and its binding."""
    return _mutating(
        name,
        _match(_kind_rules(Admission.BATCH_JOB), ["CREATE"], selector),
        _job_mutations(),
        conditions=[condition],
        variables=[
            _scheduler_variable(scheduler_name),
            {
                "name": "elastic",
                "expression": f"({_annotation('object', ELASTIC_ANNOTATION)})"
                ".lowerAscii() == 'true'",
            },
        ],
        # Another mutation after ours (a second policy or webhook) may reset what we set.
        reinvocation="IfNeeded",
    )


def _child(obj: str) -> str:
    """CEL: `framework.child_of_managed_kind`."""
    names = ", ".join(_cel(k.name) for k in workload_kinds.KINDS)
    return (
        f"has({obj}.metadata.ownerReferences) && {obj}.metadata.ownerReferences.exists(r,"
        f" has(r.controller) && r.controller && (r.apiVersion + '/' + r.kind) in [{names}])"
    )


def _queued(obj: str) -> str:
    """CEL: `framework.queue_of` of a labelled object (not one its owner's queueing covers)."""
    return f"({_label(obj, QUEUE_LABEL)}) != '' && !({_child(obj)})"


QUEUE_SET = {"name": "queue-name-set", "expression": _queued("object")}


def mutating_policies(scheduler_name: str = SCHEDULER_NAME) -> list[Obj]:
    """The MutatingAdmissionPolicies and their bindings: what `decisions.mutate_job`,
    `mutate_suspend` and `mutate_pod` do, evaluated by the apiserver."""
    jobs = _job_policy(JOBS_POLICY, LABELLED, QUEUE_SET, scheduler_name)
    # The kinds Muster's generic rule admits (JobSet, TrainJob) with the queue label:
    # created suspended. Their pods reach Muster's scheduler at admission, through the
    # owner label and the pods policy. Every mutating policy needs the kind's schema, which
    # the apiserver reads every 5 s: for a few seconds after a CRD is created, labelled
    # creates of its kind are answered 503 ("Resource kind ... not found"); see
    # `controllers/localcluster/peers.py`, `_wait_admissible`.
    suspend = _mutating(
        SUSPEND_POLICY,
        _match(_kind_rules(Admission.SUSPEND), ["CREATE"], LABELLED),
        [_apply(SUSPEND_MUTATION)],
        conditions=[QUEUE_SET],
    )
    # Pods of admitted objects of those kinds (the owner label Muster put on their
    # templates at admission): to Muster's scheduler. No other pod matches.
    owned = {"matchExpressions": [{"key": OWNER_UID_POD_LABEL, "operator": "Exists"}]}
    pods = _mutating(
        PODS_POLICY,
        _match([POD_RULE], ["CREATE"], owned),
        [
            _apply(
                "variables.scheduler == '' ? Object{}"
                " : Object{spec: Object.spec{schedulerName: variables.scheduler}}"
            )
        ],
        conditions=[{"name": "default-scheduler", "expression": _unset_scheduler("object.spec")}],
        variables=[_scheduler_variable(scheduler_name)],
    )
    return jobs + suspend + pods + owner_policies(scheduler_name)


# Pods queued by their owner (controllers/owners): labelled, of no object Muster queues by
# its uid (whose pods carry one of these labels), naming no foreign PodGroup.
QUEUED_POD = {
    "matchExpressions": [
        {"key": QUEUE_LABEL, "operator": "Exists"},
        *({"key": k, "operator": "DoesNotExist"} for k in POD_OWNER_LABELS),
    ]
}
NO_FOREIGN_GROUP = (
    "!has(object.spec.schedulingGroup) && !(has(object.metadata.annotations) && ["
    + ", ".join(_cel(k) for k in VOLCANO_POD_GROUP_ANNOTATIONS)
    + "].exists(k, k in object.metadata.annotations))"
)


def _template_label(pointer: str) -> str:
    """CEL: the JSON patch that copies the object's queue label into the pod template at
    `pointer` (into whichever of metadata and labels exists)."""
    template = "object" + pointer.replace("/", ".")
    queue = f"object.metadata.labels[{_cel(QUEUE_LABEL)}]"
    labels = f"{{{_cel(QUEUE_LABEL)}: {queue}}}"
    key = f"jsonpatch.escapeKey({_cel(QUEUE_LABEL)})"
    add_metadata = _add(_cel(f"{pointer}/metadata"), f"{{'labels': {labels}}}")
    add_labels = _add(_cel(f"{pointer}/metadata/labels"), labels)
    add_label = _add(f"{_cel(f'{pointer}/metadata/labels/')} + {key}", queue)
    return (
        f"(!has({template}.metadata) ? [{add_metadata}]"
        f" : !has({template}.metadata.labels) ? [{add_labels}] : [{add_label}])"
    )


def owner_policies(scheduler_name: str = SCHEDULER_NAME) -> list[Obj]:
    """The policies of kinds queued by their pods (`decisions.mutate_owner` and
    `mutate_queued_pod`): a labelled Deployment, StatefulSet or LeaderWorkerSet carries its
    queue label into its pod templates; a labelled pod of such an owner (or of any owner) is
    created behind the admission gate, for Muster's scheduler."""
    docs: list[Obj] = []
    for kind in OWNER_KINDS:
        patches = [_template_label(t) for t in kind.templates]
        for pointer in kind.optional:
            template = "object" + pointer.replace("/", ".")
            patches.append(f"(has({template}) ? {_template_label(pointer)} : [])")
        docs += _mutating(
            f"{OWNERS_POLICY}-{kind.resource}",
            _match([dict(kind.rule())], ["CREATE", "UPDATE"], LABELLED),
            [{"patchType": "JSONPatch", "jsonPatch": {"expression": " + ".join(patches)}}],
            conditions=[QUEUE_SET],
        )
    gate = f"{{'name': {_cel(ADMISSION_GATE)}}}"
    has_gate = (
        "has(object.spec.schedulingGates)"
        f" && object.spec.schedulingGates.exists(g, g.name == {_cel(ADMISSION_GATE)})"
    )
    add_scheduler = _add(_cel("/spec/schedulerName"), "variables.scheduler")
    patch = (
        f"(({has_gate}) ? [] : has(object.spec.schedulingGates)"
        f" ? [{_add(_cel('/spec/schedulingGates/-'), gate)}]"
        f" : [{_add(_cel('/spec/schedulingGates'), f'[{gate}]')}])"
        f" + (variables.scheduler != '' && ({_unset_scheduler('object.spec')})"
        f" ? [{add_scheduler}] : [])"
    )
    docs += _mutating(
        QUEUED_PODS_POLICY,
        _match([POD_RULE], ["CREATE"], QUEUED_POD),
        [{"patchType": "JSONPatch", "jsonPatch": {"expression": patch}}],
        conditions=[{"name": "no-foreign-group", "expression": NO_FOREIGN_GROUP}],
        variables=[_scheduler_variable(scheduler_name)],
    )
    return docs


def validating_policies() -> list[Obj]:
    """The ValidatingAdmissionPolicy of labelled Jobs and its binding: `decisions.validate_job`,
    evaluated by the apiserver, with the same words."""
    name = (
        "(has(object.metadata.name) && object.metadata.name != ''"
        " ? object.metadata.name : '(generated)')"
    )
    variables = [
        {"name": "queue", "expression": _label("object", QUEUE_LABEL)},
        {"name": "oldQueue", "expression": _label("oldObject", QUEUE_LABEL)},
        {"name": "job", "expression": f"'Job ' + {name}"},
        {
            "name": "elastic",
            "expression": f"({_annotation('object', ELASTIC_ANNOTATION)}).lowerAscii() == 'true'",
        },
        {
            "name": "oldElastic",
            "expression": f"({_annotation('oldObject', ELASTIC_ANNOTATION)}).lowerAscii()"
            " == 'true'",
        },
        {
            "name": "hasMin",
            "expression": f"has(object.metadata.annotations)"
            f" && {_cel(MIN_PARALLELISM_ANNOTATION)} in object.metadata.annotations",
        },
        {"name": "minimum", "expression": _annotation("object", MIN_PARALLELISM_ANNOTATION)},
        {
            "name": "parallelism",
            "expression": "has(object.spec.parallelism) ? object.spec.parallelism : 1",
        },
        {
            "name": "running",
            "expression": "oldObject != null"
            " && !(has(oldObject.spec.suspend) && oldObject.spec.suspend)",
        },
        {"name": "pods", "expression": _pods_at_once("object")},
        {
            "name": "oldPods",
            "expression": f"oldObject == null ? 0 : ({_pods_at_once('oldObject')})",
        },
    ]
    validations = [
        {
            "expression": "!(variables.elastic && variables.hasMin)",
            "messageExpression": "variables.job + ': annotations "
            f"{ELASTIC_ANNOTATION} and {MIN_PARALLELISM_ANNOTATION} cannot be combined: an "
            "elastic Job changes size by scaling its parallelism, while partial admission "
            "fixes the size when the Job is admitted; remove one of the two annotations'",
            "reason": "Invalid",
        },
        {
            # At most 9 digits: int() of a longer one could overflow, and no Job runs that
            # many pods at once anyway.
            "expression": "!variables.hasMin || (variables.minimum.matches('^[0-9]{1,9}$')"
            " && int(variables.minimum) >= 1 && int(variables.minimum) <= variables.parallelism)",
            "messageExpression": f"variables.job + ': annotation {MIN_PARALLELISM_ANNOTATION} "
            "must be a whole number between 1 and spec.parallelism (' "
            "+ string(variables.parallelism) + '), got \"' + variables.minimum + '\"'",
            "reason": "Invalid",
        },
        {
            "expression": "!variables.running || variables.queue == variables.oldQueue",
            "messageExpression": f"variables.job + ': label {QUEUE_LABEL} cannot change while "
            "the Job runs (\"' + variables.oldQueue + '\" -> \"' + variables.queue + '\"); "
            "suspend the Job first'",
            "reason": "Forbidden",
        },
        {
            # Its pods and its Workloads were made for one path or the other (gated pods and
            # slices, or suspension): switching would strand one or the other.
            "expression": "oldObject == null || variables.elastic == variables.oldElastic",
            "messageExpression": f"variables.job + ': annotation {ELASTIC_ANNOTATION} cannot be "
            "added or removed once the Job exists; create a new Job to change it'",
            "reason": "Forbidden",
        },
        {
            "expression": "!variables.running || variables.elastic"
            " || variables.pods <= variables.oldPods",
            "messageExpression": "variables.job + ': spec.parallelism cannot grow while the Job "
            "runs (' + string(variables.oldPods) + ' -> ' + string(variables.pods) + ' pods): "
            "Muster admitted ' + string(variables.oldPods) + ' and never runs more than it "
            f'admitted. Create the Job with annotation {ELASTIC_ANNOTATION}: "true" to resize '
            "it while it runs, or delete it and create it again at the new size'",
            "reason": "Forbidden",
        },
    ]
    policy = _policy(
        JOBS_POLICY,
        "ValidatingAdmissionPolicy",
        {
            "matchConstraints": _match(
                _kind_rules(Admission.BATCH_JOB), ["CREATE", "UPDATE"], LABELLED
            ),
            # Labelled now or before (a label removed from a running Job is refused).
            "matchConditions": [
                {
                    "name": "queue-name-set",
                    "expression": f"({_queued('object')}) || ({_queued('oldObject')})",
                },
                {
                    # A new Job can only break the partial-admission rules: most creates
                    # skip the policy altogether.
                    "name": "update-or-partial-admission",
                    "expression": "request.operation == 'UPDATE' || (has(object.metadata."
                    f"annotations) && {_cel(MIN_PARALLELISM_ANNOTATION)} in "
                    "object.metadata.annotations)",
                },
            ],
            "variables": variables,
            "validations": validations,
            "failurePolicy": "Fail",
        },
    )
    return [
        policy,
        _binding(JOBS_POLICY, "ValidatingAdmissionPolicy", {"validationActions": ["Deny"]}),
    ]


# ------------------------------------------------------------- managed namespaces

MANAGED_JOBS_POLICY = "muster-managed-jobs"
MANAGED_SUSPEND_POLICY = "muster-managed-suspend"
MANAGED_START_POLICY = "muster-managed-start"
MANAGED_PODS_POLICY = "muster-managed-pods"
MANAGED_FLAVORS_POLICY = "muster-managed-flavors"
# In the chart's copy: replaced by the Helm value and the chart's ServiceAccount.
_CHART_NAMESPACES = "CHART-MANAGED-NAMESPACES"
_CHART_CONTROLLER = "CHART-CONTROLLER-USER"


@dataclass(frozen=True)
class Managed:
    """Managed namespaces, as the policies need them."""

    selector: dict[str, Any]  # metav1.LabelSelector of the namespaces, on every binding
    controller: str  # Muster's username: the only one that starts workloads or lifts gates


def _subject(kind: str) -> str:
    """CEL: `decisions._subject` (the namespace from the request: a new object may not
    carry it yet)."""
    name = (
        "(has(object.metadata.name) && object.metadata.name != ''"
        " ? object.metadata.name : '(generated)')"
    )
    return f"{kind} + ' ' + request.namespace + '/' + {name}"


def _in(managed: Managed, docs: list[Obj]) -> list[Obj]:
    """The bindings among `docs` limited to the managed namespaces."""
    for doc in docs:
        if doc["kind"].endswith("Binding"):
            doc["spec"]["matchResources"] = {"namespaceSelector": managed.selector}
    return docs


def _validating(
    name: str,
    match: dict[str, Any],
    variables: list[dict[str, str]],
    validations: list[dict[str, str]],
    binding: dict[str, Any] | None = None,
    param_kind: dict[str, str] | None = None,
) -> list[Obj]:
    spec: dict[str, Any] = {"matchConstraints": match}
    if param_kind is not None:
        spec["paramKind"] = param_kind
    spec |= {"variables": variables, "validations": validations, "failurePolicy": "Fail"}
    kind = "ValidatingAdmissionPolicy"
    extra = {"validationActions": ["Deny"], **(binding or {})}
    return [_policy(name, kind, spec), _binding(name, kind, extra)]


def managed_policies(managed: Managed, scheduler_name: str = SCHEDULER_NAME) -> list[Obj]:
    """The policies of managed namespaces (docs/tenancy.md), bound to them: objects without
    the queue label queued in LocalQueue `default` (`decisions.mutate_job`,
    `mutate_suspend` with `managed`), and `decisions.refuse_start`, `refuse_pod` and
    `refuse_toleration`, with the same words."""
    own = f"({_label('object', QUEUE_LABEL)}) == '' && !({_child('object')})"
    unlabelled = {"name": "unlabelled", "expression": own}
    jobs = _job_policy(MANAGED_JOBS_POLICY, {}, unlabelled, scheduler_name)
    suspend = _mutating(
        MANAGED_SUSPEND_POLICY,
        _match(_kind_rules(Admission.SUSPEND), ["CREATE"], {}),
        [_apply(SUSPEND_MUTATION)],
        conditions=[unlabelled],
    )
    controller = {"name": "controller", "expression": _cel(managed.controller)}
    muster = "request.userInfo.username == variables.controller"
    rule = MANAGED_RULE  # inside a CEL string literal: it holds no quote
    suspended = "has({0}.spec.suspend) && {0}.spec.suspend"
    queue = f"({_label('object', QUEUE_LABEL)})"
    kinds = [dict(k.rule()) for k in workload_kinds.KINDS]
    start = _validating(
        MANAGED_START_POLICY,
        _match(kinds, ["UPDATE"], {}),
        [controller],
        [
            {
                "expression": f"{muster} || ({_child('oldObject')})"
                f" || !({suspended.format('oldObject')}) || ({suspended.format('object')})",
                "messageExpression": f"{_subject('object.kind')} + ': spec.suspend cannot be set"
                f" to false by ' + request.userInfo.username + ': {rule}, and only Muster"
                " starts a workload, once it is admitted under quota in LocalQueue ' + ("
                f"{queue} != '' ? {queue} : {_cel(DEFAULT_LOCAL_QUEUE)})",
                "reason": "Forbidden",
            }
        ],
    )
    controllers = ", ".join(_cel(u) for u in JOB_CONTROLLERS)
    job_controller = f"request.userInfo.username in [{controllers}]"
    owner_labels = ", ".join(_cel(k) for k in POD_OWNER_LABELS)
    gated = (
        "has({0}.spec.schedulingGates)"
        f" && {{0}}.spec.schedulingGates.exists(g, g.name == {_cel(ADMISSION_GATE)})"
    )
    pods = _validating(
        MANAGED_PODS_POLICY,
        _match([POD_RULE], ["CREATE", "UPDATE"], {}),
        [controller],
        [
            {
                "expression": "request.operation != 'CREATE' || !has(object.spec.nodeName)"
                f" || object.spec.nodeName == '' || {_cel(NODES_GROUP)} in request.userInfo.groups",
                "messageExpression": f"{_subject(_cel('Pod'))} + ': spec.nodeName (' +"
                f" object.spec.nodeName + ') cannot be set: {rule}, and a pod reaches a node"
                " only through admission and a scheduler; leave spec.nodeName empty and run"
                " the pod in a Job'",
                "reason": "Forbidden",
            },
            {
                "expression": f"request.operation != 'CREATE' || ({job_controller})"
                f" || !has(object.metadata.labels) || ![{owner_labels}].exists(k,"
                " k in object.metadata.labels)",
                "messageExpression": f"{_subject(_cel('Pod'))} + ': metadata.labels[' +"
                f" [{owner_labels}].filter(k, k in object.metadata.labels)[0] + '] cannot be set"
                f" by ' + request.userInfo.username + ': {rule}, and only the Job controller"
                " labels a pod as a Job\\'s'",
                "reason": "Forbidden",
            },
            {
                "expression": f"request.operation != 'UPDATE' || {muster}"
                f" || !({gated.format('oldObject')}) || ({gated.format('object')})",
                "messageExpression": f"{_subject(_cel('Pod'))} + ': spec.schedulingGates: gate"
                f" {ADMISSION_GATE} cannot be removed by ' + request.userInfo.username + ':"
                f" {rule}, and only Muster lifts it, for the pods admission grants'",
                "reason": "Forbidden",
            },
        ],
    )
    # Evaluated once per ResourceFlavor (every flavor is a parameter; none: nothing to do).
    tolerates = (
        "(!has(o.effect) || o.effect == '' || o.effect == t.effect)"
        " && ((!has(o.key) || o.key == '') ? (has(o.operator) && o.operator == 'Exists')"
        " : (o.key == t.key && ((has(o.operator) && o.operator != '' && o.operator != 'Equal')"
        " || (has(o.value) ? o.value : '') == (has(t.value) ? t.value : ''))))"
    )
    tolerations = "has({0}.spec.tolerations) ? {0}.spec.tolerations : []"
    flavors = _validating(
        MANAGED_FLAVORS_POLICY,
        _match([POD_RULE], ["CREATE", "UPDATE"], {}),
        [
            _scheduler_variable(scheduler_name),
            {"name": "tolerations", "expression": tolerations.format("object")},
            {
                "name": "changed",
                "expression": "request.operation == 'CREATE'"
                f" || ({tolerations.format('oldObject')}) != variables.tolerations",
            },
            {
                "name": "exempt",
                "expression": "variables.scheduler != '' ? has(object.spec.schedulerName)"
                " && object.spec.schedulerName == variables.scheduler"
                f" : {job_controller}",
            },
            {
                "name": "tolerated",
                "expression": "(has(params.spec) && has(params.spec.nodeTaints)"
                " ? params.spec.nodeTaints : [])"
                f".filter(t, variables.tolerations.exists(o, {tolerates})).map(t, t.key)",
            },
        ],
        [
            {
                "expression": "!variables.changed || variables.exempt"
                " || size(variables.tolerated) == 0",
                "messageExpression": f"{_subject(_cel('Pod'))} + ': spec.tolerations tolerate"
                " the taint ' + variables.tolerated[0] + ' of ResourceFlavor ' +"
                f" params.metadata.name + ': {rule}, and only Muster\\'s admission puts a pod"
                " on a flavor\\'s nodes; run it in a Job (queued under quota), without the"
                " toleration'",
                "reason": "Forbidden",
            }
        ],
        binding={"paramRef": {"selector": {}, "parameterNotFoundAction": "Allow"}},
        param_kind={"apiVersion": "muster.dev/v1alpha1", "kind": "ResourceFlavor"},
    )
    return _in(managed, jobs + suspend + start + pods + flavors)


PROBE_POLICY = "muster-probe"
PROBE_LABEL = "muster.dev/admission-probe"
WORKLOAD_RULE = {
    "apiGroups": ["muster.dev"],
    "apiVersions": ["v1alpha1"],
    "resources": ["workloads"],
}


@functools.cache
def _version(managed: bool = False) -> str:
    """A digest of the Job policies as written (the scheduler's name left out), and of those
    of managed namespaces when some are (their selector and Muster's username left out): the
    probe answers with it, so a controller knows the apiserver acts on this version, managed
    namespaces' policies included. (A new selector on the same policies changes only their
    bindings, which the probe does not tell apart.)"""
    docs = mutating_policies(_CHART_SCHEDULER) + validating_policies()
    if managed:
        placeholder = Managed(_CHART_NAMESPACES, _CHART_CONTROLLER)  # type: ignore[arg-type]
        docs += managed_policies(placeholder, _CHART_SCHEDULER)
    return hashlib.sha256(json.dumps(docs, sort_keys=True).encode()).hexdigest()[:12]


def _probe_policies(scheduler_name: str, managed: bool) -> list[Obj]:
    """A policy pair that answers a dry-run Workload labelled `PROBE_LABEL` (never stored):
    the mutating one stamps the version and scheduler into an annotation, the validating
    one refuses it naming what it saw. Registered after the Job policies, it answers only
    once the apiserver's policy caches hold those too (a cache's watch delivers changes in
    order), so a controller can tell when labelled Jobs are really created suspended."""
    probed = {"matchExpressions": [{"key": PROBE_LABEL, "operator": "Exists"}]}
    variables = [
        {"name": "version", "expression": _cel(_version(managed))},
        _scheduler_variable(scheduler_name),
    ]
    stamp = _mutating(
        PROBE_POLICY,
        _match([WORKLOAD_RULE], ["CREATE"], probed),
        [
            _apply(
                "Object{metadata: Object.metadata{annotations: {"
                + _cel(PROBE_LABEL)
                + ": variables.version + '/' + variables.scheduler}}}"
            )
        ],
        variables=variables,
    )
    answer = _policy(
        PROBE_POLICY,
        "ValidatingAdmissionPolicy",
        {
            "matchConstraints": _match([WORKLOAD_RULE], ["CREATE"], probed),
            "variables": variables[:1],
            "validations": [
                {
                    "expression": "false",
                    "messageExpression": "'muster admission policies ' + variables.version"
                    f" + ' stamped ' + ({_annotation('object', PROBE_LABEL)})",
                }
            ],
            "failurePolicy": "Fail",
        },
    )
    return [
        *stamp,
        answer,
        _binding(PROBE_POLICY, "ValidatingAdmissionPolicy", {"validationActions": ["Deny"]}),
    ]


def policies(scheduler_name: str = SCHEDULER_NAME, managed: Managed | None = None) -> list[Obj]:
    """Every policy and binding Muster registers, in the order to create them (a binding
    after its policy, the probe last: it answers once the apiserver holds all the others)."""
    return (
        mutating_policies(scheduler_name)
        + validating_policies()
        + (managed_policies(managed, scheduler_name) if managed is not None else [])
        + _probe_policies(scheduler_name, managed is not None)
    )


def probe_answer(scheduler_name: str, managed: bool = False) -> str:
    """What the probe's refusal says once the apiserver acts on these policies."""
    version = _version(managed)
    return f"muster admission policies {version} stamped {version}/{scheduler_name}"


def wait_active(
    kube: Kube,
    namespace: str,
    scheduler_name: str,
    managed: bool = False,
    timeout: float = 30.0,
) -> bool:
    """Whether the apiserver acts on the policies just registered, probing (dry runs) for up
    to `timeout` seconds: it takes new policies in through a watch, and a Job created before
    it has would not be suspended."""
    body = {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "Workload",
        "metadata": {"generateName": "muster-probe-", "labels": {PROBE_LABEL: "true"}},
        "spec": {"queueName": "muster-probe", "podSets": [{"count": 1}]},
    }
    want = probe_answer(scheduler_name, managed)
    deadline = time.monotonic() + timeout
    while True:
        try:
            kube.create(WORKLOAD, namespace, body, dry_run=True)
            said = "accepted"
        except ApiException as error:
            said = str(error.body or error)
        if want in said:
            return True
        if time.monotonic() >= deadline:
            log.warning(
                "the apiserver does not act on Muster's admission policies yet",
                extra={"timeout_s": timeout, "answer": said[-300:]},
            )
            return False
        time.sleep(0.2)


KINDS: dict[str, Kind] = {
    "MutatingAdmissionPolicy": MUTATING_POLICY,
    "MutatingAdmissionPolicyBinding": MUTATING_POLICY_BINDING,
    "ValidatingAdmissionPolicy": VALIDATING_POLICY,
    "ValidatingAdmissionPolicyBinding": VALIDATING_POLICY_BINDING,
}


def served(kube: Kube) -> bool:
    """Whether the apiserver serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicy
    (Kubernetes 1.36 and later, unless its feature gate is turned off)."""
    return kube.serves(MUTATING_POLICY)


def register(kube: Kube, docs: list[Obj]) -> None:
    """Create or update the policies and bindings (retrying on conflict)."""
    for desired in docs:
        kind = KINDS[desired["kind"]]
        if apply.converge(kube, kind, desired, ("spec",)):
            log.info(
                "registered admission policy",
                extra={"kind": kind.name, "policy": desired["metadata"]["name"]},
            )


def remove_ours(kube: Kube, kind: Kind, name: str) -> bool:
    """Delete a cluster-scoped object of this name if it is Muster's (labelled part-of
    muster); someone else's stays. Whether one was deleted."""
    obj = kube.get(kind, None, name)
    if obj is None or (obj["metadata"].get("labels") or {}).get(PART_OF) != "muster":
        return False
    return apply.delete(kube, kind, obj, unchanged=True)


def unregister(kube: Kube, *, managed_only: bool = False) -> None:
    """Remove every policy and binding of Muster's (bindings first); `managed_only`: those of
    managed namespaces (left by a run that managed some)."""
    every = Managed({}, "")
    docs = managed_policies(every) if managed_only else policies(managed=every)
    for doc in reversed(docs):
        remove_ours(kube, KINDS[doc["kind"]], doc["metadata"]["name"])


def chart_template() -> str:
    """charts/muster/templates/policies.yaml: these policies as Helm renders them, the
    scheduler name from `.Values.schedulerName`, those of managed namespaces (bound to
    `.Values.managedNamespaceSelector`, Muster's username the chart's ServiceAccount's)
    only when some namespace is managed. Regenerate with
    `python -m controllers.webhooks.policies > charts/muster/templates/policies.yaml`;
    tests/unit/test_chart.py checks that the file is current."""

    def body(docs: list[Obj]) -> str:
        text = yaml.safe_dump_all(docs, sort_keys=False, width=1000)
        text = text.replace(_cel(_CHART_SCHEDULER), "'{{ .Values.schedulerName }}'")
        text = text.replace(
            _cel(_CHART_CONTROLLER),
            "'system:serviceaccount:{{ .Release.Namespace }}:"
            '{{ include "muster.serviceAccountName" . }}\'',
        )
        text = text.replace(
            _cel(_version()),
            f'\'{{{{ if include "muster.managed" . }}}}{_version(True)}'
            f"{{{{ else }}}}{_version()}{{{{ end }}}}'",
        )
        text = text.replace(
            f"namespaceSelector: {_CHART_NAMESPACES}",
            "namespaceSelector:\n      {{- toYaml .Values.managedNamespaceSelector | nindent 6 }}",
        )
        labels = f"labels:\n    {PART_OF}: muster\n"
        return text.replace(labels, labels + '    {{- include "muster.labels" . | nindent 4 }}\n')

    # A placeholder YAML scalar where the selector goes (replaced above).
    managed = Managed(_CHART_NAMESPACES, _CHART_CONTROLLER)  # type: ignore[arg-type]
    return (
        "# Generated by `python -m controllers.webhooks.policies` from controllers/webhooks/\n"
        "# policies.py: Job admission evaluated by the apiserver itself (Kubernetes 1.36+).\n"
        '{{- if eq (include "muster.jobAdmission" .) "policies" }}\n'
        + body(policies(_CHART_SCHEDULER))
        + '{{- if include "muster.managed" . }}\n# Managed namespaces (docs/tenancy.md).\n---\n'
        + body(managed_policies(managed, _CHART_SCHEDULER))
        + "{{- end }}\n{{- end }}\n"
    )


if __name__ == "__main__":
    print(chart_template(), end="")
