"""A local cache of one kind of object, kept current by list + watch.

The informer lists every object (paged), then watches from the list's resourceVersion. When
the watch ends it resumes from the last resourceVersion it saw (bookmarks keep that fresh);
when the server says that version is gone (410 Gone, as an HTTP status or as an ERROR event)
it lists again and reports the difference as ordinary events, so handlers never miss a
change nor see one twice.

Writers feed their own results back with `write_through`: the cache keeps whichever version
is newer, so a reconciler reading right after its own write never acts on the state from
before it (that would, for instance, admit a workload twice).

What the cache holds is shared by every thread and changed by none (`frozen.py`): each
object is stored frozen, as its own copy, and replaced whole when a newer version arrives
(from the watch, a relist or a write-through), never changed in place. A reader may keep an
object as long as it likes and deep-copy it at any moment; a writer deep-copies it and
changes the copy (`apply.update` does). Handlers get the frozen objects too.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from controllers.runtime.frozen import freeze_object
from controllers.runtime.resources import Kind, Kube, Obj, object_key

log = logging.getLogger(__name__)

# (event type "ADDED" | "MODIFIED" | "DELETED", old object or None, new object or None)
Handler = Callable[[str, Obj | None, Obj | None], None]
IndexFn = Callable[[Obj], Iterable[str]]


def resource_version(obj: Mapping[str, Any] | None) -> str:
    """metadata.resourceVersion, or "" when absent."""
    if not obj:
        return ""
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def is_newer(candidate: str, current: str) -> bool:
    """Whether resourceVersion `candidate` is at least as new as `current`.

    resourceVersions are etcd revisions, decimal integers that grow with every write; they
    are compared as numbers when both are, and an unparseable one is taken as newer so that
    the watch, the authority, always wins in doubt."""
    if not current:
        return True
    try:
        return int(candidate) >= int(current)
    except ValueError:
        return True


_MAX_TOMBSTONES = 10_000


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _same_life(obj: Mapping[str, Any], tomb: tuple[str, str]) -> bool:
    """Whether `obj` is (a version of) the deleted object `tomb` names, not a new one of the
    same name: the same uid, or without uids, a version no newer than the deletion."""
    uid, deleted_at = tomb
    if uid or _uid(obj):
        return _uid(obj) == uid
    version = resource_version(obj)
    return version == deleted_at or not is_newer(version, deleted_at)


class Informer:
    """List+watch cache of one Kind, with secondary indexes and event handlers."""

    def __init__(
        self,
        kube: Kube,
        kind: Kind,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        indexes: Mapping[str, IndexFn] | None = None,
        watch_timeout: int = 300,
        name: str | None = None,
    ) -> None:
        self.kube = kube
        self.kind = kind
        self.name = name or kind.name
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._index_fns = dict(indexes or {})
        self._watch_timeout = watch_timeout
        self._lock = threading.RLock()
        self._items: dict[str, Obj] = {}
        # key -> (uid, resourceVersion) of objects whose deletion this cache has applied. The
        # response to our own write can arrive after the watch's DELETED event for the same
        # object; without this it would bring the object back as a ghost (holding quota, say)
        # until the next relist. Cleared by a relist (a quorum read); bounded.
        self._tombstones: dict[str, tuple[str, str]] = {}
        self._indexes: dict[str, dict[str, set[str]]] = {n: {} for n in self._index_fns}
        self._handlers: list[Handler] = []
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None
        self.relists = 0
        # time.monotonic() of the last list, event or bookmark: its age is the informer's lag.
        self.last_heard: float | None = None

    # ---------------------------------------------------------------- lifecycle
    def add_handler(self, handler: Handler) -> None:
        """Call `handler` for every change (from the informer's thread; keep it quick)."""
        self._handlers.append(handler)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            # Unblock the reader: shutting the socket down makes the pending read return.
            sock = getattr(getattr(response, "connection", None), "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Block until the first list has been loaded."""
        return self._synced.wait(timeout)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    # ------------------------------------------------------------------- reads
    def get(self, key: str) -> Obj | None:
        """The cached object, frozen (deep-copy it to change it)."""
        with self._lock:
            return self._items.get(key)

    def objects(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    def items(self) -> list[tuple[str, Obj]]:
        """(key, object) pairs: a loop over the cache need not work the keys out again."""
        with self._lock:
            return list(self._items.items())

    def list_keys(self) -> list[str]:
        with self._lock:
            return list(self._items)

    def by_index(self, index: str, value: str) -> list[Obj]:
        """Objects whose index function produced `value`."""
        with self._lock:
            keys = self._indexes[index].get(value, set())
            return [self._items[k] for k in sorted(keys)]

    def index_values(self, index: str) -> list[str]:
        """Every value the index function produced for some cached object."""
        with self._lock:
            return list(self._indexes[index])

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    # ------------------------------------------------------------- own writes
    def write_through(self, obj: Obj) -> None:
        """Record the result of our own write (if it is newer than what the cache holds, and
        not of an object whose deletion the cache has already seen)."""
        with self._lock:
            tomb = self._tombstones.get(object_key(obj))
        if tomb is not None and _same_life(obj, tomb):
            return
        self._apply("MODIFIED", obj)

    def forget(self, key: str) -> None:
        """Record our own delete."""
        with self._lock:
            old = self._items.get(key)
        if old is not None:
            self._apply("DELETED", old)

    # ---------------------------------------------------------------- internals
    def _apply(self, event_type: str, obj: Obj) -> None:
        key = object_key(obj)
        with self._lock:
            old = self._items.get(key)
            if event_type == "DELETED":
                self._tombstones[key] = (_uid(obj), resource_version(obj))
                while len(self._tombstones) > _MAX_TOMBSTONES:
                    del self._tombstones[next(iter(self._tombstones))]
                if old is None:
                    return
                del self._items[key]
                self._unindex(key, old)
                new: Obj | None = None
            else:
                if old is not None and not is_newer(resource_version(obj), resource_version(old)):
                    return
                if old is not None and resource_version(obj) == resource_version(old):
                    return  # our write-through already holds this version
                # A copy of its own that no one can change: the caller keeps `obj`.
                obj = freeze_object(obj)
                self._items[key] = obj
                if old is not None:
                    self._unindex(key, old)
                self._index(key, obj)
                new = obj
                if old is None:
                    event_type = "ADDED"
                elif event_type == "ADDED":
                    event_type = "MODIFIED"
        for handler in self._handlers:
            try:
                handler(event_type, old, new)
            except Exception:
                log.exception("handler failed", extra={"informer": self.name})

    def _index(self, key: str, obj: Obj) -> None:
        for name, fn in self._index_fns.items():
            for value in fn(obj):
                self._indexes[name].setdefault(value, set()).add(key)

    def _unindex(self, key: str, obj: Obj) -> None:
        for name, fn in self._index_fns.items():
            for value in fn(obj):
                bucket = self._indexes[name].get(value)
                if bucket is not None:
                    bucket.discard(key)
                    if not bucket:
                        del self._indexes[name][value]

    def _relist(self) -> str:
        items, rv = self.kube.list(
            self.kind, label_selector=self._label_selector, field_selector=self._field_selector
        )
        fresh = {object_key(o): o for o in items}
        with self._lock:
            gone = [o for k, o in self._items.items() if k not in fresh]
            self._tombstones.clear()
        for obj in gone:
            self._apply("DELETED", obj)
        for obj in items:
            # A list is a quorum read, newer than anything we wrote before it started.
            self._apply("ADDED", obj)
        self.relists += 1
        self.last_heard = time.monotonic()
        self._synced.set()
        return rv

    def _run(self) -> None:
        rv = ""
        failures = 0
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._relist()
                rv = self._watch(rv)
                failures = 0
            except ApiException as error:
                if error.status == 410:
                    log.info("watch expired; relisting", extra={"informer": self.name})
                    rv = ""
                    continue
                failures += 1
                self._pause(failures, error)
            except Exception as error:  # connection reset, timeout, apiserver restart
                if self._stop.is_set():
                    return
                failures += 1
                self._pause(failures, error)

    def _pause(self, failures: int, error: BaseException) -> None:
        delay = min(30.0, 0.2 * 2 ** min(failures, 8))
        log.warning(
            "watch failed; retrying",
            extra={"informer": self.name, "error": str(error)[:300], "retry_in": delay},
        )
        self._stop.wait(delay)

    def _watch(self, rv: str) -> str:
        """Watch from `rv` until the server ends the watch; returns the last version seen,
        or "" when a relist is needed."""
        response, events = self.kube.watch(
            self.kind,
            rv,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            timeout_seconds=self._watch_timeout,
        )
        self._response = response
        try:
            for event in events:
                if self._stop.is_set():
                    break
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        log.info("watch expired; relisting", extra={"informer": self.name})
                        return ""
                    raise RuntimeError(f"watch error: {obj.get('message', obj)}")
                new_rv = resource_version(obj)
                self.last_heard = time.monotonic()
                if kind != "BOOKMARK":
                    self._apply(str(kind), obj)
                if new_rv:
                    rv = new_rv
        finally:
            self._response = None
            with contextlib.suppress(Exception):
                response.release_conn()
        return rv


def wait_all_synced(informers: Iterable[Informer], timeout: float) -> None:
    """Block until every informer has listed once; raise with the names that did not."""
    deadline = time.monotonic() + timeout
    for informer in informers:
        remaining = max(0.0, deadline - time.monotonic())
        if not informer.wait_synced(remaining):
            raise TimeoutError(f"cache of {informer.name} did not sync within {timeout:.0f}s")
