"""Logs as JSON, one object per line, with every `extra` field of a record as a key."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message and every `extra` field."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str) -> None:
    """Send every logger to stderr as JSON at `level`, with noisy libraries quieted."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The client logs every retry of a dropped watch at WARNING; our informer reports those.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    # The history store logs its own "ready" line with the schema revision; APScheduler would
    # log every run of every periodic job.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
