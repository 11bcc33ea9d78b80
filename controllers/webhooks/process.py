"""The webhook server in a process of its own, so that a busy controller never delays a review
(where the webhooks review every labelled Job and its pods: `serving.py` says when).

Profiled on the local cluster (bench/controller_bench.py): a review took 0.5 ms in the
handler but ~130-360 ms as the apiserver saw it when the server ran in the controller's
process, and ~27 ms when the same server ran alone. The difference is the controller's
interpreter: every step of a review (read, parse, answer, write) must win the GIL back from
the informers, the reconcilers and the admission loop, and a full cyclic collection of the
caches stops every thread for up to a second. In a process of its own the server has an
interpreter to itself.

The controller binds the listening socket (so the port is known, and an error is its own)
and passes it to the child, which accepts on it and answers Job reviews by itself (they
depend on the object alone). What depends on the controller's state comes from the
controller over a control socket: the queue objects' cross-object warnings are asked of
its caches, and the certificates are sent to the child whenever they rotate. The child
reports each review's path, status and latency back, in batches, for the metrics. If the
child dies the controller starts another on the same socket; if the controller dies the
child sees its control socket close and exits.

Control messages are JSON lines:
- controller -> child: `{"certs": {"cert": PEM, "key": PEM}}`, `{"id": N, "warnings": [...]}`,
  `{"flavors": [RESOURCEFLAVOR, ...]}` (managed namespaces: the taints pods are checked against)
- child -> controller: `{"ready": true}`, `{"id": N, "ask": OBJECT}`,
  `{"observed": [[path, status, seconds], ...]}`
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from controllers.metrics import definitions as metrics
from controllers.webhooks.certs import CertBundle, KeyPair
from controllers.webhooks.https import KEEP_LATENCIES, WebhookServer, listening_socket
from controllers.webhooks.reviews import WebhookHandlers

log = logging.getLogger(__name__)

# How long a queue object's review waits for the controller's warnings (they are advice:
# the review is answered without them rather than held up).
ASK_TIMEOUT_S = 2.0
# How often the child sends the latencies it measured.
REPORT_INTERVAL_S = 0.25


class _Lines:
    """JSON lines over a stream socket, written from any thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._reader = sock.makefile("rb")
        self._lock = threading.Lock()

    def send(self, message: Mapping[str, Any]) -> None:
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            self.sock.sendall(data)

    def receive(self) -> dict[str, Any] | None:
        """The next message; None once the other end has closed."""
        line = self._reader.readline()
        if not line:
            return None
        message: dict[str, Any] = json.loads(line)
        return message

    def close(self) -> None:
        """Close both ways; a thread blocked in `receive` gets None. (The reader is left to
        that thread: closing it here would wait on the lock its pending read holds.)"""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class WebhookProcess:
    """The controller's side: the listening socket, the child process, and its requests.

    The same surface as `WebhookServer` (`reload`, `start`, `stop`, `port`)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        scheduler_name: str,
        queue_warnings: Callable[[Mapping[str, Any]], list[str]] | None = None,
        controller_user: str = "",
    ) -> None:
        self.bind_host = host
        self.scheduler_name = scheduler_name
        self.controller_user = controller_user
        self._flavors: Sequence[Mapping[str, Any]] = []
        self.queue_warnings = queue_warnings
        self._listener = listening_socket(host, port)
        self.port: int = self._listener.getsockname()[1]
        self._serving: KeyPair | None = None
        self._child: subprocess.Popen[bytes] | None = None
        self._control: _Lines | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._latencies: deque[float] = deque(maxlen=KEEP_LATENCIES)
        self.restarts = 0

    # ------------------------------------------------------------------ surface
    def reload(self, bundle: CertBundle) -> None:
        """Serve this certificate from now on (the child gets it at once if it runs)."""
        with self._lock:
            self._serving = bundle.serving
            control = self._control
        if control is not None:
            self._send_certs(control, bundle.serving)

    def send_flavors(self, flavors: Sequence[Mapping[str, Any]]) -> None:
        """The ResourceFlavors now (their names and taints), for the checks of managed
        namespaces; a child started later gets them too."""
        with self._lock:
            self._flavors = flavors
            control = self._control
        if control is not None:
            self._send(control, {"flavors": list(flavors)})

    def _send(self, control: _Lines, message: Mapping[str, Any]) -> None:
        try:
            control.send(message)
        except OSError as error:
            # The child is gone; the supervisor starts another, which gets the news.
            log.warning("could not tell the webhook process: %s", error)

    def start(self) -> None:
        """Start the child and return; it serves once its imports are done (seconds on a busy
        machine). The socket listens already: until then, connections wait in its backlog
        rather than being refused."""
        assert self._serving is not None, "reload() with certificates before start()"
        self._spawn()
        self._thread = threading.Thread(target=self._supervise, name="webhook-process", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until a child serves; False on timeout."""
        return self._ready.wait(timeout)

    def stop(self) -> None:
        """Stop the child (closing its control socket tells it to exit) and stop listening."""
        self._stopping.set()
        with self._lock:
            control, child = self._control, self._child
        if control is not None:
            control.close()
        if child is not None:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._listener.close()

    @property
    def pid(self) -> int | None:
        """The child's process id (None before it starts)."""
        return self._child.pid if self._child is not None else None

    def latencies(self) -> list[float]:
        """Seconds each recent review took, from its request line to its answer written."""
        return list(self._latencies)

    # ---------------------------------------------------------------- the child
    def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        fd = self._listener.fileno()
        argv = [
            sys.executable,
            "-m",
            "controllers.webhooks.process",
            "--listen-fd",
            str(fd),
            "--control-fd",
            str(theirs.fileno()),
            "--scheduler-name",
            self.scheduler_name,
            "--controller-user",
            self.controller_user,
            "--log-level",
            logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower(),
        ]
        env = dict(os.environ)
        # The child imports the same code the controller runs, wherever that was found.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        child = subprocess.Popen(argv, pass_fds=(fd, theirs.fileno()), env=env)
        theirs.close()
        control = _Lines(ours)
        with self._lock:
            self._child, self._control = child, control
            serving, flavors = self._serving, self._flavors
        assert serving is not None
        self._send_certs(control, serving)
        if flavors:
            self._send(control, {"flavors": list(flavors)})

    def _send_certs(self, control: _Lines, serving: KeyPair) -> None:
        try:
            control.send(
                {"certs": {"cert": serving.cert_pem.decode(), "key": serving.key_pem.decode()}}
            )
        except OSError as error:
            # The child is gone; the supervisor starts another, which gets the new ones.
            log.warning("could not hand the webhook process its certificate: %s", error)

    def _supervise(self) -> None:
        """Serve the child's requests; start a new child if it dies."""
        while not self._stopping.is_set():
            with self._lock:
                control, child = self._control, self._child
            assert control is not None and child is not None
            try:
                self._serve(control)
            except (OSError, ValueError) as error:
                log.warning("webhook process control channel failed: %s", error)
            if self._stopping.is_set():
                return
            code = child.poll()
            if code is None:
                child.kill()
                code = child.wait()
            log.error("webhook process exited (code %s); starting another", code)
            self.restarts += 1
            control.close()
            time.sleep(0.5)
            if not self._stopping.is_set():
                self._spawn()

    def _serve(self, control: _Lines) -> None:
        while True:
            message = control.receive()
            if message is None:
                return
            if "observed" in message:
                for path, status, seconds in message["observed"]:
                    metrics.webhook(str(path), int(status), float(seconds))
                    self._latencies.append(float(seconds))
            elif "ask" in message:
                warnings: list[str] = []
                if self.queue_warnings is not None:
                    try:
                        warnings = self.queue_warnings(message["ask"])
                    except Exception:
                        log.exception("queue warnings failed")
                control.send({"id": message["id"], "warnings": warnings})
            elif message.get("ready"):
                self._ready.set()
                log.info(
                    "webhook server listening",
                    extra={"port": self.port, "host": self.bind_host, "pid": self.pid},
                )


