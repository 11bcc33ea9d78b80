"""Malformed input never gets a traceback, a hang or silent acceptance (issue 16, "Bad input").

Two halves:

- the classes of bad input found by hand, one case each, run through the real command line
  (`muster fairshare`, `admit`, `simulate`, `history`, `db`): each must fail with exit code
  1 or 2 and a message naming the object or file, the field and the rule;
- mutations of the example files (a value replaced by one of the wrong type or size, a key
  deleted, a document duplicated), a few hundred from a fixed seed, plus hypothesis-drawn
  raw documents: each must either succeed or fail with a clear error, never a traceback,
  and each must finish within a few seconds.

Every webhook gets hypothesis-drawn AdmissionReviews, malformed at every level, and must
answer each (allowed or refused with a message), never fail with a server error.

Everything runs in-process through click's runner, so a few hundred cases take seconds.
"""

from __future__ import annotations

import copy
import random
import signal
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controllers.main import main
from controllers.webhooks import reviews

REPO = Path(__file__).resolve().parents[2]
CLUSTER_FILES = [REPO / "examples" / "fairshare.yaml", REPO / "examples/api/three-team-gpu.yaml"]
PER_CASE_SECONDS = 10  # far above what any case takes; a case past it is a hang


class Hang(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise Hang("the command did not finish in time")


def run(*args: str) -> Result:
    """Run `muster ARGS` in-process, failing the test on a hang."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(PER_CASE_SECONDS)
    try:
        return CliRunner().invoke(main, list(args))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def assert_clean(result: Result, *, context: object = "") -> None:
    """Succeeded, or refused with an error message; never an exception of ours escaping."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(
            f"{type(result.exception).__name__}: {result.exception} for {context}"
        ) from result.exception
    if result.exit_code != 0:
        assert result.exit_code in (1, 2), (result.exit_code, context)
        assert "Error:" in result.output, (result.output, context)
        assert "Traceback" not in result.output, context


def assert_refused(result: Result, *needles: str) -> None:
    assert_clean(result)
    assert result.exit_code in (1, 2), result.output
    for needle in needles:
        assert needle in result.output, (needle, result.output)


def _docs(path: Path) -> list[dict[str, Any]]:
    # PodGroups belong to the scheduler, not to `muster fairshare`.
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") != "PodGroup"]


def _write(tmp: Path, docs: Sequence[Any], name: str = "case.yaml") -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump_all(list(docs), allow_unicode=True, sort_keys=False))
    return path


def _cluster(tmp: Path, *extra: dict[str, Any], edit: Any = None) -> Path:
    docs = _docs(CLUSTER_FILES[0]) + list(extra)
    if edit is not None:
        edit(docs)
    return _write(tmp, docs)


def _of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in docs if d.get("kind") == kind)


SCENARIO = """
apiVersion: simulate.muster.dev/v1alpha1
kind: Simulation
metadata: {name: fuzz}
spec: {until: 2h}
---
apiVersion: muster.dev/v1alpha1
kind: ResourceFlavor
metadata: {name: h100}
spec: {nodeLabels: {gpu: h100}}
---
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {gpu: h100}}
status:
  allocatable: {cpu: "64", nvidia.com/gpu: "8", memory: 512Gi}
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: muster.dev/v1alpha1
kind: ClusterQueue
metadata: {name: team}
spec:
  flavors:
  - name: h100
    quota: {nvidia.com/gpu: 8, cpu: 64, memory: 512Gi}
---
apiVersion: muster.dev/v1alpha1
kind: LocalQueue
metadata: {name: q, namespace: a}
spec: {clusterQueue: team}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: train
  namespace: a
  labels: {muster.dev/queue-name: q}
  annotations: {muster.dev/run-for: 30m, muster.dev/submit-at: 1m}
spec:
  parallelism: 2
  template:
    spec:
      nodeSelector: {gpu: h100}
      tolerations: [{key: k, operator: Exists}]
      containers:
      - name: main
        resources: {requests: {nvidia.com/gpu: 2, cpu: 4}}
"""


def _scenario(tmp: Path, edit: Any = None) -> Path:
    docs = list(yaml.safe_load_all(SCENARIO))
    if edit is not None:
        edit(docs)
    return _write(tmp, docs, "scenario.yaml")


def _simulate(path: Path, *more: str) -> Result:
    return run("simulate", str(path), "--no-history", "-o", "json", *more)


# ------------------------------------------------------------ the classes found by hand


