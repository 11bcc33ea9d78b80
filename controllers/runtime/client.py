"""The Kubernetes API client a Muster process talks through."""

from __future__ import annotations

from kubernetes import client, config


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
    return client.ApiClient(configuration)
