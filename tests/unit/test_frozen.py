"""Frozen cache objects: every container refuses change, however deep, and the cache keeps
no managedFields."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers.runtime.frozen import FrozenDict, FrozenList, freeze, freeze_object

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=30,
)


def containers(value: Any) -> list[Any]:
    found: list[Any] = []
    if isinstance(value, dict):
        found.append(value)
        for v in value.values():
            found += containers(v)
    elif isinstance(value, list):
        found.append(value)
        for v in value:
            found += containers(v)
    return found


@given(JSON)
def test_every_container_is_frozen_and_the_value_is_unchanged(value: Any) -> None:
    original = copy.deepcopy(value)
    frozen = freeze(value)
    assert frozen == original and value == original, "freezing copies, never changes"
    assert json.dumps(frozen) == json.dumps(original)
    for c in containers(frozen):
        assert type(c) in (FrozenDict, FrozenList)
    thawed = copy.deepcopy(frozen)
    assert thawed == original
    assert all(type(c) in (dict, list) for c in containers(thawed))


def test_lists_inside_lists_refuse_change_and_frozen_parts_are_shared() -> None:
    shared = freeze({"a": [1]})
    frozen = freeze({"x": [[1, [2]], {"y": [3]}], "shared": shared})
    with pytest.raises(TypeError):
        frozen["x"][0][1].append(3)
    with pytest.raises(TypeError):
        frozen["x"][1]["y"].append(4)
    assert frozen["shared"] is shared


def test_an_object_is_cached_without_managed_fields_and_the_callers_copy_is_untouched() -> None:
    obj = {
        "metadata": {"name": "n", "managedFields": [{"manager": "kubectl"}], "labels": {"a": "b"}},
        "spec": {"x": 1},
    }
    cached = freeze_object(obj)
    assert cached == {"metadata": {"name": "n", "labels": {"a": "b"}}, "spec": {"x": 1}}
    assert obj["metadata"]["managedFields"] == [{"manager": "kubectl"}]
    assert freeze_object({"spec": {}}) == {"spec": {}}, "objects without metadata are kept"