def test_file_loading_refuses_what_is_not_readable_yaml(tmp_path: Path) -> None:
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"# caf\xe9\nkind: ClusterQueue\n")
    assert_refused(run("fairshare", str(latin)), "not UTF-8", "line 1")
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 3000 + "]" * 3000 + "\n")
    assert_refused(run("admit", str(deep)), "nested")
    big = tmp_path / "big.yaml"
    big.write_text("kind: ClusterQueue\nx: " + "9" * 4301 + "\n")
    assert_refused(run("fairshare", str(big)), "4300 digits")
    laughs = tmp_path / "laughs.yaml"
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 8)}]" for i in range(1, 9)]
    laughs.write_text("\n".join(lines) + "\n")
    assert_refused(run("fairshare", str(laughs)), "aliases are expanded")
    recursive = tmp_path / "recursive.yaml"
    recursive.write_text("a: &a [1, *a]\n")
    assert_refused(run("fairshare", str(recursive)), "contains itself")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    for command in ("fairshare", "admit", "simulate"):
        assert_refused(run(command, str(empty)), "no documents")


def test_job_and_node_fields_of_the_wrong_type_are_named(tmp_path: Path) -> None:
    def job(edit: Any) -> Any:
        return lambda docs: edit(_of_kind(docs, "Job"))

    cases = [
        (job(lambda j: j["metadata"].__setitem__("labels", ["q"])), "metadata.labels"),
        (job(lambda j: j["metadata"].__setitem__("annotations", ["x"])), "metadata.annotations"),
        (
            job(lambda j: j["spec"]["template"]["spec"].__setitem__("nodeSelector", ["a"])),
            "nodeSelector",
        ),
        (job(lambda j: j["spec"]["template"]["spec"].__setitem__("tolerations", 5)), "tolerations"),
        (
            job(
                lambda j: j["spec"]["template"]["spec"]["containers"][0]["resources"].__setitem__(
                    "requests", ["cpu"]
                )
            ),
            "resources.requests",
        ),
        (job(lambda j: j["spec"]["template"]["spec"].__setitem__("containers", 3)), "containers"),
        (
            lambda docs: _of_kind(docs, "Node")["status"].__setitem__("conditions", ["Ready"]),
            "status.conditions[0]",
        ),
        (
            lambda docs: _of_kind(docs, "Node")["metadata"].__setitem__("labels", ["gpu"]),
            "metadata.labels",
        ),
        (job(lambda j: j["metadata"].__setitem__("name", "Team A/ä")), "metadata.name"),
        (job(lambda j: j["metadata"].__setitem__("name", "Train")), "not a valid name"),
        (job(lambda j: j["metadata"].__setitem__("name", "🙂")), "not a valid name"),
    ]
    for edit, needle in cases:
        assert_refused(_simulate(_scenario(tmp_path, edit)), needle)


def test_huge_durations_and_times_are_refused_not_overflowed(tmp_path: Path) -> None:
    def annotate(key: str, value: str) -> Any:
        return lambda docs: _of_kind(docs, "Job")["metadata"]["annotations"].__setitem__(key, value)

    assert_refused(
        _simulate(_scenario(tmp_path, annotate("muster.dev/run-for", "99999999999h"))),
        "muster.dev/run-for",
        "longest duration",
    )
    assert_refused(
        _simulate(_scenario(tmp_path, annotate("muster.dev/submit-at", "99999999999h"))),
        "muster.dev/submit-at",
    )
    assert_refused(_simulate(_scenario(tmp_path), "--until", "99999999999h"), "--until")
    assert_refused(_simulate(_scenario(tmp_path), "--until", "10000h"), "samples")
    for start in ("0001-01-01T00:00:00Z", "9999-12-31T23:00:00Z"):
        edit = lambda docs, s=start: docs[0]["spec"].__setitem__("start", s)  # noqa: E731
        assert_refused(_simulate(_scenario(tmp_path, edit)), "spec.start")
    store = tmp_path / "h.db"
    assert run("db", "upgrade", "--database-url", str(store)).exit_code == 0
    assert_refused(
        run("history", "queue", "x", "--since", "9999999999w", "--database-url", str(store)),
        "--since",
    )


def test_large_inputs_are_refused_quickly_instead_of_running_for_minutes(tmp_path: Path) -> None:
    # A Job running 10,000 simulated hours: refused with what to change, not simulated.
    edit = lambda docs: (  # noqa: E731
        docs[0]["spec"].pop("until"),
        _of_kind(docs, "Job")["metadata"]["annotations"].__setitem__(
            "muster.dev/run-for", "10000h"
        ),
    )
    started = time.monotonic()
    assert_refused(_simulate(_scenario(tmp_path, edit)), "muster.dev/run-for", "sampleInterval")
    # A 1,500-deep queue chain.
    chain: list[dict[str, Any]] = [
        {"apiVersion": "muster.dev/v1alpha1", "kind": "ResourceFlavor", "metadata": {"name": "f"}}
    ]
    for i in range(1500):
        spec: dict[str, Any] = {"flavors": [{"name": "f", "quota": {"cpu": 1}}]}
        if i:
            spec["parent"] = f"q{i - 1}"
        chain.append(
            {
                "apiVersion": "muster.dev/v1alpha1",
                "kind": "ClusterQueue",
                "metadata": {"name": f"q{i}"},
                "spec": spec,
            }
        )
    assert_refused(run("fairshare", str(_write(tmp_path, chain))), "levels deep")
    assert time.monotonic() - started < 20


