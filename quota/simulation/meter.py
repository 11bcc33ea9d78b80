"""The usage meter: usage, fair share and demand per queue over simulated time.

Each measure is kept as a step function per queue and integrated exactly, so averages are
time-weighted, and bucketed on the way (the report's timeline and the history store's
samples) without keeping every step.
"""

from __future__ import annotations

from collections.abc import Mapping

from quota.model.resources import FlavorResource
from quota.simulation.results import MEASURES, Bucket, Measure

Vector = dict[FlavorResource, int]
# The plot timeline keeps at most this many buckets, doubling their width as time goes on.
MAX_BUCKETS = 1024


class Meter:
    """Step functions per queue and measure, integrated exactly and bucketed on the way."""

    def __init__(self, names: list[str], sample_interval: float) -> None:
        self.names = names
        self.current: dict[str, dict[Measure, Vector]] = {
            n: {m: {} for m in MEASURES} for n in names
        }
        self.since: dict[tuple[str, Measure], float] = {}
        self.total: dict[str, dict[Measure, dict[FlavorResource, float]]] = {
            n: {m: {} for m in MEASURES} for n in names
        }
        self.sample_interval = sample_interval
        self.samples: list[Bucket] = []
        self._sample_mark = self._marks()
        self.width = 1.0
        self.timeline: list[Bucket] = []
        self._timeline_mark = self._marks()

    def _flush(self, name: str, measure: Measure, t: float) -> None:
        since = self.since.get((name, measure), 0.0)
        if t > since:
            acc = self.total[name][measure]
            for key, value in self.current[name][measure].items():
                if value:
                    acc[key] = acc.get(key, 0.0) + value * (t - since)
        self.since[(name, measure)] = t

    def set(
        self, name: str, measure: Measure, vector: Mapping[FlavorResource, int], t: float
    ) -> None:
        """The measure is `vector` from time `t` on."""
        if self.current[name][measure] != vector:
            self._flush(name, measure, t)
            self.current[name][measure] = dict(vector)

    def add(self, name: str, vector: Mapping[FlavorResource, int], sign: int, t: float) -> None:
        """Usage of `name` changes by sign x vector at time `t`."""
        self._flush(name, "usage", t)
        current = self.current[name]["usage"]
        for key, amount in vector.items():
            current[key] = current.get(key, 0) + sign * amount

    def integrals_at(self, t: float) -> dict[str, dict[Measure, dict[FlavorResource, float]]]:
        """Integrals of every measure over [0, t], for t at or after the last change.

        A pure read: closing a bucket must not move `since`, or a later, earlier-ending
        bucket of the other series would count the same interval twice.
        """
        out: dict[str, dict[Measure, dict[FlavorResource, float]]] = {}
        for name in self.names:
            per: dict[Measure, dict[FlavorResource, float]] = {}
            for measure in MEASURES:
                acc = dict(self.total[name][measure])
                elapsed = t - self.since.get((name, measure), 0.0)
                if elapsed > 0:
                    for key, value in self.current[name][measure].items():
                        if value:
                            acc[key] = acc.get(key, 0.0) + value * elapsed
                per[measure] = acc
            out[name] = per
        return out

    def _marks(self) -> tuple[float, dict[str, dict[Measure, dict[FlavorResource, float]]]]:
        return 0.0, {n: {m: {} for m in MEASURES} for n in self.names}

    def advance(self, t: float) -> None:
        """Close every sample and timeline bucket that ends at or before `t`."""
        while self._sample_mark[0] + self.sample_interval <= t:
            self._sample_mark = self._close(self._sample_mark, self.sample_interval, self.samples)
        while self._timeline_mark[0] + self.width <= t:
            self._timeline_mark = self._close(self._timeline_mark, self.width, self.timeline)
            if len(self.timeline) >= MAX_BUCKETS:
                # MAX_BUCKETS is even and buckets start at 0, so pairs merge exactly and the
                # open bucket starts on a boundary of the doubled width.
                self.timeline = [
                    _merge(a, b)
                    for a, b in zip(self.timeline[0::2], self.timeline[1::2], strict=True)
                ]
                self.width *= 2

    def _close(
        self,
        mark: tuple[float, dict[str, dict[Measure, dict[FlavorResource, float]]]],
        width: float,
        into: list[Bucket],
    ) -> tuple[float, dict[str, dict[Measure, dict[FlavorResource, float]]]]:
        start, before = mark
        end = start + width
        now = self.integrals_at(end)
        values: dict[str, dict[Measure, dict[FlavorResource, float]]] = {}
        for name in self.names:
            per: dict[Measure, dict[FlavorResource, float]] = {}
            for measure in MEASURES:
                old = before[name][measure]
                per[measure] = {
                    key: (amount - old.get(key, 0.0)) / width
                    for key, amount in now[name][measure].items()
                    if amount - old.get(key, 0.0) > 0
                }
            values[name] = per
        into.append(Bucket(start, end, values))
        return end, now

    def finish(self, t: float) -> None:
        """Close the last, partial buckets at `t` (the end of the simulation)."""
        self.advance(t)
        for mark, into in ((self._sample_mark, self.samples), (self._timeline_mark, self.timeline)):
            if t > mark[0]:
                self._close(mark, t - mark[0], into)


def _merge(a: Bucket, b: Bucket) -> Bucket:
    wa, wb = a.end - a.start, b.end - b.start
    values: dict[str, dict[Measure, dict[FlavorResource, float]]] = {}
    for name in a.values.keys() | b.values.keys():
        per: dict[Measure, dict[FlavorResource, float]] = {}
        for measure in MEASURES:
            va = a.values.get(name, {}).get(measure, {})
            vb = b.values.get(name, {}).get(measure, {})
            per[measure] = {
                key: (va.get(key, 0.0) * wa + vb.get(key, 0.0) * wb) / (wa + wb)
                for key in va.keys() | vb.keys()
            }
        values[name] = per
    return Bucket(a.start, b.end, values)
