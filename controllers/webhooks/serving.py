"""Serving the admission webhooks: the HTTPS server (in a process of its own), its
certificate, and the registration of the webhook configurations that point the apiserver at
it.

Every replica serves (so a standby answers as soon as the Service routes to it); only the
leader registers the configurations, and removes them on a clean shutdown when it registered
a URL of its own rather than a Service.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controllers.runtime.informer import Informer
from controllers.runtime.resources import SELF_SUBJECT_REVIEW, Kube
from controllers.state.caches import Caches
from controllers.webhooks import configurations, policies
from controllers.webhooks.certs import CertBundle, CertManager
from controllers.webhooks.https import WebhookServer
from controllers.webhooks.process import WebhookProcess
from controllers.webhooks.reviews import WebhookHandlers
from quota.api.names import SCHEDULER_NAME

log = logging.getLogger("muster.controller")


@dataclass(frozen=True)
class WebhookSettings:
    """Where the webhooks are served and how the apiserver reaches them."""

    namespace: str  # of the certificate Secret and the Service
    port: int
    host: str  # the apiserver reaches the server here (no Service); the certificate names it
    bind: str | None
    service: str | None  # a Service in `namespace` fronting the webhooks, in a cluster
    service_port: int
    cert_secret: str
    enabled: bool = True
    # "self": the controller issues and rotates its certificates in `cert_secret`;
    # "external": someone else (cert-manager) does, and the controller only reads them.
    certs: str = "self"
    # Written into the pods of every labelled Job created ("": kube-scheduler places them).
    scheduler_name: str = SCHEDULER_NAME
    # "policies": labelled Jobs are mutated and checked by admission policies the apiserver
    # evaluates (policies.py); "webhooks": by calls to this replica; "auto": policies where
    # the apiserver serves them.
    job_admission: str = "auto"
    # The namespaces Muster manages (metav1.LabelSelector; None: none), docs/tenancy.md.
    managed_namespace_selector: dict[str, Any] | None = None


def whoami(kube: Kube) -> str:
    """This process's username, as the apiserver authenticates it (a SelfSubjectReview)."""
    review = kube.create(
        SELF_SUBJECT_REVIEW,
        None,
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    username = ((review.get("status") or {}).get("userInfo") or {}).get("username")
    if not username:
        raise RuntimeError("the apiserver did not say who this controller is (SelfSubjectReview)")
    return str(username)


def _taints(flavors: Informer) -> list[dict[str, Any]]:
    """Every ResourceFlavor's name and node taints, as the webhook process checks pods."""
    return [
        {
            "metadata": {"name": f["metadata"]["name"]},
            "spec": {"nodeTaints": (f.get("spec") or {}).get("nodeTaints") or []},
        }
        for f in sorted(flavors.objects(), key=lambda f: str(f["metadata"]["name"]))
    ]


class WebhookServing:
    """The webhook server of one replica, with its certificates and configurations."""

    def __init__(
        self,
        kube: Kube,
        options: WebhookSettings,
        caches: Caches,
        is_leader: Callable[[], bool],
    ) -> None:
        self.kube = kube
        self.options = options
        self.caches = caches
        self.is_leader = is_leader
        self.certs: CertManager | None = None
        self.server: WebhookProcess | WebhookServer | None = None
        # Whether the apiserver evaluates Muster's admission policies (asked once).
        self._policies: bool | None = None
        self._username: str | None = None

    def url_base(self) -> str:
        """Where the apiserver reaches this replica's server directly (local clusters)."""
        return f"https://{self.options.host}:{self.server.port if self.server else 0}"

    def register(self) -> None:
        """Create or update the admission policies and webhook configurations (the leader
        does this), in a thread of its own: once this replica's server answers (registered
        earlier, the apiserver's calls would wait on the webhook process's start and could
        time out), and the probe of the policies can take seconds, which the leader's start
        must not wait for."""
        server = self.server

        def when_ready() -> None:
            if (server is None or server.wait_ready()) and self.is_leader():
                self._register()

        threading.Thread(target=when_ready, name="webhook-register", daemon=True).start()

    def _register(self) -> None:
        if not self.options.enabled or self.certs is None or self.certs.current is None:
            return
        service = None
        if self.options.service:
            service = (
                self.options.namespace,
                self.options.service,
                self.options.service_port,
            )
        try:
            by_policies = self._by_policies()
            managed = self._managed()
            if by_policies:
                # Before the webhook configurations, which say "Muster is up": a labelled Job
                # created once they exist is created suspended.
                scheduler = self.options.scheduler_name
                policies.register(self.kube, policies.policies(scheduler, managed))
                if managed is None:
                    policies.unregister(self.kube, managed_only=True)
                policies.wait_active(
                    self.kube, self.options.namespace, scheduler, managed is not None
                )
            else:
                # Told to use the webhooks where policies of an earlier run may remain.
                policies.unregister(self.kube)
            mutating, validating = configurations.configurations(
                self.certs.current.ca_bundle,
                url_base=None if service else self.url_base(),
                service=service,
                policies=by_policies,
                managed=managed,
            )
            configurations.register(self.kube, mutating, validating)
        except Exception:
            log.exception("could not register the admission policies and webhook configurations")

    def _by_policies(self) -> bool:
        """Whether the apiserver evaluates Muster's admission policies for the workload kinds
        and their pods (asked once: a discovery read), leaving the webhooks the queue
        objects alone."""
        if self._policies is None:
            mode = self.options.job_admission
            self._policies = mode == "policies" or (mode == "auto" and policies.served(self.kube))
            if mode == "auto" and not self._policies:
                log.warning(
                    "the apiserver does not serve MutatingAdmissionPolicy "
                    "(Kubernetes before 1.36): Jobs are admitted through the webhooks"
                )
        return self._policies

    def _managed(self) -> policies.Managed | None:
        """The managed namespaces with Muster's own username (asked of the apiserver at
        start: the one identity that may start workloads and lift gates there)."""
        selector = self.options.managed_namespace_selector
        if selector is None or self._username is None:
            return None
        return policies.Managed(selector, self._username)

    def _cert_changed(self, bundle: CertBundle) -> None:
        if self.server is not None:
            self.server.reload(bundle)
        if self.is_leader():
            self.register()

    def _hosts(self) -> list[str]:
        if self.options.service:
            name, ns = self.options.service, self.options.namespace
            return [f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local", name]
        return [self.options.host]

    def queue_warnings(self, obj: Any) -> list[str]:
        """Cross-object problems with a queue object, as admission warnings."""
        kind = obj.get("kind")
        spec = obj.get("spec") or {}
        warnings: list[str] = []
        if kind == "ClusterQueue":
            parent = spec.get("parent")
            if parent and self.caches.cluster_queues.get(parent) is None:
                warnings.append(
                    f"spec.parent {parent!r} does not exist yet: the queue stays inactive "
                    "(ParentNotFound) until it does"
                )
            for flavor in spec.get("flavors") or []:
                if self.caches.flavors.get(flavor.get("name", "")) is None:
                    warnings.append(
                        f"ResourceFlavor {flavor.get('name')!r} does not exist yet: the queue "
                        "stays inactive (FlavorNotFound) until it does"
                    )
        if kind == "LocalQueue":
            target = spec.get("clusterQueue")
            if target and self.caches.cluster_queues.get(target) is None:
                warnings.append(f"ClusterQueue {target!r} does not exist yet")
        return warnings

    def start(self, spawn: Callable[[str, Callable[[], Any]], None], stop: threading.Event) -> None:
        """Make sure of a certificate, start serving, and keep the certificate fresh."""
        self.certs = CertManager(
            self.kube,
            self.options.namespace,
            self.options.cert_secret,
            self._hosts(),
            managed=self.options.certs == "self",
        )
        bind = self.options.bind or ("0.0.0.0" if self.options.service else self.options.host)
        if self.options.managed_namespace_selector is not None:
            self._username = whoami(self.kube)
        if self._by_policies():
            # Only the queue objects' webhook is called (`configurations.configurations`):
            # a review when an admin edits a queue. It is served here, not by a second
            # interpreter that would hold 93 MiB for it.
            handlers = WebhookHandlers(
                self.queue_warnings,
                scheduler_name=self.options.scheduler_name,
                controller_user=self._username or "",
            )
            self.server = WebhookServer(bind, self.options.port, handlers)
        else:
            # Every labelled Job and pod is reviewed: in a process of its own, so that a
            # busy controller never delays a review (process.py).
            self.server = WebhookProcess(
                bind,
                self.options.port,
                scheduler_name=self.options.scheduler_name,
                queue_warnings=self.queue_warnings,
                controller_user=self._username or "",
            )
        if self.options.managed_namespace_selector is not None:
            server = self.server
            flavors = self.caches.flavors
            # Pods of managed namespaces are checked against every flavor's taints.
            flavors.add_handler(lambda kind, old, new: server.send_flavors(_taints(flavors)))
        self.certs.on_change(self._cert_changed)
        self.certs.ensure()
        self.server.start()
        certs = self.certs
        spawn("certs", lambda: certs.run(stop))

    def stop(self, registered: bool) -> None:
        """Stop serving; remove the URL configurations this replica `registered`."""
        if self.server is None:
            return
        if registered and not self.options.service:
            try:
                # The admission policies stay: they need no controller, and a labelled Job
                # created while none runs is created suspended and waits for the next one.
                configurations.unregister(self.kube, self.url_base())
            except Exception:
                log.exception("could not remove the webhook configurations")
        self.server.stop()