def test_impossible_admissions_in_a_cluster_file_are_refused(tmp_path: Path) -> None:
    docs = _docs(CLUSTER_FILES[1])
    queue = next(
        d for d in docs if d.get("kind") == "ClusterQueue" and d["metadata"]["name"] == "team-b"
    )
    parent = queue["spec"]["parent"]
    running = {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "running", "namespace": "team-b"},
        "spec": {
            "queueName": "gpu",
            "podSets": [{"name": "main", "count": 1, "requests": {"nvidia.com/gpu": 8}}],
        },
        "status": {
            "admission": {
                "clusterQueue": "team-b",
                "podSetAssignments": [
                    {"name": "main", "count": 1, "flavors": {"nvidia.com/gpu": "h100"}}
                ],
            }
        },
    }
    assert_clean(run("admit", str(_write(tmp_path, [*docs, running]))))
    for path, value, needle in [
        (("flavors",), {"nvidia.com/gpu": "no-such"}, "does not exist"),
        (("name",), "other", "no pod set 'other'"),
        (("count",), 999, "999 pods admitted"),
    ]:
        bad = copy.deepcopy(running)
        bad["status"]["admission"]["podSetAssignments"][0][path[0]] = value
        assert_refused(run("admit", str(_write(tmp_path, [*docs, bad]))), needle)
    to_parent = copy.deepcopy(running)
    to_parent["status"]["admission"]["clusterQueue"] = parent
    assert_refused(
        run("fairshare", str(_write(tmp_path, [*docs, to_parent]))), "only a leaf queue admits"
    )


def test_names_types_and_limits_are_checked(tmp_path: Path) -> None:
    def workload(**spec: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "queueName": "gpu",
            "podSets": [{"name": "main", "count": 1, "requests": {"cpu": 1}}],
        }
        base.update(spec)
        return {
            "apiVersion": "muster.dev/v1alpha1",
            "kind": "Workload",
            "metadata": {"name": "w", "namespace": "vision"},
            "spec": base,
        }

    accepted = run("admit", str(_cluster(tmp_path, workload())))
    assert accepted.exit_code == 0, accepted.output
    assert_refused(run("admit", str(_cluster(tmp_path, workload(priority=True)))), "priority")
    # Not refused since issue 24: it waits with a reason naming the class, as on the cluster.
    waits = run("admit", "-o", "json", str(_cluster(tmp_path, workload(priorityClassName="nope"))))
    assert waits.exit_code == 0, waits.output
    assert "PriorityClass 'nope', which does not exist" in waits.output
    many = {f"example.com/r{i}": 1 for i in range(33)}
    wide = workload(podSets=[{"name": "main", "count": 1, "requests": many}])
    assert_refused(run("admit", str(_cluster(tmp_path, wide))), "at most 32 resources")
    for name in ("Team A/ä", "Capital", "🙂"):
        renamed = workload()
        renamed["metadata"]["name"] = name
        assert_refused(run("admit", str(_cluster(tmp_path, renamed))), "metadata.name")


