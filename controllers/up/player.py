"""Plays a Plan's timed actions against the apiserver, in real time, on a thread of its own.

Jobs are created as a user would create them (through Muster's webhook, which suspends them
and points their pods at muster-scheduler); scale events patch an elastic Job's parallelism.
What the apiserver refuses is reported as a line of the live view, never raised: one refused
Job must not stop the rest of the demo.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from kubernetes.client.exceptions import ApiException

from controllers.runtime.resources import JOB, Kube
from controllers.up.plan import Action, Plan

Report = Callable[[str], None]


def _refusal(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or "{}").get("message") or error.reason)
    except ValueError:
        return str(error.reason)


class Player:
    """Carries out `plan.actions` at their times after `start()`; `stop()` ends it early."""

    def __init__(self, kube: Kube, plan: Plan, report: Report) -> None:
        self._kube = kube
        self._plan = plan
        self._report = report
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="muster-up-player", daemon=True)
        self.done = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5.0)

    @property
    def total(self) -> int:
        return len(self._plan.actions)

    def finished(self) -> bool:
        return self.done == self.total

    def _run(self) -> None:
        begin = time.monotonic()
        for action in self._plan.actions:
            if self._stopped.wait(max(0.0, begin + action.at - time.monotonic())):
                return
            self._act(action)
            self.done += 1

    def _act(self, action: Action) -> None:
        try:
            if action.verb == "create":
                assert action.job is not None
                self._kube.create(JOB, action.namespace, dict(action.job))
            else:
                self._kube.patch(
                    JOB,
                    action.namespace,
                    action.name,
                    {"spec": {"parallelism": action.parallelism}},
                )
        except ApiException as error:
            if error.status == 409 and action.verb == "create":
                self._report(f"{action.namespace}/{action.name} exists already: left as it is")
                return
            self._report(f"refused: {action.describe()}: {_refusal(error)}")
            return
        except Exception as error:  # the apiserver unreachable: say so, go on
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            self._report(f"failed: {action.describe()}: {first}")
            return
        self._report(action.describe())
