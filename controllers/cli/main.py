"""The `muster` command line: one click group, each sub-command in the module of its concept."""

from __future__ import annotations

import importlib

import click

# Sub-commands live beside the code they drive; they are imported lazily so that
# `muster simulate` does not pay for the Kubernetes client and `muster --help` stays fast.
_COMMANDS: dict[str, tuple[str, str]] = {
    "local-cluster": ("controllers.cli.localcluster", "local_cluster"),
    "controller": ("controllers.cli.controller", "controller"),
    "crds": ("controllers.cli.crds", "crds"),
    "db": ("controllers.cli.history", "db"),
    "history": ("controllers.cli.history", "history"),
    "bench-history": ("controllers.cli.bench_history", "bench_history"),
    "simulate": ("controllers.cli.simulate", "simulate_command"),
    "fairshare": ("controllers.cli.fairshare", "fairshare"),
    "admit": ("controllers.cli.fairshare", "admit"),
    "bench": ("controllers.cli.bench", "bench"),
    "up": ("controllers.up.command", "up"),
    "down": ("controllers.up.command", "down"),
    "import": ("controllers.cli.importer", "import_command"),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(_COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in _COMMANDS:
            module_name, attr = _COMMANDS[cmd_name]
            command: click.Command = getattr(importlib.import_module(module_name), attr)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup)
@click.version_option(package_name="muster")
def main() -> None:
    """Muster: admission, quota and gang scheduling for shared GPU clusters."""


if __name__ == "__main__":
    main()
