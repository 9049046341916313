"""A run's output folder belongs to one run: which run starts or goes on there, decided before Ray starts.

`open_run(config)` picks the checkpoint to resume from (``trainer.resume``) and the run's identity
(`hybridflow.checkpoint.RunIdentity`: a run id, new on a fresh start and kept on resume, and a hash of
the config), and records it in ``<output_dir>/run.json``:

- an explicit ``trainer.resume=<folder>`` must be a complete checkpoint (marker, sizes, checksums), else
  `RunFolderError` names the folder and what is wrong;
- a fresh start (``trainer.resume=disable``, or ``auto`` finding no complete checkpoint) in a folder
  that holds another run's metrics or checkpoints does what ``trainer.existing_output`` says: ``refuse``
  (`RunFolderError`, naming the folder, what it holds and the ways out), ``archive`` (move them into
  ``<output_dir>/archive/<UTC time>/``) or ``delete``; each says what it did;
- a resumed checkpoint whose config differs from this one's is taken with a warning naming the keys
  (those of `FREE_KEYS` may differ freely), unless one is of `PINNED_KEYS` (`RunFolderError`);
  differing optimizer settings (`OPTIMIZER_FIELDS`) get a warning of their own: the config wins
  (`workers.training.load_training_state`).

`RunFolderError` is a `ConfigError` under ``trainer.output_dir`` or ``trainer.resume``: the command
exits with code 2, before any process starts.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hybridflow.checkpoint import (
    RUN_FILE,
    Checkpoint,
    CheckpointStore,
    IncompleteCheckpointError,
    RunIdentity,
    differing_keys,
    flat_config,
    new_run_id,
    read_run_file,
    write_run_file,
)
from hybridflow.metrics.loggers.factory import METRICS_FILE, TENSORBOARD_DIR
from hybridflow.metrics.rollout_dump import ROLLOUT_DUMP_DIR
from trainer.config import ConfigError, RunConfig, config_to_dict

__all__ = [
    "ARCHIVE_DIR",
    "FREE_KEYS",
    "OPTIMIZER_FIELDS",
    "PINNED_KEYS",
    "RunFolderError",
    "RunStart",
    "open_run",
]

log = logging.getLogger(__name__)

FREE_KEYS = (
    "trainer.total_steps",
    "trainer.total_epochs",
    "trainer.resume",
    "trainer.existing_output",
    "trainer.val_every",
    "trainer.val_before_train",
    "trainer.save_every",
    "trainer.checkpoint_dir",
    "trainer.output_dir",
    "trainer.loggers",
    "trainer.console",
    "trainer.wandb_mode",
    "trainer.project",
    "trainer.experiment",
)
"""Keys that may differ between a checkpoint's run and the run resuming it (its length, validation and
saving cadence, where it writes, how it logs): left out of the config hash and of the differences named."""

OPTIMIZER_FIELDS = (
    "lr",
    "lr_scheduler",
    "warmup_steps",
    "min_lr_ratio",
    "betas",
    "weight_decay",
    "grad_clip",
)
"""The optimizer settings of ``actor`` and ``critic`` whose change on resume is named on its own: the
config's values win over the checkpoint's."""

PINNED_KEYS = ("data.seed", "data.shuffle", "data.train_batch_size")
"""Keys a resumed run must share with its checkpoint: the saved data position (epoch, batch) means
nothing under another prompt order or batch size, so a difference stops the run before Ray starts."""

ARCHIVE_DIR = "archive"
"""Where ``trainer.existing_output=archive`` moves an earlier run's outputs: ``<output_dir>/archive/<time>``."""

_RUN_OUTPUTS = (METRICS_FILE, RUN_FILE, TENSORBOARD_DIR, "wandb", ROLLOUT_DUMP_DIR)
"""What a run writes into its output folder beside the checkpoints (its log folder stays: a run started
through Ray already writes there)."""

_TRAINED_SECTIONS = ("actor", "critic")


class RunFolderError(ConfigError):
    """The output folder or the checkpoint to resume from cannot be used as asked; one problem, under
    ``trainer.output_dir`` or ``trainer.resume``."""


@dataclass(frozen=True)
class RunStart:
    """How a run starts: its ``identity`` and the ``checkpoint`` it resumes from (None: fresh)."""

    identity: RunIdentity
    checkpoint: Checkpoint | None


