"""Shared building blocks of Muster's API objects: the model base, object metadata and the
Kubernetes scheduling types (taints, tolerations, label selectors) several kinds reuse."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from fractions import Fraction
from typing import Annotated, Any, ClassVar, Final, Literal, Self, get_args

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

GROUP: Final = "muster.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "muster.dev/v1alpha1"

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

# A DNS-1123 label / subdomain, as Kubernetes validates object names.
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def reference(description: str, *, optional: bool = False) -> Any:
    """A field naming another object by its name (a DNS subdomain, as the apiserver checks
    names); `optional`: None when not set."""
    return Field(
        None if optional else ...,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description=description,
    )


def _numeric(annotation: object) -> bool:
    """Whether a field's type is a number (possibly optional or annotated), not a bool."""
    if annotation in (int, float):
        return True
    args = get_args(annotation)
    return bool(args) and bool not in args and str not in args and any(map(_numeric, args))


class ApiModel(BaseModel):
    """Base of every Muster API type: camelCase on the wire, snake_case in Python, immutable,
    and strict about unknown fields so a typo in a manifest is an error, not a silent no-op."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
    )

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        # pydantic reads true as 1 for a number; YAML's `priority: true` is a mistake to name.
        if isinstance(data, dict):
            for name, info in cls.model_fields.items():
                key = info.alias or name
                value = data.get(key, data.get(name))
                if isinstance(value, bool) and _numeric(info.annotation):
                    raise ValueError(f"{key}: must be a number (got {str(value).lower()})")
        return data


def cel(
    rule: str,
    message: str,
    *,
    field_path: str | None = None,
    reason: str | None = None,
    message_expression: str | None = None,
) -> dict[str, str]:
    """A CEL rule for the CRD schema (x-kubernetes-validations), mirrored by a Python check."""
    validation = {"rule": rule, "message": message}
    if message_expression:
        validation["messageExpression"] = message_expression
    if field_path:
        validation["fieldPath"] = field_path
    if reason:
        validation["reason"] = reason
    return validation


def validations(*rules: dict[str, str]) -> ConfigDict:
    """Model config that attaches CEL rules to the model's schema."""
    listed: list[JsonValue] = [dict(rule) for rule in rules]
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": listed})


def wire(model: BaseModel) -> dict[str, Any]:
    """Dump a model as Kubernetes writes it: camelCase keys, quantities as strings, no nulls."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


class OwnerReference(ApiModel):
    """A reference to the object that owns this one (garbage collection follows it)."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(ApiModel):
    """Standard Kubernetes object metadata. Fields Muster does not use (managedFields, ...)
    are kept as they are so that reading and writing an object loses nothing."""

    model_config = ConfigDict(extra="allow")

    # As the apiserver checks them, so a file read by `muster fairshare` or `simulate` is
    # refused for the names a cluster would refuse.
    name: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN)
    generate_name: str | None = None
    namespace: str | None = Field(None, max_length=63, pattern=DNS_LABEL)
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: AwareDatetime | None = None
    deletion_timestamp: AwareDatetime | None = None
    deletion_grace_period_seconds: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    owner_references: list[OwnerReference] = Field(default_factory=list)
    finalizers: list[str] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _omit_empty(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The apiserver omits empty metadata collections; so do we, so dumps compare equal.
        dumped: dict[str, Any] = handler(self)
        return {k: v for k, v in dumped.items() if v not in ({}, [])}


_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)")
_DURATION_SECONDS = {
    "ns": Fraction(1, 10**9),
    "us": Fraction(1, 10**6),
    "µs": Fraction(1, 10**6),
    "ms": Fraction(1, 1000),
    "s": Fraction(1),
    "m": Fraction(60),
    "h": Fraction(3600),
}
DURATION_PATTERN = r"^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h))+)$"


# metav1.Duration is a Go time.Duration: int64 nanoseconds, at most about 292 years.
MAX_DURATION_S = Fraction(2**63 - 1, 10**9)


def parse_duration(value: object, *, field: str = "") -> timedelta:
    """Parse a Go duration string ("90s", "10m", "1h30m") as metav1.Duration writes it."""
    where = f"{field}: " if field else ""
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise ValueError(f"{where}duration must not be negative")
        if value.total_seconds() > MAX_DURATION_S:
            raise ValueError(f"{where}longer than the longest duration (2562047h47m16s)")
        return value
    if not isinstance(value, str):
        raise ValueError(f"{where}{value!r} is not a duration (expected e.g. '90s', '1h30m')")
    total = Fraction(0)
    position = 0
    if value != "0":
        for match in _DURATION_PART.finditer(value):
            if match.start() != position:
                break
            total += Fraction(match[1]) * _DURATION_SECONDS[match[2]]
            position = match.end()
        if position != len(value) or not value:
            raise ValueError(
                f"{where}{value!r} is not a duration (expected e.g. '90s', '10m', '1h30m')"
            )
    if total > MAX_DURATION_S:
        raise ValueError(
            f"{where}{value!r} is longer than the longest duration Kubernetes can hold "
            "(2562047h47m16s)"
        )
    microseconds = total * 10**6
    if microseconds.denominator != 1:
        raise ValueError(f"{where}{value!r} is finer than a microsecond")
    return timedelta(microseconds=microseconds.numerator)


