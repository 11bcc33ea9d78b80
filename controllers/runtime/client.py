"""The Kubernetes API client a Muster process talks through, and the leader's fenced access.

A leader that has lost its Lease must not write: a late admission from a deposed leader can
admit over quota next to what the new leader admits. `FencedKube` is the access every
leader-only component writes through. Before each write attempt (a retry after a conflict is
a new attempt) it asks the elector how long this replica may still lead by its own clock; if
that time is up (or nearly: under `MIN_LEAD_S`) the write is refused with `NotLeaderError`
and never leaves the process.
Otherwise the request gets no more than that time to finish, split over urllib3's own
attempts, so no write is still on its way when the lead runs out. The standby may take over
only `lease_duration - renew_deadline` seconds later, which is the margin for the network.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client, config
from urllib3.util.retry import Retry

from controllers.runtime.resources import Kube

# urllib3 may resend a request whose connection failed (and an idempotent one whose answer
# was lost): one retry hides a stale pooled connection; each attempt must fit in the lead.
RETRIES = 1
ATTEMPTS = RETRIES + 1
# Below this much lead a write is not sent: with a fraction of a second to finish it would
# often time out after the apiserver applied it, and a write whose outcome is unknown is
# worse than one not made (the next leader makes it).
MIN_LEAD_S = 1.0
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class NotLeaderError(RuntimeError):
    """This replica does not lead now by its own clock; the write was not sent."""


def api_client(kubeconfig: str | None, pool_size: int = 64) -> client.ApiClient:
    """An ApiClient from a kubeconfig, else in-cluster config, else the default kubeconfig."""
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
    else:
        try:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except config.ConfigException:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
    # Watches hold a connection each; workers and the admission loop need their own.
    configuration.connection_pool_maxsize = pool_size
    configuration.retries = Retry(total=RETRIES, backoff_factor=0, raise_on_status=False)
    return client.ApiClient(configuration)


class FencedKube(Kube):
    """API access whose writes leave only while `leadership_left()` says this replica leads.

    Reads are not fenced (a stale read decides nothing the write's resourceVersion does not
    check again)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        leadership_left: Callable[[], float],
        *,
        request_timeout: float = 30.0,
    ) -> None:
        super().__init__(api_client, request_timeout=request_timeout)
        self._leadership_left = leadership_left
        self.refused = 0  # writes refused because the lead had run out (for tests and logs)

    def request(self, method: str, path: str, *, timeout: Any = None, **options: Any) -> Any:
        if method in WRITE_METHODS:
            left = self._leadership_left()
            if left < MIN_LEAD_S:
                self.refused += 1
                raise NotLeaderError(
                    f"{method} {path} not sent: this replica does not lead now (its lead has "
                    f"{max(0.0, left):.1f}s left by its own clock, less than the "
                    f"{MIN_LEAD_S:.0f}s a write may take)"
                )
            timeout = min(self._timeout, left / ATTEMPTS)
        return super().request(method, path, timeout=timeout, **options)