def open_run(config: RunConfig) -> RunStart:
    """Decide how the run of ``config`` starts in its output folder (see the module docstring), act on
    ``trainer.existing_output`` and write ``<output_dir>/run.json``. Reads no model and starts nothing.

    Raises:
        RunFolderError: an explicit ``trainer.resume`` folder that is not a complete checkpoint, or a
            fresh start in a used folder under ``trainer.existing_output=refuse``.
    """
    trainer = config.trainer
    output_dir = Path(trainer.output_dir)
    store = CheckpointStore(trainer.checkpoint_dir)
    flat = flat_config(config_to_dict(config))
    checkpoint = _checkpoint_to_resume(config.trainer.resume, store)
    if checkpoint is None:
        _clear_for_fresh_start(config, store)
        identity = RunIdentity.of(new_run_id(), flat, FREE_KEYS)
        write_run_file(output_dir, identity, resumed_from=None)
        return RunStart(identity, None)
    identity = RunIdentity.of(_continued_run_id(checkpoint, flat, output_dir), flat, FREE_KEYS)
    write_run_file(output_dir, identity, resumed_from=str(checkpoint.path))
    return RunStart(identity, checkpoint)


def _checkpoint_to_resume(resume: str, store: CheckpointStore) -> Checkpoint | None:
    if resume == "disable":
        return None
    if resume == "auto":
        return store.latest()
    try:
        return store.load(resume)
    except IncompleteCheckpointError as error:
        raise RunFolderError(
            [f"trainer.resume: {error}; resume from a complete checkpoint, or use 'auto'"]
        ) from None


# ---------------------------------------------------------------------- a fresh start


@dataclass(frozen=True)
class _Held:
    """What an output folder holds of an earlier run."""

    checkpoint_steps: list[int]
    logged_steps: list[int]
    outputs: list[Path]
    run_id: str | None

    @property
    def used(self) -> bool:
        return bool(self.checkpoint_steps or self.logged_steps or self.outputs)

    def describe(self, store: CheckpointStore) -> str:
        parts = []
        if self.checkpoint_steps:
            count = len(self.checkpoint_steps)
            parts.append(
                f"{count} checkpoint{'s' if count != 1 else ''} in {store.root} (last step {self.checkpoint_steps[-1]})"
            )
        if self.logged_steps:
            parts.append(
                f"{METRICS_FILE} with {len(self.logged_steps)} logged steps (last step {self.logged_steps[-1]})"
            )
        elif any(path.name == METRICS_FILE for path in self.outputs):
            parts.append(f"{METRICS_FILE} with no training step")
        parts += [path.name for path in self.outputs if path.name != METRICS_FILE]
        run = f", written by run {self.run_id}" if self.run_id else ""
        return f"{', '.join(parts)}{run}"


def _held(output_dir: Path, store: CheckpointStore) -> _Held:
    # Only what a run writes counts: files with content, folders with files (anything else of the same
    # name is left for the logger that opens it to report).
    outputs = [
        path
        for path in (output_dir / name for name in _RUN_OUTPUTS)
        if (path.is_file() and path.stat().st_size > 0) or (path.is_dir() and any(path.iterdir()))
    ]
    metrics = output_dir / METRICS_FILE
    logged = _logged_steps(metrics) if metrics in outputs else []
    # A run.json alone is a run that stopped before its first step: nothing of it to keep.
    if [path.name for path in outputs] == [RUN_FILE]:
        outputs = []
    identity = read_run_file(output_dir)
    return _Held(store.steps(), logged, outputs, identity.run_id if identity else None)


def _logged_steps(path: Path) -> list[int]:
    """The distinct training steps (>= 1) recorded in a metrics file, in order; unreadable lines skipped."""
    steps = set()
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and step >= 1:
            steps.add(step)
    return sorted(steps)