def test_bad_history_stores_get_a_message_and_reads_create_nothing(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_text("not a database at all")
    assert_refused(run("history", "preemptions", "--database-url", str(junk)), "not an SQLite")
    assert_refused(run("db", "current", "--database-url", str(junk)), "not an SQLite")

    fresh = tmp_path / "fresh.db"
    assert_refused(run("db", "upgrade", "9999", "--database-url", str(fresh)), "'9999'")

    newer = tmp_path / "newer.db"
    assert run("db", "upgrade", "--database-url", str(newer)).exit_code == 0
    with sqlite3.connect(newer) as conn:
        conn.execute("update alembic_version set version_num = '9000'")
    for args in (["history", "preemptions"], ["db", "upgrade"], ["db", "current"]):
        assert_refused(run(*args, "--database-url", str(newer)), "newer Muster")

    stamped = tmp_path / "stamped.db"
    with sqlite3.connect(stamped) as conn:
        conn.execute("create table alembic_version (version_num varchar(32) primary key)")
        conn.execute("insert into alembic_version values ('0001')")
    # Not a loop between "run db upgrade" and "nothing to do": both say it is damaged.
    assert_refused(run("history", "preemptions", "--database-url", str(stamped)), "damaged")
    assert_refused(run("db", "upgrade", "--database-url", str(stamped)), "damaged")

    missing = tmp_path / "no" / "such" / "dir" / "h.db"
    assert_refused(run("history", "queue", "x", "--database-url", str(missing)), "no history store")
    assert run("db", "current", "--database-url", str(missing)).exit_code == 0
    assert not (tmp_path / "no").exists()


def test_the_simulator_refuses_a_history_store_it_cannot_use_and_changes_nothing(
    tmp_path: Path,
) -> None:
    scenario = str(REPO / "examples" / "elastic.yaml")
    junk = tmp_path / "junk.db"
    junk.write_text("not a database at all")
    assert_refused(run("simulate", "--history", str(junk), scenario), "junk.db", "not an SQLite")
    assert junk.read_text() == "not a database at all"

    newer = tmp_path / "newer.db"
    assert run("simulate", "--history", str(newer), scenario).exit_code == 0

    def rows() -> int:
        with sqlite3.connect(newer) as conn:
            return int(conn.execute("select count(*) from workload_transitions").fetchone()[0])

    recorded = rows()
    assert recorded > 0
    with sqlite3.connect(newer) as conn:
        conn.execute("update alembic_version set version_num = '9000'")
    assert_refused(run("simulate", "--history", str(newer), scenario), "newer.db", "newer Muster")
    assert rows() == recorded


# ------------------------------------------------------------------- mutations


WRONG_VALUES: list[Any] = [
    [],
    {},
    ["Ready"],
    5,
    -1,
    0,
    True,
    None,
    "x",
    "Team A/ä",
    "🙂",
    10**40,
    1.5e308,
    "99999999999h",
    "4000500u",
    "-3",
    {"a": [1]},
    "9" * 50,
]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if prefix:
        yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*prefix, i))


def _mutate(docs: list[dict[str, Any]], rng: random.Random) -> tuple[list[Any], str]:
    docs = copy.deepcopy(docs)
    choice = rng.random()
    if choice < 0.05:
        docs.append(copy.deepcopy(rng.choice(docs)))
        return docs, "duplicated a document"
    doc = rng.choice(docs)
    path = rng.choice(list(_paths(doc)))
    target = doc
    for part in path[:-1]:
        target = target[part]
    if choice < 0.2:
        del target[path[-1]]
        return docs, f"deleted {path}"
    value = rng.choice(WRONG_VALUES)
    target[path[-1]] = value
    return docs, f"{path} = {value!r}"


@pytest.mark.parametrize("command", ["fairshare", "admit"])
def test_mutated_cluster_files_never_get_a_traceback(tmp_path: Path, command: str) -> None:
    rng = random.Random(16)
    originals = [_docs(path) for path in CLUSTER_FILES]
    for case in range(150):
        mutated, what = _mutate(rng.choice(originals), rng)
        path = _write(tmp_path, mutated)
        assert_clean(run(command, str(path), "-o", "json"), context=f"case {case}: {what}")


def test_mutated_scenarios_never_get_a_traceback(tmp_path: Path) -> None:
    rng = random.Random(1616)
    original = list(yaml.safe_load_all(SCENARIO))
    for case in range(80):
        mutated, what = _mutate(original, rng)
        path = _write(tmp_path, mutated, "scenario.yaml")
        assert_clean(_simulate(path), context=f"case {case}: {what}")


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["ClusterQueue", "Workload", "Node", "Job", "muster.dev/v1alpha1", "1h"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_documents = st.fixed_dictionaries(
    {
        "apiVersion": st.sampled_from(["muster.dev/v1alpha1", "v1", "batch/v1", "x"]),
        "kind": st.sampled_from(["ClusterQueue", "LocalQueue", "Workload", "Node", "Job", "Pod"]),
        "metadata": st.one_of(
            _values,
            st.fixed_dictionaries({"name": st.text(max_size=10)}, optional={"labels": _values}),
        ),
        "spec": _values,
        "status": _values,
    }
)


@settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(_documents, min_size=1, max_size=3))
def test_drawn_documents_never_get_a_traceback(tmp_path: Path, docs: list[dict[str, Any]]) -> None:
    path = tmp_path / "drawn.yaml"
    path.write_text(yaml.safe_dump_all(docs, allow_unicode=True))
    assert_clean(run("admit", str(path)), context=docs)


_reviews = st.one_of(
    _values,
    st.fixed_dictionaries(
        {
            "request": st.one_of(
                _values,
                st.fixed_dictionaries(
                    {"uid": _scalars, "object": st.one_of(_values, _documents)},
                    optional={"oldObject": st.one_of(_values, _documents)},
                ),
            )
        }
    ),
)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(
    st.sampled_from(
        [reviews.MUTATE_JOB_PATH, reviews.VALIDATE_JOB_PATH, reviews.VALIDATE_QUEUES_PATH]
    ),
    _reviews,
)
def test_webhooks_answer_every_malformed_review(path: str, review: Any) -> None:
    answer = reviews.WebhookHandlers().handle(path, review)
    response = answer["response"]
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert response["status"]["message"]
