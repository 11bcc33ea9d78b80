"""Prometheus metrics of the cluster's components, read as the benchmarks read them: a scrape
is every series' value at one moment; two scrapes give what happened in between (counters
moved, histograms filled)."""

from __future__ import annotations

import ssl
import sys
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from controllers.localcluster.kubectl import kubectl

# A series: the sample's name (with _bucket, _sum, _count, _total) and its labels, sorted.
Series = tuple[str, tuple[tuple[str, str], ...]]
Scrape = dict[Series, float]


def parse(text: str, keep: Callable[[str], bool] = lambda name: True) -> Scrape:
    """Every sample of a /metrics text whose name `keep` accepts."""
    out: Scrape = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if keep(sample.name):
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def fetch(url: str | None, context: ssl.SSLContext | None, keep: Callable[[str], bool]) -> Scrape:
    """Scrape `url` (a warning and nothing when it cannot be read: the figures around it
    still count)."""
    if url is None:
        return {}
    try:
        with urllib.request.urlopen(url, timeout=30, context=context) as response:
            text = response.read().decode()
    except OSError as error:
        print(f"warning: metrics from {url}: {error}", file=sys.stderr)
        return {}
    return parse(text, keep)


def apiserver(kc: str, kubeconfig: str | Path, keep: Callable[[str], bool]) -> Scrape:
    """The apiserver's /metrics through kubectl: any kubeconfig that may read it will do."""
    return parse(kubectl(kc, kubeconfig, "get", "--raw", "/metrics").stdout, keep)


def starting(*prefixes: str) -> Callable[[str], bool]:
    """A `keep` for the samples whose name starts with one of `prefixes`."""
    return lambda name: name.startswith(prefixes)


def series_name(series: Series) -> str:
    """The series as /metrics writes it: name{label="value",...}."""
    name, labels = series
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


def counter_deltas(before: Scrape, after: Scrape) -> dict[str, float]:
    """Counters (and histogram counts) that moved between two scrapes; buckets left out."""
    return {
        series_name(key): round(value - before.get(key, 0.0), 3)
        for key, value in sorted(after.items())
        if not key[0].endswith("_bucket") and value != before.get(key, 0.0)
    }


@dataclass
class Histogram:
    """What a Prometheus histogram recorded between two scrapes."""

    sum: float = 0.0
    count: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)  # cumulative count by bound

    def add(self, other: Histogram) -> Histogram:
        buckets = dict(self.buckets)
        for le, n in other.buckets.items():
            buckets[le] = buckets.get(le, 0.0) + n
        return Histogram(self.sum + other.sum, self.count + other.count, buckets)

    def mean_ms(self) -> float | None:
        return 1000 * self.sum / self.count if self.count else None

    def bound_ms(self, q: float) -> float | None:
        """The upper bound of the bucket the q-quantile falls in (what the histogram can say
        for certain: at most this)."""
        for le in sorted(self.buckets):
            if self.buckets[le] >= q * self.count:
                return 1000 * le
        return None

    def quantile_ms(self, q: float) -> float | None:
        """histogram_quantile: linear within the bucket the rank falls in."""
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, cumulative in sorted(self.buckets.items()):
            if cumulative >= rank:
                if le == float("inf"):
                    return round(1000 * lower, 2)
                inside = cumulative - below
                share = (rank - below) / inside if inside else 1.0
                return round(1000 * (lower + (le - lower) * share), 2)
            lower, below = le, cumulative
        return None


def histograms(
    before: Mapping[Series, float], after: Mapping[Series, float], name: str
) -> dict[tuple[tuple[str, str], ...], Histogram]:
    """Histogram `name` between two scrapes, by label set (without `le`)."""
    out: dict[tuple[tuple[str, str], ...], Histogram] = {}
    for key, value in after.items():
        metric, labels = key
        part = metric.removeprefix(name)
        if metric == part or part not in ("_bucket", "_sum", "_count"):
            continue
        le = dict(labels).get("le")
        group = tuple(kv for kv in labels if kv[0] != "le")
        h = out.setdefault(group, Histogram())
        delta = value - before.get(key, 0.0)
        if part == "_bucket" and le is not None:
            h.buckets[float(le)] = delta  # "+Inf" parses as infinity
        elif part == "_sum":
            h.sum = delta
        elif part == "_count":
            h.count = delta
    return out