# --------------------------------------------------------------------- the child's side


class _Child:
    """The webhook process: serves on the inherited socket, asks the controller for what
    only its caches know, and exits when the controller goes away."""

    def __init__(
        self, listen_fd: int, control_fd: int, scheduler_name: str, controller_user: str
    ) -> None:
        self.control = _Lines(socket.socket(fileno=control_fd))
        self.listener = socket.socket(fileno=listen_fd)
        self.handlers = WebhookHandlers(
            self.ask_warnings, scheduler_name=scheduler_name, controller_user=controller_user
        )
        self.server = WebhookServer(
            "",
            0,
            self.handlers,
            sock=self.listener,
            observe=self.observe,
        )
        self._lock = threading.Lock()
        self._observed: list[tuple[str, int, float]] = []
        self._asked: dict[int, tuple[threading.Event, list[list[str]]]] = {}
        self._next_id = 0
        self._started = False

    def observe(self, path: str, status: int, seconds: float) -> None:
        with self._lock:
            self._observed.append((path, status, seconds))

    def ask_warnings(self, obj: Mapping[str, Any]) -> list[str]:
        """The controller's cross-object warnings for a queue object (none if it is slow)."""
        done = threading.Event()
        answer: list[list[str]] = []
        with self._lock:
            self._next_id += 1
            ident = self._next_id
            self._asked[ident] = (done, answer)
        try:
            self.control.send({"id": ident, "ask": obj})
            done.wait(ASK_TIMEOUT_S)
        except OSError:
            pass
        finally:
            with self._lock:
                self._asked.pop(ident, None)
        return answer[0] if answer else []

    def _report(self) -> None:
        while True:
            time.sleep(REPORT_INTERVAL_S)
            with self._lock:
                batch, self._observed = self._observed, []
            if batch:
                try:
                    self.control.send({"observed": batch})
                except OSError:
                    return

    def run(self) -> None:
        threading.Thread(target=self._report, name="report", daemon=True).start()
        while True:
            message = self.control.receive()
            if message is None:
                return  # the controller is gone (or stopping): so is its webhook server
            if "certs" in message:
                pair = KeyPair(message["certs"]["cert"].encode(), message["certs"]["key"].encode())
                self.server.reload_serving(pair)
                if not self._started:
                    self.server.start()
                    self._started = True
                    self.control.send({"ready": True})
            elif "flavors" in message:
                self.handlers.flavors = list(message["flavors"])
            elif "id" in message:
                with self._lock:
                    waiting = self._asked.get(message["id"])
                if waiting is not None:
                    waiting[1].append([str(w) for w in message.get("warnings") or []])
                    waiting[0].set()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Muster's webhook server process")
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--scheduler-name", default="")
    parser.add_argument("--controller-user", default="")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    from controllers.runtime.logs import setup_logging

    setup_logging(args.log_level)
    _Child(args.listen_fd, args.control_fd, args.scheduler_name, args.controller_user).run()
    # Daemon threads may be mid-review; the controller is gone, so nobody waits for them.
    os._exit(0)


if __name__ == "__main__":
    main()
