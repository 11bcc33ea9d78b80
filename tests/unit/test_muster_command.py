"""The `muster` command: every command it lists is there under that name, and a command loads
only what it needs (`muster fairshare` does not pay for the Kubernetes client)."""

from __future__ import annotations

import subprocess
import sys

import click
from click.testing import CliRunner

from controllers.main import main


def test_every_listed_command_loads_under_its_name() -> None:
    ctx = click.Context(main)
    names = main.list_commands(ctx)
    assert len(names) == len(set(names)) >= 13
    for name in names:
        command = main.get_command(ctx, name)
        assert command is not None, name
        assert command.name == name


def test_an_unknown_command_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["no-such-command"])
    assert result.exit_code == 2
    assert "No such command 'no-such-command'" in result.output


def _modules_loaded(*args: str) -> set[str]:
    script = (
        "import sys\n"
        "from controllers.main import main\n"
        f"main({list(args)!r}, standalone_mode=False)\n"
        "print(' '.join(sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return set(run.stdout.split("\n")[-2].split())


def test_help_and_the_offline_commands_do_not_load_the_kubernetes_client() -> None:
    for args in (["--help"], ["fairshare", "--help"], ["controller", "--help"], ["up", "--help"]):
        loaded = _modules_loaded(*args)
        assert "kubernetes" not in loaded, args
        assert "controllers.manager.manager" not in loaded, args


def test_a_command_loads_only_its_own_module() -> None:
    loaded = _modules_loaded("fairshare", "--help")
    assert "controllers.cli.fairshare" in loaded
    assert "controllers.cli.history" not in loaded
    assert "alembic" not in loaded