def format_duration(value: timedelta) -> str:
    """Format a duration the way Go prints it, without zero units ("1h30m", "45s", "0s")."""
    micros = (value.days * 86400 + value.seconds) * 10**6 + value.microseconds
    hours, micros = divmod(micros, 3600 * 10**6)
    minutes, micros = divmod(micros, 60 * 10**6)
    seconds, micros = divmod(micros, 10**6)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    if seconds or micros or not text:
        fraction = f".{micros:06d}".rstrip("0") if micros else ""
        text += f"{seconds}{fraction}s"
    return text


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration),
    WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN}),
]
"""A non-negative duration written as a Go duration string, e.g. "10m" or "1h30m"."""


@dataclass(frozen=True)
class PrinterColumn:
    """A `kubectl get` column of a CRD."""

    name: str
    json_path: str
    type: Literal["string", "integer", "number", "boolean", "date"] = "string"
    description: str = ""
    priority: int = 0


@dataclass(frozen=True)
class CrdInfo:
    """How a top-level kind is served: names, scope and the `kubectl get` columns."""

    plural: str
    scope: Literal["Cluster", "Namespaced"]
    short_names: tuple[str, ...] = ()
    printer_columns: tuple[PrinterColumn, ...] = ()
    categories: tuple[str, ...] = ("muster",)


class ApiObject(ApiModel):
    """A top-level Muster object (apiVersion, kind, metadata, spec, status)."""

    crd: ClassVar[CrdInfo]
    # Rules that need metadata (only reachable from the root of a CRD schema).
    root_validations: ClassVar[tuple[dict[str, str], ...]] = ()

    metadata: ObjectMeta = Field(default_factory=ObjectMeta)

    @model_validator(mode="after")
    def _scope_matches(self) -> Self:
        namespaced = self.crd.scope == "Namespaced"
        if not namespaced and self.metadata.namespace:
            raise ValueError(
                f"{type(self).__name__} is cluster-scoped: metadata.namespace must not be set"
            )
        return self

    def to_manifest(self) -> dict[str, Any]:
        """The object as a Kubernetes manifest (what `kubectl apply` takes)."""
        dumped = wire(self)
        # Kubernetes order (apiVersion, kind, metadata, ...) reads better in YAML.
        manifest = {key: dumped.pop(key) for key in ("apiVersion", "kind", "metadata")}
        manifest.update(dumped)
        status = getattr(self, "status", None)
        if status is not None and status == type(status)():
            manifest.pop("status", None)
        return manifest

    @property
    def name(self) -> str:
        """metadata.name, or "" when the object has none yet (generateName)."""
        return self.metadata.name or ""


TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class Taint(ApiModel):
    """A node taint: pods that do not tolerate it are kept off (or evicted from) the node."""

    key: str = Field(min_length=1, max_length=316)
    value: str | None = Field(None, max_length=63)
    effect: TaintEffect


class Toleration(ApiModel):
    """A pod toleration, as in core/v1 Pod.spec.tolerations."""

    key: str | None = Field(None, max_length=316)
    operator: Literal["Exists", "Equal", "Lt", "Gt"] | None = Field(
        None, description="How key and value are compared; Equal when unset."
    )
    value: str | None = Field(None, max_length=63)
    effect: TaintEffect | None = Field(
        None, description="The taint effect to tolerate; all effects when unset."
    )
    toleration_seconds: int | None = Field(
        None, description="For NoExecute: how long the pod stays bound after the taint appears."
    )

    @field_validator("effect", "operator", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # Kubernetes writes "" for "all effects" / "default operator"; it means unset.
        return None if value == "" else value


class LabelSelectorRequirement(ApiModel):
    """One set-based requirement of a label selector."""

    model_config = validations(
        cel(
            "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
            "values must be non-empty for In and NotIn and empty for Exists and DoesNotExist",
        )
    )

    key: str = Field(min_length=1, max_length=316)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _values_match_operator(self) -> Self:
        needs_values = self.operator in ("In", "NotIn")
        if needs_values and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if not needs_values and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


class LabelSelector(ApiModel):
    """A Kubernetes label selector; an empty selector matches everything."""

    match_labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=32)

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether a set of labels satisfies the selector."""
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for req in self.match_expressions:
            present = req.key in labels
            if req.operator == "Exists" and not present:
                return False
            if req.operator == "DoesNotExist" and present:
                return False
            if req.operator == "In" and labels.get(req.key) not in req.values:
                return False
            if req.operator == "NotIn" and present and labels[req.key] in req.values:
                return False
        return True
