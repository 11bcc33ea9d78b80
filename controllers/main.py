"""The `muster` command: one click group over every front end.

It sits above the packages whose commands it names: `up/` (whose command lives beside what it
drives) borrows from `cli/`, and `plugin/` reuses `cli/`'s history questions, so a group
inside `cli/` that named `up`'s commands would close a loop between them.

A command's module is imported when the command is asked for, by a plain `from ... import`
the import check and mypy see: `muster fairshare` then loads what fair share needs, not the
history store's migrations or the other commands. `muster --help` imports them all, and the
command modules keep what they drive (the Kubernetes client, the controller) inside the
command, so listing them stays cheap.
"""

from __future__ import annotations

import click


def _command(name: str) -> click.Command | None:
    match name:
        case "admit":
            from controllers.cli.fairshare import admit

            return admit
        case "bench":
            from controllers.cli.bench import bench

            return bench
        case "bench-history":
            from controllers.cli.bench_history import bench_history

            return bench_history
        case "controller":
            from controllers.cli.controller import controller

            return controller
        case "crds":
            from controllers.cli.crds import crds

            return crds
        case "db":
            from controllers.cli.history import db

            return db
        case "down":
            from controllers.up.command import down

            return down
        case "fairshare":
            from controllers.cli.fairshare import fairshare

            return fairshare
        case "history":
            from controllers.cli.history import history

            return history
        case "import":
            from controllers.cli.importer import import_command

            return import_command
        case "local-cluster":
            from controllers.cli.localcluster import local_cluster

            return local_cluster
        case "simulate":
            from controllers.cli.simulate import simulate_command

            return simulate_command
        case "up":
            from controllers.up.command import up

            return up
    return None


# What `muster --help` lists: the names `_command` knows, in the order shown.
_NAMES = (
    "admit",
    "bench",
    "bench-history",
    "controller",
    "crds",
    "db",
    "down",
    "fairshare",
    "history",
    "import",
    "local-cluster",
    "simulate",
    "up",
)


class _Muster(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_NAMES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return _command(cmd_name)


@click.group(cls=_Muster)
@click.version_option(package_name="muster")
def main() -> None:
    """Muster: admission, quota and gang scheduling for shared GPU clusters."""


if __name__ == "__main__":
    main()
