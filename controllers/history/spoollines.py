"""The spool codec: a history record as one line of a spool segment, and lines read back as
records.

A line is JSON. A workload transition, the record the admission path writes most, is a compact
array in a field order fixed by its tag; every other record is the tagged dict of
`record_to_dict`. A line that does not read back as a record is returned for rejected.jsonl,
never dropped and never read wrongly.
"""

from __future__ import annotations

import json

from controllers.history.records import (
    Record,
    RecordError,
    WorkloadTransition,
    record_from_dict,
    record_to_dict,
)

# The field order of each compact tag. A later version that changes the fields adds a tag and
# keeps reading this one. Built from the attributes directly, a compact line is about 4x
# cheaper on the caller's thread than the tagged dict.
_COMPACT: dict[str, tuple[str, ...]] = {
    "t1": (
        "namespace",
        "name",
        "uid",
        "kind",
        "at",
        "sequence",
        "local_queue",
        "cluster_queue",
        "flavors",
        "resources",
        "reason",
        "actor",
    ),
}
_ENCODE = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def spool_line(record: Record) -> str:
    """`record` as one line of the spool."""
    if type(record) is WorkloadTransition:
        return (
            _ENCODE(
                (
                    "t1",
                    record.namespace,
                    record.name,
                    record.uid,
                    record.kind.value,
                    record.at.isoformat(),
                    record.sequence,
                    record.local_queue,
                    record.cluster_queue,
                    dict(record.flavors),
                    dict(record.resources),
                    record.reason,
                    record.actor,
                )
            )
            + "\n"
        )
    return _ENCODE(record_to_dict(record)) + "\n"


def parse_lines(lines: list[str]) -> tuple[list[Record], list[str]]:
    """The records in spool lines, and the lines for rejected.jsonl of those that are not."""
    records: list[Record] = []
    rejected: list[str] = []
    for line in lines:
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            # Cut short by a crash mid-write: kept for a person to look at.
            rejected.append(json.dumps({"unreadable_spool_line": line}))
            continue
        try:
            if isinstance(data, list) and data and data[0] in _COMPACT:
                # A compact line: the tag names the field order it was written in.
                data = {"type": WorkloadTransition.TYPE} | dict(
                    zip(_COMPACT[data[0]], data[1:], strict=True)
                )
            records.append(record_from_dict(data))
        except (RecordError, TypeError, ValueError, AttributeError) as err:
            fields = data if isinstance(data, dict) else {"value": data}
            rejected.append(json.dumps(fields | {"error": str(err)}))
    return records, rejected