def _clear_for_fresh_start(config: RunConfig, store: CheckpointStore) -> None:
    """Refuse, archive or delete what an earlier run left in the output folder (``trainer.existing_output``)."""
    trainer = config.trainer
    output_dir = Path(trainer.output_dir)
    held = _held(output_dir, store)
    if not held.used:
        return
    what = held.describe(store)
    how = (
        "trainer.resume=disable"
        if trainer.resume == "disable"
        else "trainer.resume=auto found no complete checkpoint"
    )
    if config.trainer.existing_output == "refuse":
        raise RunFolderError(
            [
                f"trainer.output_dir: {output_dir} already holds another run's outputs: {what}. A fresh start "
                f"({how}) would mix the two runs. Use a new trainer.output_dir, or set "
                f"trainer.existing_output=archive (moves them into {output_dir / ARCHIVE_DIR}/<time>) or "
                "trainer.existing_output=delete"
            ]
        )
    folders = [store.path_of(step) for step in held.checkpoint_steps]
    if config.trainer.existing_output == "archive":
        target = _new_folder(output_dir / ARCHIVE_DIR, time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
        for path in held.outputs:
            shutil.move(path, target / path.name)
        if folders:
            (target / "checkpoints").mkdir()
            for folder in folders:
                shutil.move(folder, target / "checkpoints" / folder.name)
        log.warning("trainer.existing_output=archive: moved %s from %s into %s", what, output_dir, target)
        return
    for path in [*held.outputs, *folders]:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    log.warning(
        "trainer.existing_output=delete: deleted %s from %s (%s)",
        what,
        output_dir,
        ", ".join(str(path) for path in [*held.outputs, *folders]),
    )


def _new_folder(parent: Path, name: str) -> Path:
    """Create and return ``parent/name``, or ``parent/name-2``, ``-3``... when it exists (two archives
    in one second)."""
    parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        folder = parent / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"{parent}: no free name for an archive folder {name}")


# ---------------------------------------------------------------------- resuming


def _continued_run_id(checkpoint: Checkpoint, flat: dict[str, str], output_dir: Path) -> str:
    """The run id a resumed run goes on under (the checkpoint's), after warning about what differs."""
    run = checkpoint.run
    if run is None:
        run_id = new_run_id()
        log.warning(
            "resuming from %s, which carries no run id: the run goes on as run %s", checkpoint.path, run_id
        )
        return run_id
    folder_run = read_run_file(output_dir)
    if folder_run is not None and folder_run.run_id != run.run_id:
        log.warning(
            "resuming from %s of run %s, but %s records run %s: the folder's metrics and this checkpoint "
            "come from two runs",
            checkpoint.path,
            run.run_id,
            output_dir / RUN_FILE,
            folder_run.run_id,
        )
    current = RunIdentity.of(run.run_id, flat, FREE_KEYS)
    if current.config_hash != run.config_hash:
        keys = differing_keys(run.config, flat, FREE_KEYS)
        pinned = [key for key in keys if key in PINNED_KEYS]
        if pinned:
            raise RunFolderError(
                [
                    f"trainer.resume: checkpoint {checkpoint.path} was written with other data settings "
                    f"({_changes(pinned, run.config, flat)}): its data position holds only for its own "
                    "prompt order and batch size. Resume with the checkpoint's values, or start fresh in a "
                    "new trainer.output_dir"
                ]
            )
        log.warning(
            "resuming from %s of run %s, whose config differs from this one (config hash %s, now %s) in %d "
            "key(s): %s; the run goes on with this config",
            checkpoint.path,
            run.run_id,
            run.config_hash,
            current.config_hash,
            len(keys),
            _changes(keys, run.config, flat),
        )
    optimizer_keys = [f"{section}.{name}" for section in _TRAINED_SECTIONS for name in OPTIMIZER_FIELDS]
    changed = [key for key in optimizer_keys if run.config.get(key) != flat.get(key) and key in flat]
    if changed:
        log.warning(
            "the optimizer settings differ from the checkpoint's: %s. The config wins: after loading, the "
            "learning rate, schedule, betas and weight decay are set from the config (the optimizer's "
            "moments, its step count and the schedule's position come from the checkpoint), and grad_clip "
            "is read from the config at every step",
            _changes(changed, run.config, flat),
        )
    return run.run_id


def _changes(keys: list[str], before: Mapping[str, str], after: Mapping[str, str]) -> str:
    """``key old -> new`` for the first 12 of ``keys`` (values as JSON)."""
    shown = [f"{key} {before.get(key, '(unset)')} -> {after.get(key, '(unset)')}" for key in keys[:12]]
    more = f", and {len(keys) - 12} more" if len(keys) > 12 else ""
    return ", ".join(shown) + more
