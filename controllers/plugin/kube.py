"""How the plugin reaches the cluster: the user's kubeconfig and context, as kubectl's."""

from __future__ import annotations

from dataclasses import dataclass

import click
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from controllers.runtime.resources import Kind, Kube, Obj


@dataclass
class Target:
    """The --kubeconfig and --context the plugin was given (None: kubectl's defaults)."""

    kubeconfig: str | None = None
    context: str | None = None

    def kube(self) -> Kube:
        configuration = client.Configuration()
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=self.kubeconfig,
                context=self.context,
                client_configuration=configuration,
            )
        except (config.ConfigException, OSError) as error:
            raise click.ClickException(f"cannot load the kubeconfig: {error}") from None
        return Kube(client.ApiClient(configuration), request_timeout=20.0)


class Forbidden(click.ClickException):
    """RBAC refused the request (HTTP 403): a command may show what it can read instead, or
    say which right it needs (`said` is the apiserver's own sentence)."""

    def __init__(self, what: str, said: str) -> None:
        super().__init__(f"{what}: {said} (HTTP 403)")
        self.said = said


def api_error(error: ApiException, what: str) -> click.ClickException:
    """An apiserver refusal as one line naming what was asked."""
    reason = error.reason or ""
    try:
        import json

        reason = json.loads(error.body or "{}").get("message") or reason
    except ValueError:
        pass
    if error.status == 403:
        return Forbidden(what, reason)
    return click.ClickException(f"{what}: {reason} (HTTP {error.status})")


def list_all(kube: Kube, kind: Kind, namespace: str | None = None, **kwargs: str) -> list[Obj]:
    try:
        items, _ = kube.list(kind, namespace, **kwargs)
    except ApiException as error:
        plural = kind.name[:-1] + "ies" if kind.name.endswith("y") else kind.name + "s"
        raise api_error(error, f"listing {plural}") from None
    except Exception as error:  # connection refused, DNS, TLS
        raise click.ClickException(f"cannot reach the cluster: {error}") from None
    return items


def get_one(kube: Kube, kind: Kind, namespace: str | None, name: str) -> Obj | None:
    try:
        return kube.get(kind, namespace, name)
    except ApiException as error:
        raise api_error(error, f"reading {kind.name} {name}") from None
    except Exception as error:
        raise click.ClickException(f"cannot reach the cluster: {error}") from None
