"""Kubernetes quantities, parsed once at the edge into exact integers in base units.

The core never sees strings like "500m": cpu becomes millicores, memory and storage become
bytes, and every other resource (nvidia.com/gpu, pods, ...) becomes a whole count. Parsing
uses exact rational arithmetic, so "0.1" cpu is exactly 100 millicores and "1.5Gi" is
exactly 1610612736 bytes; a quantity that does not land on a whole base unit is rejected
rather than rounded, because a silently rounded quota is a quota nobody agreed to.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Annotated, Any

from pydantic import PlainSerializer, WithJsonSchema
from pydantic.functional_validators import BeforeValidator

__all__ = [
    "QuantityError",
    "ResourceList",
    "Unit",
    "format_quantity",
    "format_resource_list",
    "parse_quantity",
    "parse_resource_list",
    "unit_of",
]

# The grammar of k8s.io/apimachinery resource.Quantity (decimal exponents must be integers,
# which the Go parser enforces even though its published pattern is looser). The sign is
# matched so that "-1" is refused as negative rather than as malformed.
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}

# Kubernetes stores quantities in int64 at the API boundary; anything beyond that is a typo,
# and bounding the exponent keeps a hostile "1e999999999" from eating the CPU.
_MAX_EXPONENT = 30
MAX_BASE_UNITS = 2**63 - 1

_BYTE_RESOURCES = frozenset({"memory", "ephemeral-storage", "storage"})


class Unit(enum.Enum):
    """The base unit a resource is counted in."""

    MILLICORES = "millicores"
    BYTES = "bytes"
    COUNT = "count"


class QuantityError(ValueError):
    """A quantity that is malformed, negative, too precise or too large for its resource."""


def unit_of(resource: str) -> Unit:
    """Return the base unit for a resource name (cpu, memory, nvidia.com/gpu, ...)."""
    if resource == "cpu":
        return Unit.MILLICORES
    if resource in _BYTE_RESOURCES or resource.startswith("hugepages-"):
        return Unit.BYTES
    # Everything else, extended resources such as nvidia.com/gpu included, is counted in
    # whole units, as Kubernetes itself requires of extended resources.
    return Unit.COUNT


def _where(resource: str, field: str) -> str:
    return f"{field}: " if field else f"{resource}: "


def _to_text(value: object, resource: str, field: str) -> str:
    # bool is an int in Python, but `gpu: true` in YAML is a mistake, not a quantity.
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise QuantityError(
            f"{_where(resource, field)}{value!r} is not a quantity "
            f"(expected a number or a string such as '500m', '64Gi', '8')"
        )
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"{_where(resource, field)}{value!r} is not a finite quantity")
        return repr(value)
    return str(value)


def _exact_value(text: str, resource: str, field: str) -> Fraction:
    match = _QUANTITY.match(text)
    if match is None:
        raise QuantityError(
            f"{_where(resource, field)}{text!r} is not a Kubernetes quantity "
            f"(expected e.g. '500m', '1.5', '64Gi', '2k', '1e3')"
        )
    number = Fraction(match["number"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        number *= 1024 ** _BINARY[suffix]
    elif suffix in _DECIMAL:
        number *= Fraction(10) ** _DECIMAL[suffix]
    elif suffix:
        exponent = int(suffix[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(f"{_where(resource, field)}{text!r} has an exponent out of range")
        number *= Fraction(10) ** exponent
    if match["sign"] == "-" and number != 0:
        raise QuantityError(f"{_where(resource, field)}{text!r} must not be negative")
    return number


def parse_quantity(value: object, resource: str, *, field: str = "") -> int:
    """Parse a Kubernetes quantity into an exact integer in the resource's base unit.

    ``field`` names where the value came from (e.g. ``spec.flavors[0].quota[cpu]``) and
    prefixes every error message; without it the resource name is used.
    """
    text = _to_text(value, resource, field)
    exact = _exact_value(text, resource, field)
    unit = unit_of(resource)
    scaled = exact * 1000 if unit is Unit.MILLICORES else exact
    if scaled.denominator != 1:
        if unit is Unit.MILLICORES:
            rule = "cpu is counted in whole millicores (the smallest cpu quantity is 1m)"
        elif unit is Unit.BYTES:
            rule = f"{resource} is counted in whole bytes"
        else:
            rule = f"{resource} is counted in whole units, so fractions are not allowed"
        raise QuantityError(f"{_where(resource, field)}{text!r} is not exact: {rule}")
    amount = scaled.numerator
    if amount > MAX_BASE_UNITS:
        raise QuantityError(
            f"{_where(resource, field)}{text!r} is too large (at most {MAX_BASE_UNITS} "
            f"{unit.value})"
        )
    return amount


def format_quantity(amount: int, resource: str) -> str:
    """Format base units back into the canonical Kubernetes string for the resource.

    cpu: whole cores when exact ("2"), otherwise millicores ("1500m"); bytes: the largest
    binary suffix that is exact ("64Gi"), then the largest decimal one ("1G"), else plain;
    counts: the plain integer. ``parse_quantity(format_quantity(n, r), r) == n``.
    """
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
        raise QuantityError(f"{resource}: {amount!r} is not a non-negative integer amount")
    unit = unit_of(resource)
    if unit is Unit.MILLICORES:
        return str(amount // 1000) if amount % 1000 == 0 else f"{amount}m"
    if unit is Unit.BYTES and amount:
        for suffix, power in sorted(_BINARY.items(), key=lambda item: -item[1]):
            if amount % 1024**power == 0:
                return f"{amount // 1024**power}{suffix}"
        for suffix in ("E", "P", "T", "G", "M", "k"):
            scale = 10 ** _DECIMAL[suffix]
            if amount % scale == 0:
                return f"{amount // scale}{suffix}"
    return str(amount)


def parse_resource_list(value: object, *, field: str = "") -> dict[str, int]:
    """Parse a ``{resource name: quantity}`` mapping into base units, naming the bad entry."""
    if not isinstance(value, Mapping):
        where = f"{field}: " if field else ""
        raise QuantityError(f"{where}expected a mapping of resource name to quantity")
    parsed: dict[str, int] = {}
    for name, raw in value.items():
        if not isinstance(name, str) or not name:
            raise QuantityError(f"{field or 'resources'}: resource names must be non-empty strings")
        parsed[name] = parse_quantity(raw, name, field=f"{field}[{name}]")
    return parsed


def format_resource_list(amounts: Mapping[str, int]) -> dict[str, str]:
    """Format a base-unit resource mapping back into canonical quantity strings."""
    return {name: format_quantity(amount, name) for name, amount in amounts.items()}


def _validate_resource_list(value: Any) -> dict[str, int]:
    # One meaning for every input, the one kubectl has: an integer is a quantity, so `cpu: 2`
    # is two cores. Code holding base units builds models from format_resource_list(...).
    if isinstance(value, Mapping) and len(value) > MAX_RESOURCES:
        raise QuantityError(f"at most {MAX_RESOURCES} resources (got {len(value)})")
    return parse_resource_list(value)


# Kubernetes accepts `cpu: 2` as well as `cpu: "2"`, so the CRD types each value as
# int-or-string; CEL rejects negative and malformed values with a message naming the entry.
MAX_QUANTITY_LENGTH = 64
RESOURCE_VALUE_SCHEMA: dict[str, Any] = {
    "x-kubernetes-int-or-string": True,
    # Bounds the CEL cost estimate (the apiserver refuses rules it cannot bound).
    "maxLength": MAX_QUANTITY_LENGTH,
    "x-kubernetes-validations": [
        {
            "rule": "type(self) == int || isQuantity(self)",
            "message": "must be a Kubernetes quantity such as 500m, 1.5, 64Gi or 8",
        },
        {
            "rule": "type(self) == int ? self >= 0 : !isQuantity(self) || "
            "quantity(self).compareTo(quantity('0')) >= 0",
            "message": "must not be negative",
        },
    ],
}
MAX_RESOURCES = 32

# Countable resources (anything not cpu or bytes) must be whole: half a GPU is not a thing
# the device plugin can hand out.
_WHOLE_OR_FRACTIONAL = (
    "r in ['cpu', 'memory', 'ephemeral-storage', 'storage'] || r.startsWith('hugepages-') || "
    "type(self[r]) == int || !isQuantity(self[r]) || quantity(self[r]).isInteger()"
)
RESOURCE_LIST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "maxProperties": MAX_RESOURCES,
    "additionalProperties": RESOURCE_VALUE_SCHEMA,
    "x-kubernetes-validations": [
        {
            "rule": f"self.all(r, {_WHOLE_OR_FRACTIONAL})",
            "message": "countable resources (anything but cpu, memory and storage) must be "
            "whole numbers",
            "messageExpression": f"self.filter(r, !({_WHOLE_OR_FRACTIONAL}))[0] + "
            "' is counted in whole units, so fractions are not allowed'",
        }
    ],
}

ResourceList = Annotated[
    dict[str, int],
    BeforeValidator(_validate_resource_list),
    # Always dump quantity strings, so that Model.model_validate(model.model_dump()) is exact.
    PlainSerializer(format_resource_list),
    WithJsonSchema(RESOURCE_LIST_SCHEMA),
]
"""A ``{resource name: amount}`` mapping held in base units, written as quantity strings."""
