"""Which run a checkpoint or an output folder belongs to: a run id and a hash of the run's config.

A run gets a new id when it starts fresh and keeps it when it resumes. The config is stored flat, as
sorted ``key -> value`` pairs (``"actor.lr" -> "0.0001"``, values in JSON), so that two runs' configs
can be compared key by key and the differing keys named. The hash covers every key except those the
caller names as free to differ between the runs of one folder (the run's length, logging, the resume
setting itself).

The identity is written into every checkpoint marker (:mod:`hybridflow.checkpoint.marker`) and into
``run.json`` next to the run's metrics (:data:`RUN_FILE`).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "RUN_FILE",
    "RunIdentity",
    "differing_keys",
    "flat_config",
    "new_run_id",
    "read_run_file",
    "write_run_file",
]

RUN_FILE = "run.json"
"""The run's identity in its output folder, next to ``metrics.jsonl``."""


@dataclass(frozen=True)
class RunIdentity:
    """A run: ``run_id`` (new on a fresh start, kept on resume), ``config_hash`` (hex SHA-256 prefix of
    the flat config without the keys free to differ) and ``config`` (the flat config, key -> JSON value)."""

    run_id: str
    config_hash: str
    config: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, run_id: str, config: Mapping[str, str], free_keys: Collection[str]) -> RunIdentity:
        """The identity of run ``run_id`` with the flat ``config``; ``free_keys`` (and the keys under
        them) are left out of the hash."""
        kept = [f"{key}={value}" for key, value in sorted(config.items()) if not _is_under(key, free_keys)]
        digest = hashlib.sha256("\n".join(kept).encode()).hexdigest()[:16]
        return cls(run_id, digest, dict(config))

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint marker or ``run.json``."""
        return {"run_id": self.run_id, "config_hash": self.config_hash, "config": dict(self.config)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunIdentity:
        """The inverse of `to_dict`.

        Raises:
            ValueError: ``data`` lacks the run id, the hash or the config, or holds them with other types.
        """
        run_id, config_hash, config = data.get("run_id"), data.get("config_hash"), data.get("config")
        if not isinstance(run_id, str) or not isinstance(config_hash, str) or not isinstance(config, dict):
            raise ValueError("a run identity needs a run_id, a config_hash and a config")
        return cls(run_id, config_hash, {str(key): str(value) for key, value in config.items()})


def new_run_id() -> str:
    """A new run id: the UTC start time and 8 random hex digits, e.g. ``20261202-013307-5f3a9c01``."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(4)}"


def flat_config(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested mapping as ``{"section.key": json_value}``, sorted by key; lists stay whole values."""
    flat: dict[str, str] = {}
    for name, value in tree.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if isinstance(value, Mapping) and value:
            flat.update(flat_config(value, key))
        else:
            flat[key] = json.dumps(value, sort_keys=True, default=str)
    return dict(sorted(flat.items()))


def differing_keys(
    first: Mapping[str, str], second: Mapping[str, str], free_keys: Collection[str] = ()
) -> list[str]:
    """The keys whose values differ between two flat configs (or that one lacks), sorted, without
    ``free_keys`` and the keys under them."""
    keys = set(first) | set(second)
    return sorted(k for k in keys if first.get(k) != second.get(k) and not _is_under(k, free_keys))


def write_run_file(output_dir: Path, identity: RunIdentity, **facts: Any) -> Path:
    """Write ``output_dir/run.json`` (the identity and ``facts`` such as the step resumed from)
    atomically; returns its path."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / RUN_FILE
    temporary = output_dir / f".{RUN_FILE}.{os.getpid()}.tmp"
    temporary.write_text(json.dumps({**identity.to_dict(), **facts}, indent=1, sort_keys=True) + "\n")
    os.replace(temporary, path)
    return path


def read_run_file(output_dir: Path) -> RunIdentity | None:
    """The identity in ``output_dir/run.json``; None when there is none or it cannot be read."""
    path = output_dir / RUN_FILE
    try:
        return RunIdentity.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, AttributeError):
        return None


def _is_under(key: str, prefixes: Collection[str]) -> bool:
    return any(key == prefix or key.startswith(f"{prefix}.") for prefix in prefixes)
