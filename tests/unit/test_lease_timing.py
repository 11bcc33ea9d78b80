"""`muster controller` refuses lease timings under which a leader could never write."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from controllers.cli.controller import controller


@pytest.mark.parametrize(
    ("flags", "rule"),
    [
        (["--renew-deadline", "1"], "< --renew-deadline (1) <"),
        (["--renew-deadline", "20"], "< --lease-duration (15)"),
        (["--retry-period", "0"], "0 < --retry-period (0)"),
        # A renewal can be a retry period late and a write needs 1 s of lead: 3 s leaves none.
        (["--renew-deadline", "3", "--retry-period", "2"], "give more than 3s"),
    ],
)
def test_lease_timings_that_leave_no_room_to_write_are_refused(flags: list[str], rule: str) -> None:
    result = CliRunner().invoke(controller, flags)
    assert result.exit_code == 2, result.output
    assert "--renew-deadline" in result.output and rule in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
