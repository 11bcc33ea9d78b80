"""One URL setting picks the history store: flag, then $MUSTER_DATABASE_URL, then SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest

from controllers.history.engine import (
    DatabaseURLError,
    database_url,
    display_url,
    parse_database_url,
)


def test_the_flag_wins_over_the_environment_which_wins_over_the_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("MUSTER_DATABASE_URL", raising=False)
    assert database_url().database == str(tmp_path / "data" / "muster" / "history.db")
    monkeypatch.setenv("MUSTER_DATABASE_URL", "postgresql://u:p@db:5432/history")
    assert database_url().drivername == "postgresql+psycopg"
    assert database_url(str(tmp_path / "x.db")).database == str(tmp_path / "x.db")


def test_urls_are_normalised_and_passwords_never_shown() -> None:
    url = parse_database_url("postgres://muster:s3cret@db.example:5432/history")
    assert url.drivername == "postgresql+psycopg"
    assert "s3cret" not in display_url(url)
    assert parse_database_url("relative.db").database == str(Path("relative.db").absolute())


@pytest.mark.parametrize(
    ("raw", "rule"),
    [
        ("mysql://u@h/db", "scheme 'mysql' is not supported"),
        ("postgresql+psycopg2://u@h/db", "driver 'psycopg2' is not supported"),
        ("postgresql://u@h", "must name a database"),
        ("sqlite://", "must be a file"),
        ("sqlite:///:memory:", "must be a file"),
    ],
)
def test_unusable_urls_get_errors_naming_the_setting_and_rule(raw: str, rule: str) -> None:
    with pytest.raises(DatabaseURLError, match="--database-url") as err:
        database_url(raw)
    assert rule in str(err.value)
