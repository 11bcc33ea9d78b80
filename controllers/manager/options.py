"""What a controller process is told on its command line (see `muster controller --help`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controllers.history.store import HistorySettings
from quota.api.names import SCHEDULER_NAME


@dataclass
class Options:
    """Settings of one controller replica; the defaults are the command line's."""

    namespace: str = "muster-system"
    webhook_port: int = 9443
    webhook_host: str = "127.0.0.1"
    webhook_bind: str | None = None
    webhook_service: str | None = None
    webhook_service_port: int = 443
    webhooks: bool = True
    # "policies", "webhooks" or "auto" (policies where the apiserver serves them).
    job_admission: str = "auto"
    leader_elect: bool = True
    lease_name: str = "muster-controller"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    identity: str | None = None
    workers: int = 16
    status_interval: float = 1.0
    # While an object's status keeps changing, the gap between its writes doubles up to this.
    status_max_interval: float = 1.0
    resync_period: float = 300.0
    cert_secret: str = "muster-webhook-tls"
    # "self" (issued and rotated by the controller) or "external" (e.g. cert-manager's).
    webhook_certs: str = "self"
    events: bool = True
    # None: no history store (unless a recorder is passed to the Manager).
    history: HistorySettings | None = None
    # The schedulerName the webhook gives Muster's pods and the scheduler loop binds;
    # "" leaves every pod to kube-scheduler (no scheduler loop, no PodGroups).
    scheduler_name: str = SCHEDULER_NAME
    bind_workers: int = 16
    # Bindings per second at most (0: only `bind_workers` bounds them).
    bind_qps: float = 0.0
    # Room held for a preemptor while its victims leave lapses after this many seconds.
    preemption_hold_timeout: float = 300.0
    # /metrics, /healthz and /readyz (plain HTTP); port 0 picks a free port, None serves none
    # (`muster controller` serves them on 8080 unless told otherwise).
    metrics_port: int | None = None
    metrics_bind: str = "0.0.0.0"
    # A metav1.LabelSelector of the namespaces where every workload of an integrated kind is
    # queued, labelled or not, and nodes are reachable only through admission (docs/
    # tenancy.md); None: no namespace is managed.
    managed_namespace_selector: dict[str, Any] | None = None
