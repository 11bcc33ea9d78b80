"""`muster controller`: run the controller process (see controllers/manager/ for what it wires).

What the command drives (the manager, the Kubernetes client, the history store) is imported
where it is used, so that naming the command costs `muster --help` nothing (controllers/main.py).
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from quota.api.meta import DNS_SUBDOMAIN
from quota.api.names import SCHEDULER_NAME

if TYPE_CHECKING:
    from controllers.history.store import HistorySettings


def scheduler_name_option(value: str) -> str:
    """The --scheduler-name value, checked as the apiserver checks spec.schedulerName."""
    name = value.strip()
    if name and (len(name) > 253 or not re.fullmatch(DNS_SUBDOMAIN, name)):
        raise click.UsageError(
            f"--scheduler-name {value!r}: a pod's schedulerName must be a DNS subdomain "
            "(lowercase letters, digits, '-' and '.', at most 253 characters), or empty to "
            "leave pods to kube-scheduler"
        )
    return name


def managed_namespaces_option(value: str) -> dict[str, Any] | None:
    """The --managed-namespace-selector value as a LabelSelector (None: unset)."""
    from controllers.manager.namespaces import parse_selector

    try:
        return parse_selector(value)
    except ValueError as error:
        raise click.UsageError(f"--managed-namespace-selector {value!r}: {error}") from None


def history_options(
    *,
    enabled: bool,
    url: str | None,
    spool_dir: Path | None,
    usage_fairness: bool,
    window: str,
    half_life: str,
    k: float,
) -> HistorySettings | None:
    """The history settings from the command line; UsageError names the flag at fault."""
    from controllers.history.engine import DatabaseURLError, database_url
    from controllers.history.queries import parse_duration
    from controllers.history.store import HistorySettings
    from controllers.history.usage import FairnessSettings

    if not enabled:
        if usage_fairness:
            raise click.UsageError(
                "--usage-fairness needs the history store (it reads past usage from it); "
                "drop --no-history"
            )
        return None
    try:
        fairness = FairnessSettings(
            enabled=usage_fairness,
            window=parse_duration(window, option="--usage-fairness-window"),
            half_life=parse_duration(half_life, option="--usage-fairness-half-life"),
            k=k,
        )
        return HistorySettings(url=database_url(url), spool_dir=spool_dir, fairness=fairness)
    except (DatabaseURLError, ValueError) as error:
        raise click.UsageError(str(error)) from None


def lease_timing(lease_duration: float, renew_deadline: float, retry_period: float) -> None:
    """Refuse lease timings under which the leader could never act, or two could at once."""
    from controllers.runtime.client import MIN_LEAD_S

    if not 0 < retry_period < renew_deadline < lease_duration:
        raise click.BadParameter(
            f"need 0 < --retry-period ({retry_period:g}) < --renew-deadline "
            f"({renew_deadline:g}) < --lease-duration ({lease_duration:g}): a leader retries "
            "its renewal before its deadline, and gives up before a standby may take over",
            param_hint="--renew-deadline",
        )
    # Every leader-only write needs MIN_LEAD_S of lead left when it is sent; a renewal
    # resets the lead to the renew deadline, so a deadline at or under it leaves none.
    if renew_deadline <= MIN_LEAD_S + retry_period:
        raise click.BadParameter(
            f"--renew-deadline {renew_deadline:g}s leaves no time to write: a write is sent "
            f"only with at least {MIN_LEAD_S:g}s of lead left, and a renewal can come "
            f"--retry-period ({retry_period:g}s) late; give more than "
            f"{MIN_LEAD_S + retry_period:g}s",
            param_hint="--renew-deadline",
        )


@click.command("controller")
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    default=None,
    help="Kubeconfig to use; in-cluster config when omitted.",
)
@click.option(
    "--namespace",
    default="muster-system",
    show_default=True,
    help="Namespace of the leader-election Lease and the webhook certificate Secret.",
)
@click.option(
    "--webhook-port",
    type=int,
    default=9443,
    show_default=True,
    help="Port the webhook server listens on (0: any free port).",
)
@click.option(
    "--webhook-host",
    default="127.0.0.1",
    show_default=True,
    help="Host the apiserver reaches the webhooks at (local cluster); the serving "
    "certificate names it.",
)
@click.option(
    "--webhook-bind",
    default=None,
    help="Address to listen on (default: --webhook-host, or 0.0.0.0 with a Service).",
)
@click.option(
    "--webhook-service",
    default=None,
    help="In-cluster: name of the Service in --namespace that fronts the webhooks; "
    "the configurations then use a service reference instead of a URL.",
)
@click.option("--webhook-service-port", type=int, default=443, show_default=True)
@click.option(
    "--webhook-certs",
    type=click.Choice(["self", "external"]),
    default="self",
    show_default=True,
    help="self: the controller issues and rotates its own CA and serving certificate in the "
    "Secret muster-webhook-tls; external: cert-manager (or you) keeps tls.crt, tls.key and "
    "ca.crt in that Secret, and the controller only reads it.",
)
@click.option(
    "--job-admission",
    type=click.Choice(["auto", "policies", "webhooks"]),
    default="auto",
    show_default=True,
    help="How labelled Jobs (and JobSets, TrainJobs, their pods) are created suspended and "
    "checked: policies: admission policies the apiserver evaluates itself (Kubernetes 1.36 "
    "and later; nothing leaves the apiserver); webhooks: calls to this controller; auto: "
    "policies where the apiserver serves MutatingAdmissionPolicy.",
)
@click.option(
    "--webhooks/--no-webhooks",
    default=True,
    show_default=True,
    help="Serve and register the admission webhooks.",
)
@click.option(
    "--leader-elect/--no-leader-elect",
    default=True,
    show_default=True,
    help="Elect a leader on a Lease so that only one replica acts.",
)
@click.option("--lease-name", default="muster-controller", show_default=True)
@click.option("--lease-duration", type=float, default=15.0, show_default=True)
@click.option("--renew-deadline", type=float, default=10.0, show_default=True)
@click.option("--retry-period", type=float, default=2.0, show_default=True)
@click.option("--identity", default=None, help="Leader-election identity (default: host_random).")
@click.option(
    "--workers",
    type=int,
    default=16,
    show_default=True,
    help="Job reconciler threads (each waits on the apiserver for its writes).",
)
@click.option(
    "--status-interval",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds between status writes to one queue or pending Workload.",
)
@click.option(
    "--status-max-interval",
    type=float,
    default=1.0,
    show_default=True,
    help="While a queue's or Workload's status keeps changing, the gap between its writes "
    "doubles up to this many seconds.",
)
@click.option(
    "--events/--no-events",
    default=True,
    show_default=True,
    help="Write Kubernetes Events on Jobs and Workloads.",
)
@click.option(
    "--database-url",
    "database_url_flag",
    metavar="URL",
    default=None,
    help="History store: postgresql+psycopg://... or sqlite:///PATH (default: "
    "$MUSTER_DATABASE_URL, else ~/.local/share/muster/history.db).",
)
@click.option(
    "--history/--no-history",
    default=True,
    show_default=True,
    help="Record transitions, preemptions and queue usage in the history store.",
)
@click.option(
    "--history-spool-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The write-ahead log of history records (each is on disk there before it counts as "
    "recorded; replayed on start); one per replica, on a volume that outlives the process "
    "(default: /var/lib/muster/spool/ in a pod, else under ~/.local/share/muster/"
    "history-spool/, a free one per replica).",
)
@click.option(
    "--usage-fairness/--no-usage-fairness",
    default=False,
    show_default=True,
    help="Time-based fair share: recent usage adjusts over-quota weights among siblings.",
)
@click.option(
    "--usage-fairness-window",
    default="7d",
    show_default=True,
    help="How far back usage counts (90m, 24h, 7d, 2w).",
)
@click.option(
    "--usage-fairness-half-life",
    default="1d",
    show_default=True,
    help="Age at which past usage counts half.",
)
@click.option(
    "--usage-fairness-k",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Strength: weight' = max(0, w + k(w - u)); 0 leaves weights as configured.",
)
@click.option(
    "--scheduler-name",
    default=SCHEDULER_NAME,
    show_default=True,
    help="schedulerName given to the pods of queued Jobs and bound by Muster's scheduler "
    "loop, whole groups at a time; an empty string leaves every pod to kube-scheduler.",
)
@click.option(
    "--managed-namespace-selector",
    default="",
    metavar="SELECTOR",
    help="Namespaces (a label selector, as kubectl's -l: 'muster.dev/managed=true', "
    "'team in (a,b)') where Muster manages every workload of a kind it integrates: one "
    "without the queue label joins the namespace's LocalQueue 'default', only Muster starts "
    "workloads, and pods reach a flavor's nodes only through its admission (docs/tenancy.md). "
    "Unset: no namespace is managed.",
)
@click.option(
    "--bind-workers",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Pod bindings in flight at once.",
)
@click.option(
    "--bind-qps",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Pod bindings per second at most, to spare the apiserver (0: no limit beyond "
    "--bind-workers).",
)
@click.option(
    "--preemption-hold-timeout",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="Seconds the room freed for a preemptor stays held for it while its victims "
    "leave; then the hold lapses with a reason and the preemptor is planned again, without "
    "counting on victims that did not go.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    default=8080,
    show_default=True,
    help="Port of /metrics (Prometheus), /healthz and /readyz (0: any free port).",
)
@click.option(
    "--metrics-bind", default="0.0.0.0", show_default=True, help="Address /metrics listens on."
)
@click.option("--log-level", default="info", show_default=True)
def controller(
    kubeconfig: str | None,
    namespace: str,
    webhook_port: int,
    webhook_host: str,
    webhook_bind: str | None,
    webhook_service: str | None,
    webhook_certs: str,
    webhook_service_port: int,
    job_admission: str,
    webhooks: bool,
    leader_elect: bool,
    lease_name: str,
    lease_duration: float,
    renew_deadline: float,
    retry_period: float,
    identity: str | None,
    workers: int,
    status_interval: float,
    status_max_interval: float,
    events: bool,
    database_url_flag: str | None,
    history: bool,
    history_spool_dir: Path | None,
    usage_fairness: bool,
    usage_fairness_window: str,
    usage_fairness_half_life: str,
    usage_fairness_k: float,
    scheduler_name: str,
    managed_namespace_selector: str,
    bind_workers: int,
    bind_qps: float,
    preemption_hold_timeout: float,
    metrics_port: int,
    metrics_bind: str,
    log_level: str,
) -> None:
    """Run the Muster controller: admit queue-labelled Jobs under quota."""
    from controllers.manager.manager import Manager, run_manager
    from controllers.manager.options import Options
    from controllers.runtime.client import api_client
    from controllers.runtime.logs import setup_logging

    scheduler_name = scheduler_name_option(scheduler_name)
    managed = managed_namespaces_option(managed_namespace_selector)
    if leader_elect:
        lease_timing(lease_duration, renew_deadline, retry_period)
    history_settings = history_options(
        enabled=history,
        url=database_url_flag,
        spool_dir=history_spool_dir,
        usage_fairness=usage_fairness,
        window=usage_fairness_window,
        half_life=usage_fairness_half_life,
        k=usage_fairness_k,
    )
    setup_logging(log_level)
    options = Options(
        namespace=namespace,
        webhook_port=webhook_port,
        webhook_host=webhook_host,
        webhook_bind=webhook_bind,
        webhook_service=webhook_service,
        webhook_certs=webhook_certs,
        webhook_service_port=webhook_service_port,
        job_admission=job_admission,
        webhooks=webhooks,
        leader_elect=leader_elect,
        lease_name=lease_name,
        lease_duration=lease_duration,
        renew_deadline=renew_deadline,
        retry_period=retry_period,
        identity=identity or os.environ.get("POD_NAME"),
        workers=workers,
        status_interval=status_interval,
        status_max_interval=status_max_interval,
        events=events,
        history=history_settings,
        scheduler_name=scheduler_name,
        bind_workers=bind_workers,
        bind_qps=bind_qps,
        preemption_hold_timeout=preemption_hold_timeout,
        metrics_port=metrics_port,
        metrics_bind=metrics_bind,
        managed_namespace_selector=managed,
    )
    try:
        manager = Manager(api_client(kubeconfig), options)
    except OSError as error:  # the SQLite file's directory cannot be created
        raise click.ClickException(f"history store: {error}") from None
    code = run_manager(manager)
    # Daemon threads (watches, the webhook server) end with the process.
    time.sleep(0.05)
    sys.exit(code)
