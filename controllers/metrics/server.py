"""The metrics and health endpoint of one replica, on a port of its own (plain HTTP, as
Prometheus and the kubelet's probes expect):

- `/metrics`: Prometheus text format (`definitions.REGISTRY`).
- `/healthz`: liveness. 200 while the process serves requests at all; the kubelet restarts
  a replica that stops answering.
- `/readyz`: readiness. 200 only when every check passes, else 503 with the failing checks,
  one per line, so `kubectl describe pod` says what is missing.
- any other path: 404, so a probe pointed at the wrong path fails instead of passing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from controllers.metrics.definitions import REGISTRY

log = logging.getLogger(__name__)

# A readiness check: None when ready, else why not (one short sentence).
Check = Callable[[], str | None]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    checks: dict[str, Check]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics request", extra={"request": format % args})

    def _answer(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._answer(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._answer(200, b"ok\n")
        elif path == "/readyz":
            failing = failures(self.server.checks)
            if failing:
                self._answer(503, "".join(f"{line}\n" for line in failing).encode())
            else:
                self._answer(200, b"ok\n")
        else:
            self._answer(404, f"404 not found: {path} (try /metrics, /healthz, /readyz)\n".encode())

    do_HEAD = do_GET


def failures(checks: dict[str, Check]) -> list[str]:
    """`name: why` for every check that does not pass (a check that raises does not pass)."""
    out: list[str] = []
    for name, check in checks.items():
        try:
            why = check()
        except Exception as error:
            why = f"check failed: {error}"
        if why:
            out.append(f"{name}: {why}")
    return out


class MetricsServer:
    """Serves the endpoint from a background thread; `port` is known once started."""

    def __init__(self, bind: str, port: int, checks: dict[str, Check]) -> None:
        try:
            self._server = _Server((bind, port), _Handler)
        except OSError as error:
            raise RuntimeError(
                f"cannot serve metrics on {bind}:{port} ({error.strerror or error}); "
                "choose another --metrics-port (0: any free port)"
            ) from None
        self._server.checks = checks
        self.port = int(self._server.server_address[1])
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics", daemon=True
        )
        self._thread.start()
        log.info("metrics server listening", extra={"port": self.port})

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
