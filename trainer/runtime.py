"""`Runtime`: the resources an RL algorithm runs on, and their lifetime.

A `Runtime` builds and owns what every algorithm needs: the tokenizer and prompt data, the worker groups
(actor + rollout + reference, critic, reward model), the reward manager, the loggers, the phase timer, the
training monitor, the KL controller and the checkpoints. It does no work of an algorithm: the steps
(`trainer.steps`, `trainer.validation`) generate, score, decode and validate through it, and
`trainer.fit.fit` runs a step function over it::

    with start_ray(config), Runtime(config) as runtime:
        fit(runtime, rl_step)          # or a recipe's own step function
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import torch

from hybridflow.algos import build_kl_controller
from hybridflow.checkpoint import Checkpoint, CheckpointStore, training_state_bytes
from hybridflow.controller import RayWorkerGroup, Worker
from hybridflow.data import PromptDataset, PromptLoader
from hybridflow.metrics import PhaseTimer, create_logger
from hybridflow.metrics.monitor import TrainingMonitor
from hybridflow.metrics.rollout_dump import ROLLOUT_DUMP_DIR, RolloutDump
from hybridflow.metrics.startup import StartupTimer
from hybridflow.protocol import Batch
from hybridflow.rewards import RewardManager
from trainer.config import RunConfig, config_to_dict, derive_sizes
from trainer.model_setup import load_tokenizer, prepare_model_dir
from trainer.roles import build_pools, load_worker_groups, start_worker_groups
from trainer.rollout_queue import PARTIAL_FILE, PromptStream, RolloutQueue
from trainer.run_folder import RunStart, open_run
from trainer.weight_sync import connect_weight_group
from workers.teacher import check_same_vocabulary

__all__ = ["Runtime", "uncorrected_staleness"]

log = logging.getLogger(__name__)



def uncorrected_staleness(config: RunConfig) -> str | None:
    """A warning for rows trained off-policy without the rollout correction (None when there are none).

    With ``async_rollout.max_staleness > 0`` rows are sampled by older weights, and with
    ``actor.rollout_correction: none`` the update takes them as the current policy's samples. On the demo
    task at one-step-off that left held-out accuracy at 76.6% and 84.0% at step 170 (seeds 0 and 1)
    against 87.2% and 87.0% with ``token`` (docs/benchmarks.md, "Time to 80% on the demo: one-step-off
    against sync").
    """
    if config.async_rollout.max_staleness == 0 or config.actor.rollout_correction != "none":
        return None
    return (
        f"async_rollout.max_staleness={config.async_rollout.max_staleness} trains rows sampled by older "
        "weights, and actor.rollout_correction=none takes them as the current policy's: set "
        "actor.rollout_correction=token (docs/rollout_service.md, 'Off-policy tokens and the rollout "
        "correction'); on the demo task one-step-off reached 76.6% and 84.0% at step 170 without it (seeds 0 and 1), "
        "87.2% and 87.0% with it"
    )

class Runtime:
    """The resources of one run, built from ``config``: data, worker groups, reward manager, loggers.

    Args:
        config: the validated run config.
        worker_classes: a recipe's own worker class for a role, by role name (``actor_rollout``,
            ``critic``, ``reward_model``, ``teacher``): a subclass of the shipped class
            (`ActorRolloutRefWorker`, `CriticWorker`, `RewardModelWorker`, `TeacherWorker`), built with
            the same arguments, whose new ``@register``'ed methods the step function can call on
            ``runtime.actor`` (or ``runtime.critic``, ``runtime.reward_model``, ``runtime.teacher``).
        startup_s: seconds of start-up parts that ran before the runtime, by part name (such as
            ``{"ray": start_ray(...).seconds}``); they open the start-up report.
        run: how the run starts in its output folder (`trainer.run_folder.open_run`, which the command
            line calls before Ray starts); None calls it here, first, before anything is built.

    Attributes:
        run: the run's identity (written into every checkpoint) and the checkpoint it resumes from.
        rollout: the group that generates: ``actor`` itself (the colocated engine, the default) or,
            with ``resource.placement.rollout`` on a pool of its own, that pool's engines
            (`workers.rollout.RolloutWorker`; weights reach them through `trainer.weight_sync`).
        actor, critic, reward_model, teacher: the worker groups (``critic``, ``reward_model`` and
            ``teacher`` may be None).
        total_steps: the run's length in steps (``trainer.total_steps``, else ``trainer.total_epochs``
            epochs of prompts); the learning-rate schedule and the progress bar span it.
        step: the last step started (`begin_step`; 0 before training; `resume` sets a checkpoint's).
        timer: times the phases of the current step.
        monitor: watches every step's rollouts and metrics for reward drift, reward hacking and stalled
            learning (`hybridflow.metrics.monitor`).
        step_metrics: what the current step has recorded so far (`record`).
        prompts: the training prompts in data order (`trainer.rollout_queue.PromptStream`); steps take
            theirs through `next_prompts`, and generation ahead of the trainer looks further along it.
        rollouts_ahead: the prompt batches in flight on a rollout pool of its own
            (``async_rollout.max_staleness > 0``, `trainer.rollout_queue.RolloutQueue`).
        rollout_dump: with ``trainer.rollout_dump``, where `trainer.fit.run_step` writes the rows each step
            trained on (``<output_dir>/rollouts``, `hybridflow.metrics.rollout_dump.RolloutDump`); else None.
        startup: the start-up's parts (`hybridflow.metrics.startup.StartupTimer`): those of
            ``startup_s``, then ``data`` (tokenizer, datasets), ``reward``, ``placement`` (placement
            groups), ``processes`` (worker processes, process group, role objects), ``model`` (the
            slowest rank's model load and FSDP2 wrap; ``critic``, ``reward_model`` and ``teacher``
            likewise),
            ``engine`` (the rest of the load call: the rollout engine's start; the reward workers start
            alongside), ``loggers``; `trainer.fit.fit` adds ``resume`` and ``validation`` and logs
            ``startup/*`` once, before the first step.

    Use as a context manager (or call `close`) so worker processes and reward workers stop.
    """

    def __init__(
        self,
        config: RunConfig,
        worker_classes: Mapping[str, type[Worker]] | None = None,
        startup_s: Mapping[str, float] | None = None,
        run: RunStart | None = None,
    ) -> None:
        self.run = run if run is not None else open_run(config)
        self.startup = StartupTimer()
        for part, seconds in (startup_s or {}).items():
            self.startup.add(part, seconds)
        self.config = config
        self.sizes = derive_sizes(config)
        self.output_dir = Path(config.trainer.output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.model_dir = prepare_model_dir(config, self.output_dir)
        self.tokenizer = load_tokenizer(config, self.model_dir)
        if config.teacher is not None and config.teacher.path is not None:
            # The teacher reads the student's token ids: a vocabulary mismatch fails here, before Ray.
            check_same_vocabulary(self.tokenizer, config.model.tokenizer or self.model_dir, config.teacher.path)
        data = config.data
        self.train_data = PromptDataset(
            data.train_files, self.tokenizer, data.max_prompt_length, prompt_key=data.prompt_key
        )
        self.val_data = (
            PromptDataset(data.val_files, self.tokenizer, data.max_prompt_length, prompt_key=data.prompt_key)
            if data.val_files
            else None
        )
        self.loader = PromptLoader(
            self.train_data,
            data.train_batch_size,
            self.tokenizer.pad_token_id,
            seed=data.seed,
            shuffle=data.shuffle,
        )
        steps_per_epoch = len(self.loader)
        if steps_per_epoch == 0:
            raise ValueError(
                f"data.train_batch_size={data.train_batch_size} exceeds the {len(self.train_data)} training prompts"
            )
        self.total_steps = config.trainer.total_steps or config.trainer.total_epochs * steps_per_epoch
        kl = config.algorithm.kl_ctrl
        self.kl_ctrl = (
            build_kl_controller(kl.type, kl.kl_coef, kl.target_kl, kl.horizon)
            if config.algorithm.use_kl_in_reward
            else None
        )
        self.timer = PhaseTimer()
        self.monitor = TrainingMonitor(
            config.monitor,
            optimizer_steps_per_batch=self.sizes.actor.optimizer_steps_per_step,
            loss_agg_mode=config.actor.loss_agg_mode,
        )
        self.step = 0
        self.step_metrics: dict[str, float] = {}
        self.startup.lap("data")
        # From here on everything built holds processes, placement groups or open files. Each is
        # registered for `close` as soon as it exists: if a later part fails, the `with` block stops
        # what was built (in reverse order) before the error propagates, so a failed construction
        # leaves nothing running.
        with ExitStack() as resources:
            # The reward functions resolve here: a wrong name fails before any worker process starts.
            self.reward = RewardManager(config.reward)
            resources.callback(self.reward.close)
            self.startup.lap("reward")
            self.pools = build_pools(config)
            for pool in self.pools.values():
                resources.callback(pool.release)
            self.startup.lap("placement")
            self.groups = start_worker_groups(
                config, self.sizes, self.total_steps, self.model_dir, self.pools, worker_classes or {}
            )
            resources.callback(self._stop_workers)
            self.startup.lap("processes")
            # The reward workers start while the ranks load: the controller only waits there, and the
            # reward pool's start (its process server imports the main script) would otherwise land on
            # the first validation or step.
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-start") as background:
                reward_started = background.submit(self.reward.start)
                reports = load_worker_groups(self.groups)
                reward_started.result()
            self.startup.lap("engine", within=_load_seconds(reports))
            self.actor: RayWorkerGroup = self.groups["actor_rollout"]
            # The group that generates: the actor's own (colocated engine) or the rollout pool's.
            self.rollout: RayWorkerGroup = self.groups.get("rollout", self.actor)
            if self.rollout is not self.actor:
                connect_weight_group(self.actor, self.rollout)
            self.critic: RayWorkerGroup | None = self.groups.get("critic")
            self.reward_model: RayWorkerGroup | None = self.groups.get("reward_model")
            self.teacher: RayWorkerGroup | None = self.groups.get("teacher")
            self.logger = create_logger(
                config.trainer.loggers,
                output_dir=self.output_dir,
                total_steps=self.total_steps,
                project=config.trainer.project,
                experiment=config.trainer.experiment,
                config=config_to_dict(config),
                wandb_mode=config.trainer.wandb_mode,
            )
            resources.callback(self.logger.close)
            self.startup.lap("loggers")
            self._resources = resources.pop_all()
        self.prompts = PromptStream(self.loader)
        self.rollouts_ahead = RolloutQueue(config.async_rollout.max_staleness)
        if (notice := uncorrected_staleness(config)) is not None:
            log.warning(notice)
        self.rollout_dump = RolloutDump(self.output_dir / ROLLOUT_DUMP_DIR) if config.trainer.rollout_dump else None

    # ------------------------------------------------------------------ the step's data

    def begin_step(self) -> int:
        """Start the next step: ``step`` goes up by one and ``step_metrics`` starts empty; returns the step."""
        self.step += 1
        self.step_metrics = {}
        return self.step

    def next_prompts(self) -> Batch:
        """The next ``data.train_batch_size`` prompts, epoch after epoch; the data position is saved with
        every checkpoint (batches generated ahead of the trainer but not yet handed out are not counted
        in it). A step that needs more prompts than its own (dynamic sampling) calls this."""
        return self.prompts.next()

    def record(self, metrics: Mapping[str, float]) -> None:
        """Add ``metrics`` to the current step's metrics (a later value of a key replaces an earlier)."""
        self.step_metrics.update(metrics)

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self) -> Path:
        """Write ``checkpoint_dir/step_{k}`` through `hybridflow.checkpoint.CheckpointStore`: the actor's
        (and critic's) distributed checkpoints, then the marker holding the controller's state (data
        position, KL coefficient, the training monitor's windows) and the run's identity, which makes it
        complete. With partial rollouts (``async_rollout.partial_round_tokens > 0``) the folder also
        holds `trainer.rollout_queue.PARTIAL_FILE`: the samples of the prompts started and not yet
        trained, so that a resumed run continues them (`resume`); with the rollout on a pool of its own,
        the save waits for the round left running there and keeps its tokens too. A full disk
        raises `DiskFullError` naming the step and the space needed and free, and leaves no partial
        folder behind."""

        def write_parts(path: Path) -> None:
            self.actor.save_checkpoint(str(path / "actor"))
            if self.critic is not None:
                self.critic.save_checkpoint(str(path / "critic"))
            if self.config.async_rollout.partial_round_tokens:
                torch.save(self.rollouts_ahead.partial.state_dict(), path / PARTIAL_FILE)

        # A round left running on the rollout pool is settled into the checkpoint (PartialPool.state_dict
        # waits for it): the batch it started is then handed out as far as the checkpoint is concerned.
        pending = self.rollouts_ahead.partial.pending
        state = {
            "loader": self.prompts.state_dict(started=pending.admitted if pending is not None else None),
            "kl_coef": None if self.kl_ctrl is None else self.kl_ctrl.value,
            "monitor": self.monitor.state_dict(),
        }
        size_hint = training_state_bytes(self.model_dir, trained_models=1 if self.critic is None else 2)
        store = CheckpointStore(self.config.trainer.checkpoint_dir)
        return store.save(self.step, state, write_parts, size_hint, run=self.run.identity)

    def resume(self) -> Checkpoint | None:
        """Load the checkpoint that `open_run` chose from ``trainer.resume`` (``auto``: the newest complete
        one under ``trainer.checkpoint_dir``, skipping torn folders with a warning; ``disable``: none) and
        return it, or None on a fresh start.

        Loading brings back the actor's (and critic's) weights, optimizer state and schedule position
        (the optimizer settings themselves come from the config), the data position, the KL coefficient
        and the monitor's windows, and sets ``step`` to the checkpoint's. With partial rollouts the
        checkpoint's paused samples go back into ``rollouts_ahead.partial`` and their prompts are held
        again: the resumed steps continue them where they paused (held prompts the checkpoint has no
        samples of, such as one written before the file existed, are started again). Either way the
        loggers (and the rollout dump) drop the records of the steps this run logs again, so each step
        appears once.
        """
        checkpoint = self.run.checkpoint
        if checkpoint is not None:
            self.actor.load_checkpoint(str(checkpoint.path / "actor"))
            if self.critic is not None:
                self.critic.load_checkpoint(str(checkpoint.path / "critic"))
            self.prompts = PromptStream(self.loader)
            partial = self.rollouts_ahead.partial
            saved = checkpoint.path / PARTIAL_FILE
            if self.config.async_rollout.partial_round_tokens and saved.exists():
                partial.load_state_dict(
                    torch.load(saved, weights_only=True), self.train_data, self.tokenizer.pad_token_id
                )
            kept = [group.index for group in partial.groups]
            self.prompts.load_state_dict(checkpoint.state["loader"], kept=kept)
            if self.kl_ctrl is not None and checkpoint.state["kl_coef"] is not None:
                self.kl_ctrl.value = checkpoint.state["kl_coef"]
            if "monitor" in checkpoint.state:  # checkpoints written before the monitor existed lack it
                self.monitor.load_state_dict(checkpoint.state["monitor"])
            self.step = checkpoint.step
            log.warning("resumed from %s at step %d", checkpoint.path, self.step)
        self.logger.rewind(self.step + 1 if checkpoint is not None else 0)
        if self.rollout_dump is not None:
            self.rollout_dump.rewind(self.step + 1 if checkpoint is not None else 0)
        return checkpoint

    # ------------------------------------------------------------------ helpers

    def _stop_workers(self) -> None:
        # Colocated roles share their processes: stop each set of processes once.
        for hosts in {id(group.hosts): group.hosts for group in self.groups.values()}.values():
            hosts.shutdown()

    def close(self) -> None:
        """Stop the loggers, the worker processes, their placement groups and the reward workers.

        Each part is stopped even if stopping another fails; calling it again does nothing.
        """
        self._resources.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_LOAD_REPORTS = {
    "actor_rollout": ("model", "init/load_s"),
    "critic": ("critic", "init/critic_load_s"),
    "reward_model": ("reward_model", "init/reward_model_load_s"),
    "rollout": ("rollout_engine", "init/rollout_engine_s"),
    "teacher": ("teacher", "init/teacher_load_s"),
}
"""Per role: the start-up part its model loading counts towards, and the key of its ``init_model`` report."""


def _load_seconds(reports: Mapping[str, list[dict[str, float]]]) -> dict[str, float]:
    """The slowest rank's model-loading seconds per start-up part (`_LOAD_REPORTS`), from the groups'
    ``init_model`` reports; a role whose class reports none is left out."""
    out: dict[str, float] = {}
    for role, ranks in reports.items():
        part, key = _LOAD_REPORTS[role]
        seconds = [report[key] for report in ranks if isinstance(report, Mapping) and key in report]
        if seconds:
            out[part] = max(seconds)
    return out
