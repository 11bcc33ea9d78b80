"""Importers: Kueue's, KAI-Scheduler's and Volcano's queue objects as Muster manifests.

`import_documents(source, files)` takes the decoded YAML documents of each file and returns
the Muster manifests, the source's pending work as Workloads, and every field that could
not be carried over with the reason (`quota.importers.report`). Pure: the command line
(`controllers/cli/importer.py`) reads the files and writes the result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from quota.importers.kai import import_kai
from quota.importers.kueue import import_kueue
from quota.importers.reader import SourceObject, read_objects
from quota.importers.report import ImportInputError, ImportResult, Unmapped
from quota.importers.volcano import import_volcano
from quota.importers.workloads import unique

__all__ = ["SOURCES", "ImportInputError", "ImportResult", "Unmapped", "import_documents"]

SOURCES: dict[str, Callable[[Sequence[SourceObject]], ImportResult]] = {
    "kueue": import_kueue,
    "kai": import_kai,
    "volcano": import_volcano,
}


def import_documents(source: str, files: Sequence[tuple[str, Sequence[Any]]]) -> ImportResult:
    """Import the documents of `files` ((name, documents) pairs) written for `source`."""
    result = SOURCES[source](read_objects(files))
    unique(result.workloads)
    return result
