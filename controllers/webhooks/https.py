"""The webhooks' HTTPS server: TLS with certificates that rotate while it serves, kept-alive
connections, one thread per request, each review's time observed; it hands every POSTed
AdmissionReview to `reviews.WebhookHandlers` and answers nothing else."""

from __future__ import annotations

import json
import logging
import socket
import ssl
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from controllers.metrics import definitions as metrics
from controllers.webhooks.certs import CertBundle, KeyPair
from controllers.webhooks.reviews import WebhookHandlers

log = logging.getLogger(__name__)


# Latencies kept for `latencies()` (benchmarks read percentiles from them).
KEEP_LATENCIES = 100_000


class _TLSServer(ThreadingHTTPServer):
    daemon_threads = True
    handlers: WebhookHandlers
    context: ssl.SSLContext
    # Where each request's (path, status, seconds) goes: the metrics registry, or, in the
    # webhook process, the batch sent to the controller (controllers/webhooks/process.py).
    observe: Callable[[str, int, float], None] = staticmethod(metrics.webhook)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = self.socket.accept()
        # Headers and body go out as separate writes; without this, Nagle's algorithm and
        # the client's delayed ACK add ~40 ms to every admission review.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Wrap with the context in force now (certificates rotate); the handshake happens in
        # the request's own thread so a slow client does not hold up accept().
        return self.context.wrap_socket(
            sock, server_side=True, do_handshake_on_connect=False
        ), address

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(10)
            request.do_handshake()
        except (OSError, ssl.SSLError) as error:
            log.debug("TLS handshake failed", extra={"error": str(error)})
            return
        super().finish_request(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _TLSServer
    protocol_version = "HTTP/1.1"
    # The apiserver keeps connections open between reviews: an idle one is closed after
    # this long (the apiserver opens a new one when it needs it).
    timeout = 120
    _started = 0.0

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("webhook request", extra={"request": format % args})

    def parse_request(self) -> bool:
        # The request line has just arrived (the wait before it is a kept-alive connection
        # being idle, not latency): a review's time starts here.
        self._started = time.monotonic()
        return super().parse_request()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        path = self.path.split("?", 1)[0]
        try:
            review = json.loads(self.rfile.read(length) or b"{}")
            answer = self.server.handlers.handle(path, review)
            status = 200
        except Exception as error:
            log.exception("webhook failed")
            answer = {"error": str(error)}
            status = 500
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.server.observe(path, status, time.monotonic() - self._started)

    def do_GET(self) -> None:
        # Health is served by the metrics port (/healthz, /readyz): a probe pointed here by
        # mistake must fail, not pass before anything is ready (issue 16, item 10).
        body = b"404 not found: the webhook server answers POSTed AdmissionReviews only\n"
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serving_context(serving: KeyPair) -> ssl.SSLContext:
    """A TLS server context for the serving certificate and key."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # load_cert_chain reads files; the key never touches disk longer than this call.
    with tempfile.TemporaryDirectory() as tmp:
        cert = Path(tmp) / "tls.crt"
        key = Path(tmp) / "tls.key"
        cert.write_bytes(serving.cert_pem)
        key.write_bytes(serving.key_pem)
        key.chmod(0o600)
        context.load_cert_chain(cert, key)
    return context


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) and listening (port 0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class WebhookServer:
    """HTTPS server for the webhooks, in background threads of this process; `reload` swaps
    certificates. The controller runs it in a process of its own (`process.py`), on a socket
    the controller bound (`sock`), where Jobs and pods are reviewed by it; where only the
    queue objects are, in its own process (`serving.py`), with the surface of
    `WebhookProcess`."""

    def __init__(
        self,
        host: str,
        port: int,
        handlers: WebhookHandlers,
        *,
        sock: socket.socket | None = None,
        observe: Callable[[str, int, float], None] | None = None,
    ) -> None:
        self.bind_host = host
        self.port = port
        self.handlers = handlers
        self._sock = sock
        self._observe = observe
        self._server: _TLSServer | None = None
        self._thread: threading.Thread | None = None
        self._latencies: deque[float] = deque(maxlen=KEEP_LATENCIES)
        self._ready = threading.Event()

    def reload(self, bundle: CertBundle) -> None:
        self.reload_serving(bundle.serving)

    def reload_serving(self, serving: KeyPair) -> None:
        """Serve with this certificate and key from now on (new connections)."""
        context = serving_context(serving)
        if self._server is None:
            sock = self._sock or listening_socket(self.bind_host, self.port)
            server = _TLSServer(sock.getsockname()[:2], _Handler, bind_and_activate=False)
            server.socket.close()
            server.socket = sock
            server.server_address = sock.getsockname()[:2]
            server.handlers = self.handlers
            server.context = context
            server.observe = self._observe or self._observed
            self._server = server
            self.port = server.server_address[1]
        else:
            self._server.context = context
            log.info("webhook certificate reloaded")

    def start(self) -> None:
        assert self._server is not None, "reload() with certificates before start()"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="webhooks", daemon=True
        )
        self._thread.start()
        self._ready.set()
        log.info("webhook server listening", extra={"port": self.port, "host": self.bind_host})

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Whether it serves (once `start` returned, it does)."""
        return self._ready.wait(timeout)

    def send_flavors(self, flavors: Sequence[Mapping[str, Any]]) -> None:
        """The ResourceFlavors now (names and taints), for the checks of managed namespaces."""
        self.handlers.flavors = list(flavors)

    def latencies(self) -> list[float]:
        """Seconds each recent review took, from its request line to its answer written."""
        return list(self._latencies)

    def _observed(self, path: str, status: int, seconds: float) -> None:
        metrics.webhook(path, status, seconds)
        self._latencies.append(seconds)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
