"""Reading another project's manifests field by field, refusing what that project would.

`SourceObject` is one decoded document with its origin; its getters return the field's
value in the expected shape or raise an ImportInputError naming the file, the document, the
object, the field and the rule. Quantities become Muster's exact base units.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from quota.api.meta import DNS_SUBDOMAIN
from quota.api.quantity import QuantityError, parse_quantity
from quota.importers.report import Origin, refuse

_NAME = re.compile(DNS_SUBDOMAIN)
MAX_NAME = 253
MAX_NAMESPACE = 63


def _subject(doc: Mapping[str, Any]) -> str:
    kind = doc.get("kind")
    kind = kind if isinstance(kind, str) and kind else "object without kind"
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        return kind
    if isinstance(namespace, str) and namespace:
        return f"{kind} {namespace}/{name}"
    return f"{kind} {name}"


@dataclass(frozen=True)
class SourceObject:
    """One source document: its apiVersion, kind, name and fields, with its origin."""

    origin: Origin
    api_version: str
    kind: str
    doc: Mapping[str, Any]

    @property
    def group(self) -> str:
        """The API group ("" for the core group)."""
        return self.api_version.rpartition("/")[0]

    @property
    def name(self) -> str:
        meta = self.mapping(self.doc.get("metadata"), "metadata")
        value = meta.get("name")
        if not isinstance(value, str) or not value:
            refuse(self.origin, "metadata.name", "required field is missing")
        if len(value) > MAX_NAME or not _NAME.fullmatch(value):
            refuse(
                self.origin,
                "metadata.name",
                f"{value!r} is not a valid name: lower-case letters, digits, '-' and '.', "
                f"starting and ending with a letter or digit, at most {MAX_NAME} characters",
            )
        return value

    @property
    def namespace(self) -> str:
        """The namespace of a namespaced object ("default" when unset)."""
        meta = self.mapping(self.doc.get("metadata"), "metadata")
        value = meta.get("namespace")
        if value is None or value == "":
            return "default"
        if (
            not isinstance(value, str)
            or len(value) > MAX_NAMESPACE
            or not _NAME.fullmatch(value)
            or "." in value
        ):
            refuse(
                self.origin,
                "metadata.namespace",
                f"{value!r} is not a valid namespace: lower-case letters, digits and '-', "
                f"at most {MAX_NAMESPACE} characters",
            )
        return value

    def meta_strings(self, field: str) -> dict[str, str]:
        """metadata.labels or metadata.annotations."""
        meta = self.mapping(self.doc.get("metadata"), "metadata")
        return self.strings(meta.get(field), f"metadata.{field}")

    def spec(self) -> Mapping[str, Any]:
        return self.mapping(self.doc.get("spec"), "spec")

    # ---------------------------------------------------------------- typed getters

    def mapping(self, value: object, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            refuse(self.origin, path, f"must be a mapping (got {type(value).__name__})")
        for key in value:
            if not isinstance(key, str):
                refuse(self.origin, path, f"keys must be strings (got {key!r})")
        return value

    def items(self, value: object, path: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            refuse(self.origin, path, f"must be a list (got {type(value).__name__})")
        return value

    def text(self, value: object, path: str, *, required: bool = False) -> str:
        if value is None or value == "":
            if required:
                refuse(self.origin, path, "required field is missing")
            return ""
        if not isinstance(value, str):
            refuse(self.origin, path, f"must be a string (got {value!r})")
        return value

    def ref(self, value: object, path: str, *, required: bool = False) -> str:
        """A reference to another object by name (a valid name, or "" when unset)."""
        text = self.text(value, path, required=required)
        if text and (len(text) > MAX_NAME or not _NAME.fullmatch(text)):
            refuse(self.origin, path, f"{text!r} is not a valid object name")
        return text

    def choice(self, value: object, path: str, allowed: Sequence[str], default: str) -> str:
        text = self.text(value, path)
        if not text:
            return default
        if text not in allowed:
            refuse(self.origin, path, f"must be one of {', '.join(allowed)} (got {text!r})")
        return text

    def strings(self, value: object, path: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, item in self.mapping(value, path).items():
            if not isinstance(item, str):
                refuse(self.origin, f"{path}[{key}]", f"must be a string (got {item!r})")
            out[key] = item
        return out

    def boolean(self, value: object, path: str, default: bool) -> bool:
        if value is None:
            return default
        if not isinstance(value, bool):
            refuse(self.origin, path, f"must be true or false (got {value!r})")
        return value

    def integer(
        self, value: object, path: str, *, low: int | None = None, high: int | None = None
    ) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            refuse(self.origin, path, f"must be a whole number (got {value!r})")
        if (low is not None and value < low) or (high is not None and value > high):
            refuse(self.origin, path, f"must be between {low} and {high} (got {value})")
        return value

    def number(self, value: object, path: str) -> Fraction | None:
        """A plain JSON number (int or float), exactly; None when unset."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            refuse(self.origin, path, f"must be a number (got {value!r})")
        if isinstance(value, float) and not math.isfinite(value):
            refuse(self.origin, path, f"must be a finite number (got {value!r})")
        if abs(value) > 2**63:
            refuse(self.origin, path, f"is too large (got {value!r})")
        return Fraction(value)

    def quantity(self, value: object, path: str, resource: str) -> int:
        """A Kubernetes quantity for `resource`, in Muster's base units."""
        try:
            return parse_quantity(value, resource, field=path)
        except QuantityError as error:
            where, _, rule = str(error).partition(": ")
            refuse(self.origin, where or path, rule or str(error))

    def quantities(self, value: object, path: str) -> dict[str, int]:
        return {
            resource: self.quantity(raw, f"{path}[{resource}]", resource)
            for resource, raw in self.mapping(value, path).items()
        }


def read_objects(files: Sequence[tuple[str, Sequence[Any]]]) -> list[SourceObject]:
    """Every non-empty document of every file, checked to be an object with apiVersion and
    kind."""
    out: list[SourceObject] = []
    for file, docs in files:
        for index, doc in enumerate(docs):
            if doc is None:
                continue  # a stray "---"
            if not isinstance(doc, Mapping):
                refuse(
                    Origin(file, index, "document"),
                    "",
                    f"expected a mapping (a Kubernetes object), got {type(doc).__name__}",
                )
            origin = Origin(file, index, _subject(doc))
            api_version = doc.get("apiVersion")
            kind = doc.get("kind")
            if not isinstance(api_version, str) or not api_version:
                refuse(origin, "apiVersion", "required field is missing")
            if not isinstance(kind, str) or not kind:
                refuse(origin, "kind", "required field is missing")
            out.append(SourceObject(origin, api_version, kind, doc))
    return out
