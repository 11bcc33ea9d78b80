"""Resource vectors: exact integer amounts keyed by resource or by (flavor, resource).

Quantities reach the core already parsed into base units (millicores, bytes, devices), so all
arithmetic here is on Python ints and never rounds. Vectors are plain dicts: the admission
cycle touches millions of entries and a wrapper class would cost more than it explains.
A missing key means zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache, lru_cache
from typing import TypeVar

# A quota is always per flavor and resource: ("h100", "nvidia.com/gpu").
FlavorResource = tuple[str, str]

K = TypeVar("K")

CPU = "cpu"
MEMORY = "memory"
_BYTE_RESOURCES = frozenset({MEMORY, "ephemeral-storage", "storage"})
_BINARY_SUFFIXES = (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10))


@cache
def flavor_resource(flavor: str, resource: str) -> FlavorResource:
    """The one key object of the pair (flavor, resource), the same object every time.

    Hot loops look the same few pairs up in many dicts (ledgers, shares, quotas, usage,
    plans): a dict that holds the very object asked for confirms the match by identity, where
    an equal copy is compared item by item on every lookup. A cluster names a handful of
    pairs, so the cache stays small for the life of the process.
    """
    return (flavor, resource)


def interned(vector: Mapping[FlavorResource, int]) -> dict[FlavorResource, int]:
    """`vector` with its keys replaced by the shared ones (see `flavor_resource`)."""
    return {flavor_resource(*key): amount for key, amount in vector.items()}


def add_into(acc: dict[K, int], vector: Mapping[K, int], times: int = 1) -> None:
    """Add `times` x `vector` into `acc` in place (times may be negative)."""
    for key, amount in vector.items():
        acc[key] = acc.get(key, 0) + amount * times


def subtracted(a: Mapping[K, int], b: Mapping[K, int]) -> dict[K, int]:
    """Return a - b (amounts may go negative; callers decide what that means)."""
    out = dict(a)
    add_into(out, b, -1)
    return out


def on_flavors(
    requests: Mapping[str, int], flavors: Mapping[str, str]
) -> dict[FlavorResource, int]:
    """Key resource amounts by the flavor each resource was assigned to.

    Resources without a flavor are left out: they are not managed by any queue.
    """
    out: dict[FlavorResource, int] = {}
    for resource, amount in requests.items():
        flavor = flavors.get(resource)
        if flavor is not None and amount:
            key = flavor_resource(flavor, resource)
            out[key] = out.get(key, 0) + amount
    return out


@lru_cache(maxsize=4096)
def format_amount(resource: str, amount: int) -> str:
    """Render an amount the way a person writes it in a manifest: 1500m, 2, 64Gi, 8.

    Used in reasons shown to users; never parsed back. Cached: a cycle's reasons name the
    same quotas, limits and requests thousands of times (the cache is bounded; a miss only
    costs the formatting).
    """
    if resource == CPU:
        return str(amount // 1000) if amount % 1000 == 0 else f"{amount}m"
    if resource in _BYTE_RESOURCES and amount:
        for suffix, unit in _BINARY_SUFFIXES:
            if amount % unit == 0:
                return f"{amount // unit}{suffix}"
    return str(amount)
