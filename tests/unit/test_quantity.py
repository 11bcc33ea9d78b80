"""Kubernetes quantities become exact integers in base units, or a clear error."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quota.api.quantity import (
    MAX_BASE_UNITS,
    QuantityError,
    Unit,
    format_quantity,
    format_resource_list,
    parse_quantity,
    parse_resource_list,
    unit_of,
)


@pytest.mark.parametrize(
    ("text", "resource", "expected"),
    [
        ("500m", "cpu", 500),
        ("1.5", "cpu", 1500),
        ("2", "cpu", 2000),
        (2, "cpu", 2000),
        (0.25, "cpu", 250),
        ("0.001", "cpu", 1),
        ("1e3", "cpu", 1_000_000),
        ("2k", "cpu", 2_000_000),
        ("64Gi", "memory", 64 * 1024**3),
        ("1.5Gi", "memory", 1_610_612_736),
        ("1G", "memory", 10**9),
        ("128974848", "memory", 128974848),
        ("129e6", "memory", 129_000_000),
        ("123Mi", "memory", 123 * 1024**2),
        ("1Ki", "ephemeral-storage", 1024),
        ("2Gi", "hugepages-2Mi", 2 * 1024**3),
        ("8", "nvidia.com/gpu", 8),
        (8, "nvidia.com/gpu", 8),
        ("2k", "pods", 2000),
        ("1e1", "pods", 10),
        ("+4", "pods", 4),
        ("0", "nvidia.com/gpu", 0),
        ("-0", "nvidia.com/gpu", 0),
        (".5", "cpu", 500),
        ("5.", "cpu", 5000),
        ("3000000n", "cpu", 3),
        ("1000u", "cpu", 1),
    ],
)
def test_parses_kubernetes_quantities_into_base_units(
    text: str | int | float, resource: str, expected: int
) -> None:
    assert parse_quantity(text, resource) == expected


@pytest.mark.parametrize(
    ("text", "resource", "fragment"),
    [
        ("-1", "cpu", "must not be negative"),
        ("-500m", "memory", "must not be negative"),
        ("1.5", "nvidia.com/gpu", "nvidia.com/gpu is counted in whole units"),
        ("500m", "pods", "fractions are not allowed"),
        ("0.1m", "cpu", "whole millicores"),
        ("1500u", "cpu", "whole millicores"),
        ("0.5", "memory", "whole bytes"),
        ("", "cpu", "is not a Kubernetes quantity"),
        ("abc", "cpu", "is not a Kubernetes quantity"),
        ("1.2.3", "cpu", "is not a Kubernetes quantity"),
        ("1Kb", "memory", "is not a Kubernetes quantity"),
        ("1 Gi", "memory", "is not a Kubernetes quantity"),
        (" 1", "memory", "is not a Kubernetes quantity"),
        ("1e1.5", "cpu", "is not a Kubernetes quantity"),
        ("1e99", "cpu", "exponent out of range"),
        ("10E", "memory", "too large"),
        (True, "nvidia.com/gpu", "is not a quantity"),
        (None, "cpu", "is not a quantity"),
        (float("nan"), "cpu", "is not a finite quantity"),
    ],
)
def test_rejects_bad_quantities_with_the_rule(text: object, resource: str, fragment: str) -> None:
    with pytest.raises(QuantityError, match=fragment):
        parse_quantity(text, resource)


def test_error_names_the_field() -> None:
    with pytest.raises(QuantityError) as error:
        parse_quantity("-2", "nvidia.com/gpu", field="spec.flavors[0].quota[nvidia.com/gpu]")
    assert str(error.value) == ("spec.flavors[0].quota[nvidia.com/gpu]: '-2' must not be negative")


def test_resource_list_error_names_the_entry() -> None:
    with pytest.raises(QuantityError, match=r"^requests\[memory\]: 'lots' is not"):
        parse_resource_list({"cpu": "1", "memory": "lots"}, field="requests")


@pytest.mark.parametrize(
    ("resource", "unit"),
    [
        ("cpu", Unit.MILLICORES),
        ("memory", Unit.BYTES),
        ("ephemeral-storage", Unit.BYTES),
        ("hugepages-1Gi", Unit.BYTES),
        ("nvidia.com/gpu", Unit.COUNT),
        ("pods", Unit.COUNT),
        ("example.com/foo", Unit.COUNT),
        ("example.com/memory", Unit.COUNT),  # extended resources are always counts
    ],
)
def test_unit_of(resource: str, unit: Unit) -> None:
    assert unit_of(resource) is unit


@pytest.mark.parametrize(
    ("amount", "resource", "text"),
    [
        (2000, "cpu", "2"),
        (1500, "cpu", "1500m"),
        (0, "cpu", "0"),
        (64 * 1024**3, "memory", "64Gi"),
        (1536 * 1024**2, "memory", "1536Mi"),
        (10**9, "memory", "1G"),
        (1000, "memory", "1k"),
        (1023, "memory", "1023"),
        (0, "memory", "0"),
        (8, "nvidia.com/gpu", "8"),
        (2000, "pods", "2000"),
    ],
)
def test_formats_canonical_strings(amount: int, resource: str, text: str) -> None:
    assert format_quantity(amount, resource) == text


def test_format_rejects_negative_amounts() -> None:
    with pytest.raises(QuantityError, match="non-negative"):
        format_quantity(-1, "cpu")


RESOURCES = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "pods", "hugepages-2Mi"])
AMOUNTS = st.integers(min_value=0, max_value=MAX_BASE_UNITS)


@settings(max_examples=200)
@given(amount=AMOUNTS, resource=RESOURCES)
def test_format_then_parse_is_exact(amount: int, resource: str) -> None:
    assert parse_quantity(format_quantity(amount, resource), resource) == amount


@settings(max_examples=200)
@given(
    mantissa=st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False),
    suffix=st.sampled_from(["", "m", "k", "M", "Ki", "Mi", "Gi", "e2", "e-3", "E1"]),
)
def test_cpu_parse_agrees_with_decimal_arithmetic(mantissa: Decimal, suffix: str) -> None:
    scale = {
        "": Decimal(1),
        "m": Decimal("0.001"),
        "k": Decimal(1000),
        "M": Decimal(10**6),
        "Ki": Decimal(1024),
        "Mi": Decimal(1024**2),
        "Gi": Decimal(1024**3),
        "e2": Decimal(100),
        "e-3": Decimal("0.001"),
        "E1": Decimal(10),
    }[suffix]
    millicores = mantissa * scale * 1000
    text = f"{mantissa}{suffix}"
    if millicores == millicores.to_integral_value():
        assert parse_quantity(text, "cpu") == int(millicores)
    else:
        with pytest.raises(QuantityError, match="whole millicores"):
            parse_quantity(text, "cpu")


@settings(max_examples=100)
@given(amounts=st.dictionaries(RESOURCES, AMOUNTS, max_size=5))
def test_resource_lists_round_trip(amounts: dict[str, int]) -> None:
    assert parse_resource_list(format_resource_list(amounts)) == amounts


@settings(max_examples=100)
@given(amount=st.integers(min_value=1, max_value=10**12))
def test_negative_of_any_valid_quantity_is_rejected(amount: int) -> None:
    text = format_quantity(amount, "memory")
    with pytest.raises(QuantityError, match="must not be negative"):
        parse_quantity(f"-{text}", "memory")
