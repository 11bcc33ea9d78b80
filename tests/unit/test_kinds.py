"""Every workload kind is declared once, in its module, and everything else that names kinds
is derived from that: the Workload owner index, the webhook configurations, the admission
policies and the chart's RBAC and webhook rules."""

from __future__ import annotations

from typing import Any

from controllers.jobs.framework import Admission, owner_of
from controllers.jobs.kinds import KINDS, chart_template, rbac_rules
from controllers.state import workloads as wls
from controllers.webhooks import policies
from controllers.webhooks.configurations import configurations
from tests.unit.test_chart import CHART


def _rules(docs: list[dict[str, Any]], key: str) -> list[tuple[str, str]]:
    """(group, resource) of every rule in webhooks (`key` "rules") or policies."""
    out = []
    for doc in docs:
        for item in doc.get("webhooks") or [doc.get("spec") or {}]:
            rules = (
                item.get(key)
                if key == "rules"
                else (item.get("matchConstraints") or {}).get("resourceRules")
            )
            for rule in rules or []:
                out += [(g, r) for g in rule["apiGroups"] for r in rule["resources"]]
    return out


def test_every_kind_is_admitted_by_the_webhooks_and_the_policies_it_declares() -> None:
    mutating, validating = configurations(b"CA", url_base="https://x:1", policies=False)
    assert mutating is not None
    by_webhook = {
        w["name"]: _rules([{"webhooks": [w]}], "rules")
        for w in mutating["webhooks"] + validating["webhooks"]
    }
    by_policy = {
        d["metadata"]["name"]: _rules([d], "policy")
        for d in policies.mutating_policies()
        if d["kind"] == "MutatingAdmissionPolicy"
    }
    for kind in KINDS:
        [group], [resource] = kind.rule()["apiGroups"], kind.rule()["resources"]
        webhook, policy = (
            ("mjob.muster.dev", policies.JOBS_POLICY)
            if kind.admission is Admission.BATCH_JOB
            else ("msuspend.muster.dev", policies.SUSPEND_POLICY)
        )
        assert (group, resource) in by_webhook[webhook], kind.name
        assert (group, resource) in by_policy[policy], kind.name
        if kind.admission is Admission.BATCH_JOB:  # its updates are validated too
            assert (group, resource) in by_webhook["vjob.muster.dev"], kind.name
        others = [n for n in by_webhook if n not in (webhook, "vjob.muster.dev")]
        assert all((group, resource) not in by_webhook[n] for n in others), kind.name


def test_every_kind_may_be_read_patched_and_own_workloads_in_the_chart() -> None:
    granted = {
        (g, r, v)
        for rule in rbac_rules()
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    for kind in KINDS:
        [group], [resource] = kind.rule()["apiGroups"], kind.rule()["resources"]
        assert {(group, resource, v) for v in ("get", "list", "watch", "patch")} <= granted
        assert (group, f"{resource}/finalizers", "update") in granted
        for read in kind.reads:
            assert (read.group, read.plural, "watch") in granted
    assert (CHART / "templates" / "_kinds.tpl").read_text() == chart_template(), (
        "run `python -m controllers.jobs.kinds > charts/muster/templates/_kinds.tpl`"
    )
    rbac = (CHART / "templates" / "rbac.yaml").read_text()
    webhooks = (CHART / "templates" / "webhooks.yaml").read_text()
    assert 'include "muster.kindRbacRules"' in rbac
    assert 'include "muster.suspendWebhookRules"' in webhooks


def test_a_workload_of_any_kind_is_indexed_by_its_owner() -> None:
    for kind in KINDS:
        owner = {"metadata": {"name": "train", "namespace": "ns", "uid": f"uid-{kind.kind.name}"}}
        wl = wls.new_workload("wl", "ns", owner, {}, (kind.api_version, kind.kind.name))
        assert wls.owner_job_uid(wl) == f"uid-{kind.kind.name}"
        assert wls.owner_job_key(wl) == "ns/train"
        assert owner_of(wl) == (kind, "ns/train")
