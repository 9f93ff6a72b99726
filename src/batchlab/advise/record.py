"""The advice record: what ``batchlab advise`` measured and decided, kept in the store beside the tables.

One JSON file per advice, ``<store>/advice/<advice_id>.json`` (:data:`batchlab.store.schema.ADVICE_DIR`;
the format is in docs/methods.md, "The advice record"), written atomically (a temporary name in the
same directory, then a rename) after every round, so a reader or a crash never sees half a record. The
id digests the settings that define the advice (workload, optimizer, the sweep id of its studies,
objective, target ratio, budget, candidates, bracket rule, seed, level, device type), so a re-run of the
same command finds its record and resumes, and another advice on the same store keeps its own. The
studies themselves are ordinary studies of the store: the record only says which advise ran and why.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from batchlab.errors import BatchlabError

#: The record's ``format`` and ``version``.
FORMAT = "batchlab-advice"
VERSION = 1


def advice_id(settings: dict[str, Any]) -> str:
    """12 hex digits of the SHA-256 of ``settings`` (JSON, sorted keys): the advice's id."""
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def record_path(store_path: str | Path, identifier: str) -> Path:
    """``<store>/advice/<identifier>.json``."""
    from batchlab.store.schema import ADVICE_DIR

    return Path(store_path) / ADVICE_DIR / f"{identifier}.json"


def read_record(store_path: str | Path, identifier: str) -> dict | None:
    """The stored record of ``identifier``, or ``None`` when there is none yet.

    Raises:
        BatchlabError: the file exists but is not a record of this format (one line; the file is left
            as it is: advise never overwrites what it cannot read).
    """
    path = record_path(store_path, identifier)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BatchlabError(f"advice record {path} is unreadable ({type(exc).__name__}); move it away to start "
                            "this advice afresh (its studies stay in the store)") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("version") != VERSION:
        raise BatchlabError(f"advice record {path} is not a {FORMAT} version {VERSION} record; move it away to "
                            "start this advice afresh")
    return record


def write_record(store_path: str | Path, record: dict) -> Path:
    """Write ``record`` atomically to its path (``record["advice_id"]``) and return the path.

    Raises:
        BatchlabError: the store's directory cannot be written (a full disk, a read-only directory):
            one line; the previous record, if any, is unchanged.
    """
    from batchlab.advise.unit_points import plain
    from batchlab.store.files import store_writes, write_bytes_atomic

    path = record_path(store_path, record["advice_id"])
    data = json.dumps(plain(record), indent=1, sort_keys=True).encode()
    with store_writes(Path(store_path), "write the advice record"):
        path.parent.mkdir(exist_ok=True)
        write_bytes_atomic(path, data)
    return path
