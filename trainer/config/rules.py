"""Checks that involve more than one value, or something outside the config (registries, files)."""

from __future__ import annotations

import difflib
import inspect
import math
import os
import re
from pathlib import Path
from typing import Any

from hybridflow.agents import ENVIRONMENTS
from hybridflow.algos import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATION_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    Registry,
    UnknownNameError,
    compares_group_samples,
)
from hybridflow.data import DataFileError, RowFormatError, read_prompt_rows
from hybridflow.data.files import file_format
from hybridflow.rewards.custom import load_reward_function
from hybridflow.rewards.registry import REWARD_FUNCTIONS
from trainer.config.problems import Problems
from trainer.config.schema import GLOBAL_POOL, ROLES, OptimizedRoleConfig, RewardConfig, RunConfig
from trainer.config.sizes import check_sizes, unknown_pool
from workers.objective import skips_zero_advantage_rows

__all__ = ["check_rules"]

# Estimators that read a per-token ``kl`` column when their ``kl_coef`` is not 0.
_KL_COLUMN_ESTIMATORS = ("reinforce_pp", "reinforce_pp_baseline")
# A rule on the sequence length stays quiet when one of these was rejected: their defaults stand in.
_LENGTH_KEYS = ("data.max_prompt_length", "data.max_response_length")
# A Hugging Face hub repository name: "name" or "org/name", of letters, digits, "-", "_" and ".".
_HUB_NAME = re.compile(r"(?!\.)[\w.-]+(/(?!\.)[\w.-]+)?", re.ASCII)


def check_rules(config: RunConfig, problems: Problems) -> None:
    """Record in ``problems`` every rule that ``config`` breaks."""
    check_sizes(config, problems)
    _check_names(config, problems)
    _check_algorithm(config, problems)
    _check_model(config, problems)
    _check_data(config, problems)
    _check_roles(config, problems)
    _check_resources(config, problems)
    _check_trainer(config, problems)
    _check_reward(config.reward, problems)
    _check_reward_model(config, problems)
    _check_teacher(config, problems)
    _check_agent(config, problems)


def _check_name(registry: Registry[Any], name: str, key: str, problems: Problems) -> None:
    try:
        registry.get(name)
    except UnknownNameError as error:
        problems.add(key, str(error))


def _check_names(config: RunConfig, problems: Problems) -> None:
    _check_name(ADVANTAGE_ESTIMATORS, config.algorithm.adv_estimator, "algorithm.adv_estimator", problems)
    _check_name(KL_ESTIMATORS, config.algorithm.kl_penalty, "algorithm.kl_penalty", problems)
    _check_name(POLICY_LOSSES, config.actor.policy_loss, "actor.policy_loss", problems)
    _check_name(AGGREGATION_MODES, config.actor.loss_agg_mode, "actor.loss_agg_mode", problems)
    _check_name(KL_ESTIMATORS, config.actor.kl_estimator, "actor.kl_estimator", problems)
    if config.critic is not None:
        _check_name(AGGREGATION_MODES, config.critic.loss_agg_mode, "critic.loss_agg_mode", problems)
    actor, algorithm = config.actor, config.algorithm
    if actor.policy_loss in POLICY_LOSSES:
        loss = POLICY_LOSSES.get(actor.policy_loss)
        # Set by the objective itself, never from the config.
        reserved = {"loss_agg_mode", "global_token_count", "global_seq_count", "norm_constant"}
        _check_keywords(loss, actor.policy_loss, actor.policy_loss_kwargs, "actor.policy_loss_kwargs", 4, reserved, problems)
    if algorithm.adv_estimator in ADVANTAGE_ESTIMATORS:
        estimator = ADVANTAGE_ESTIMATORS.get(algorithm.adv_estimator)
        _check_keywords(
            estimator, algorithm.adv_estimator, algorithm.estimator_kwargs, "algorithm.estimator_kwargs", 1, set(), problems
        )


def _keyword_names(fn: Any, positional: int) -> list[str] | None:
    """The keyword parameters of ``fn`` after its ``positional`` data arguments; None when it takes
    ``**kwargs`` (any name)."""
    parameters = list(inspect.signature(fn).parameters.values())[positional:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL]


def _check_keywords(
    fn: Any, name: str, kwargs: Any, key: str, positional: int, reserved: set[str], problems: Problems
) -> None:
    """Every entry of ``kwargs`` must be a keyword parameter of ``fn`` (registered as ``name``) after its
    ``positional`` data arguments and outside ``reserved``, unless ``fn`` takes ``**kwargs``."""
    taken = _keyword_names(fn, positional)
    if taken is None:
        return
    names = [name for name in taken if name not in reserved]
    for given in kwargs:
        if given not in names:
            close = difflib.get_close_matches(given, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.add(f"{key}.{given}", f"{name} takes no argument {given!r}{hint}; it takes {', '.join(names)}")


def _check_algorithm(config: RunConfig, problems: Problems) -> None:
    algorithm, actor = config.algorithm, config.actor
    group_relative = algorithm.adv_estimator in ADVANTAGE_ESTIMATORS and compares_group_samples(
        algorithm.adv_estimator
    )
    if group_relative and config.rollout.n < 2:
        problems.add(
            "rollout.n",
            f"must be >= 2 for algorithm.adv_estimator {algorithm.adv_estimator!r}, which compares the samples "
            f"of each prompt: with rollout.n={config.rollout.n} every group has one sample and every "
            "advantage is 0",
            "algorithm.adv_estimator",
        )
    if algorithm.adv_estimator == "gae" and config.critic is None:
        problems.add(
            "critic",
            "required when algorithm.adv_estimator is 'gae' (the estimator needs values); add a critic section",
            "algorithm.adv_estimator",
        )
    if algorithm.use_kl_in_reward and algorithm.kl_ctrl.type == "adaptive" and algorithm.kl_ctrl.kl_coef <= 0:
        problems.add(
            "algorithm.kl_ctrl.kl_coef",
            "must be > 0 for the adaptive controller (it scales the coefficient multiplicatively)",
        )
    registered = (
        actor.policy_loss in POLICY_LOSSES
        and actor.loss_agg_mode in AGGREGATION_MODES
        and actor.kl_estimator in KL_ESTIMATORS
    )
    if registered:
        try:
            skips_zero_advantage_rows(actor.skip_zero_advantage_rows, actor.objective())
        except ValueError as error:
            problems.add("actor.skip_zero_advantage_rows", str(error).removeprefix("actor.skip_zero_advantage_rows="))
    if actor.policy_loss in POLICY_LOSSES:
        taken = _keyword_names(POLICY_LOSSES.get(actor.policy_loss), 4)
        for name, value in actor.loss_arguments().items():
            if value is not None and taken is not None and name not in taken:
                problems.add(
                    f"actor.{name}",
                    f"policy loss {actor.policy_loss!r} takes no {name}; set it to null",
                    "actor.policy_loss",
                )
    estimator = algorithm.adv_estimator
    if estimator == "remax":
        problems.add(
            "algorithm.adv_estimator",
            "'remax' needs each prompt's greedy-response score (the batch column baseline_scores), and no "
            "step generates that greedy baseline yet; use grpo, rloo or reinforce_pp_baseline",
        )
    if estimator in _KL_COLUMN_ESTIMATORS and algorithm.estimator_kwargs.get("kl_coef", 0.0) != 0.0:
        problems.add(
            "algorithm.estimator_kwargs.kl_coef",
            f"{estimator!r} with a kl_coef reads a per-token kl column, and no step makes one; put the KL in "
            "the reward with algorithm.use_kl_in_reward (and algorithm.kl_ctrl.kl_coef) instead",
            "algorithm.adv_estimator",
        )


def _check_model(config: RunConfig, problems: Problems) -> None:
    for key, source in (("model.path", config.model.path), ("model.tokenizer", config.model.tokenizer)):
        if source is not None and (problem := _model_source_problem(source)) is not None:
            problems.add(key, problem)
    if config.model.path is not None:
        return
    tiny, tp = config.model.tiny, config.rollout.tp_size
    if tiny.hidden_size % tiny.num_heads:
        problems.add(
            "model.tiny.num_heads",
            f"{tiny.num_heads} does not divide model.tiny.hidden_size {tiny.hidden_size}",
            "model.tiny.hidden_size",
        )
    if tiny.num_heads % tiny.num_kv_heads:
        problems.add(
            "model.tiny.num_kv_heads",
            f"{tiny.num_kv_heads} does not divide model.tiny.num_heads {tiny.num_heads}",
            "model.tiny.num_heads",
        )
    if tiny.num_kv_heads % tp:
        problems.add(
            "rollout.tp_size",
            f"{tp} does not divide model.tiny.num_kv_heads {tiny.num_kv_heads} (each TP rank needs whole KV heads)",
            "model.tiny.num_kv_heads",
        )
    longest = config.data.max_prompt_length + config.data.max_response_length
    if tiny.max_position_embeddings < longest:
        problems.add(
            "model.tiny.max_position_embeddings",
            f"{tiny.max_position_embeddings} is shorter than data.max_prompt_length + "
            f"data.max_response_length = {longest}",
            *_LENGTH_KEYS,
        )


def _model_source_problem(source: str) -> str | None:
    """Why ``source`` is neither a folder nor a hub name (``name`` or ``org/name``, fetched when the
    run starts), or None."""
    path = Path(source)
    if path.is_dir():
        return None
    if path.exists():
        return f"{source!r} is a file, not a folder"
    if _HUB_NAME.fullmatch(source):
        return None
    return f"folder {source!r} not found (nor is it a hub name such as 'org/model')"


def _check_data(config: RunConfig, problems: Problems) -> None:
    if not config.data.train_files:
        problems.add("data.train_files", "required: list at least one parquet or jsonl file")
    files = {"data.train_files": config.data.train_files, "data.val_files": config.data.val_files}
    for key, paths in files.items():
        for i, path in enumerate(paths):
            if not Path(path).is_file():
                problems.add(f"{key}[{i}]", f"file {path!r} not found")
            elif (problem := _dataset_file_problem(Path(path), config.data.prompt_key)) is not None:
                problems.add(f"{key}[{i}]", problem)
    top_ks = {
        "rollout.top_k": config.rollout.top_k,
        "rollout.val_sampling.top_k": config.rollout.val_sampling.top_k,
    }
    for key, top_k in top_ks.items():
        if top_k == 0:
            problems.add(key, "must be -1 (disabled) or >= 1, got 0")


def _dataset_file_problem(path: Path, prompt_key: str) -> str | None:
    """What keeps an existing dataset file from giving prompts (a format not known by its suffix, no
    bytes, an unreadable parquet footer, no rows, a line or row that cannot be read or breaks the row
    layout: the first one, by file, row and field), or None. Reads the rows as the trainer's
    `PromptDataset` will, without tokenizing them."""
    try:
        fmt = file_format(path)
    except ValueError as error:
        return str(error)
    if path.stat().st_size == 0:
        return f"file {str(path)!r} is empty (0 bytes)"
    if fmt == "parquet":
        import pyarrow.parquet  # deferred: only needed when a parquet file is configured

        try:
            rows = pyarrow.parquet.read_metadata(path).num_rows
        except Exception as error:
            detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            return f"file {str(path)!r} is not a readable parquet file ({detail})"
    else:
        with path.open(encoding="utf-8", errors="replace") as lines:
            rows = int(any(line.strip() for line in lines))
    if rows == 0:
        return f"file {str(path)!r} holds no rows"
    try:
        read_prompt_rows(path, prompt_key)
    except (DataFileError, RowFormatError) as error:
        return str(error)
    return None


def _check_roles(config: RunConfig, problems: Problems) -> None:
    longest = config.data.max_prompt_length + config.data.max_response_length
    batching = [
        ("actor", config.actor),
        ("ref", config.ref),
        ("critic", config.critic),
        ("reward_model", config.reward_model),
        ("teacher", config.teacher),
    ]
    for section, role in batching:
        if role is not None and role.dynamic_batching and role.max_tokens_per_micro_batch < longest:
            problems.add(
                f"{section}.max_tokens_per_micro_batch",
                f"{role.max_tokens_per_micro_batch} cannot hold one sequence of data.max_prompt_length + "
                f"data.max_response_length = {longest} tokens",
                *_LENGTH_KEYS,
            )
    trained: list[tuple[str, OptimizedRoleConfig | None]] = [
        ("actor", config.actor),
        ("critic", config.critic),
    ]
    for section, role in trained:
        if role is not None and (len(role.betas) != 2 or not all(0 <= beta < 1 for beta in role.betas)):
            problems.add(f"{section}.betas", f"must be two numbers in [0, 1), got {list(role.betas)}")


def _check_resources(config: RunConfig, problems: Problems) -> None:
    resource = config.resource
    if GLOBAL_POOL in resource.pools:
        problems.add(f"resource.pools.{GLOBAL_POOL}", "reserved for the default pool; pick another name")
    for role in resource.placement:
        key = f"resource.placement.{role}"
        if role not in ROLES:
            close = difflib.get_close_matches(role, ROLES, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            problems.add(key, f"unknown role; {hint}roles: {', '.join(ROLES)}")
        elif (problem := unknown_pool(config, role)) is not None:
            problems.add(key, problem)
    custom = {"resource.custom_resources": resource.custom_resources}
    custom.update({f"resource.pools.{name}.custom_resources": pool.custom_resources for name, pool in resource.pools.items()})
    for key, amounts in custom.items():
        for name, amount in amounts.items():
            if not amount > 0:
                problems.add(f"{key}.{name}", f"must be a positive amount of the resource, got {amount}")
    if resource.splits_rollout and config.agent is not None:
        problems.add(
            "resource.placement.rollout",
            "multi-turn episodes (agent) run only on the colocated engine; leave the rollout on the actor's pool",
            "agent",
        )
    partial = config.async_rollout.partial_round_tokens
    if partial > 0 and config.async_rollout.max_staleness == 0:
        problems.add(
            "async_rollout.partial_round_tokens",
            f"{partial} pauses samples from one step to the next, which trains tokens of earlier versions; "
            "set async_rollout.max_staleness >= 1 (the bound on every token's staleness) or set it to 0",
            "async_rollout.max_staleness",
        )
    if partial > 0 and config.agent is not None:
        problems.add(
            "async_rollout.partial_round_tokens",
            f"{partial} pauses single-turn samples; multi-turn episodes (agent) cannot pause; set it to 0",
            "agent",
        )
    if config.async_rollout.max_staleness > 0 and not resource.splits_rollout and partial == 0:
        problems.add(
            "async_rollout.max_staleness",
            f"{config.async_rollout.max_staleness} generates ahead of the trainer, which needs the rollout on a "
            "pool of its own (resource.placement.rollout); the colocated engine shares the trainer's processes "
            "(or partial rollouts: async_rollout.partial_round_tokens > 0)",
        )
    if config.async_rollout.max_staleness > 0 and config.resharding.max_log_prob_gap is not None:
        problems.add(
            "resharding.max_log_prob_gap",
            "rows generated ahead carry an older policy's log-probs, so the rollout-vs-trainer gap measures "
            "the updates in between, not the weight push; leave it null with async_rollout.max_staleness > 0",
            "async_rollout.max_staleness",
        )


def _check_trainer(config: RunConfig, problems: Problems) -> None:
    trainer = config.trainer
    if trainer.val_every > 0 and not config.data.val_files:
        problems.add(
            "trainer.val_every", f"validation every {trainer.val_every} steps needs data.val_files", "data.val_files"
        )
    if trainer.resume not in ("auto", "disable") and not Path(trainer.resume).exists():
        problems.add(
            "trainer.resume", f"checkpoint {trainer.resume!r} does not exist (or use 'auto' / 'disable')"
        )
    if (problem := _folder_problem(trainer.output_dir)) is not None:
        problems.add("trainer.output_dir", problem)
    if (problem := _folder_problem(trainer.checkpoint_dir)) is not None:
        # By default the checkpoint folder sits inside the output folder: one mistake, one message.
        problems.add("trainer.checkpoint_dir", problem, "trainer.output_dir")
    duplicates = sorted({name for name in trainer.loggers if trainer.loggers.count(name) > 1})
    if duplicates:
        problems.add("trainer.loggers", f"listed more than once: {', '.join(duplicates)}")
    if not trainer.experiment:
        problems.add(
            "trainer.experiment", "must not be empty (it names the output folder and the logged run)"
        )


def _folder_problem(folder: str) -> str | None:
    """Why ``folder`` cannot be used (or created) as an output folder, or None."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        return f"{folder!r} is an existing file, not a folder"
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{folder!r} cannot be created: {str(existing)!r} is a file"
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        return f"{folder!r} cannot be written: {str(existing)!r} is on a read-only filesystem"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{folder!r} cannot be written: no write permission in {str(existing)!r}"
    return None


def _check_reward(reward: RewardConfig, problems: Problems) -> None:
    specs = {"reward.default_fn": reward.default_fn}
    specs.update({f"reward.fn_by_source.{source}": spec for source, spec in reward.fn_by_source.items()})
    for key, spec in specs.items():
        if not spec:
            problems.add(key, "must name a reward function or 'file.py:function'")
        elif ":" in spec:
            file, _, function = spec.rpartition(":")
            if not function or not Path(file).is_file():
                problems.add(key, f"{spec!r}: expected 'file.py:function' naming an existing file")
                continue
            # The file runs here, as it would in the reward manager, so that a missing function or a
            # file that fails to import is reported now rather than after the workers started.
            try:
                load_reward_function(file, function)
            except (ImportError, AttributeError, TypeError) as error:
                problems.add(key, str(error))
        elif spec not in REWARD_FUNCTIONS:
            problems.add(key, _unregistered_reward(spec))
    for i, step in enumerate(reward.shaping):
        if not step.name:
            problems.add(f"reward.shaping[{i}].name", "required: the registered shaping name")


def _unregistered_reward(name: str) -> str:
    """The message for a reward name that no module registered, with the closest registered name."""
    registered = sorted(REWARD_FUNCTIONS)
    close = difflib.get_close_matches(name, registered, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (
        f"no reward function registered as {name!r}; {hint}registered: {', '.join(registered)} "
        "(or give 'file.py:function')"
    )


def _check_reward_model(config: RunConfig, problems: Problems) -> None:
    reward_model = config.reward_model
    if reward_model is None:
        return
    if reward_model.path is None:
        problems.add(
            "reward_model.path",
            "required: a local sequence-classification model directory (or set reward_model to null)",
        )
    elif not Path(reward_model.path).is_dir():
        problems.add("reward_model.path", f"directory {reward_model.path!r} not found")
    if reward_model.tokenizer is not None and not Path(reward_model.tokenizer).is_dir():
        problems.add("reward_model.tokenizer", f"directory {reward_model.tokenizer!r} not found")
    if not math.isfinite(reward_model.weight):
        problems.add("reward_model.weight", f"must be a finite number, got {reward_model.weight}")


def _check_teacher(config: RunConfig, problems: Problems) -> None:
    teacher = config.teacher
    if teacher is None:
        return
    if teacher.path is None:
        problems.add("teacher.path", "required: a local causal-LM model directory (or set teacher to null)")
    elif not Path(teacher.path).is_dir():
        problems.add("teacher.path", f"directory {teacher.path!r} not found")


def _check_agent(config: RunConfig, problems: Problems) -> None:
    """The environment is registered and takes the given keywords; an episode fits the engine."""
    agent = config.agent
    if agent is None:
        return
    if agent.environment not in ENVIRONMENTS:
        registered = sorted(ENVIRONMENTS)
        close = difflib.get_close_matches(agent.environment, registered, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        problems.add(
            "agent.environment",
            f"no environment registered as {agent.environment!r}; {hint}registered: {', '.join(registered)}",
        )
    else:
        factory = ENVIRONMENTS[agent.environment]
        _check_keywords(
            factory, agent.environment, agent.environment_kwargs, "agent.environment_kwargs", 0, set(), problems
        )
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        for parameter in inspect.signature(factory).parameters.values():
            required = parameter.kind in kinds and parameter.default is parameter.empty
            if required and parameter.name not in agent.environment_kwargs:
                problems.add(
                    f"agent.environment_kwargs.{parameter.name}",
                    f"required: environment {agent.environment!r} takes it without a default",
                )
    data = config.data
    if agent.max_total_tokens <= data.max_prompt_length:
        problems.add(
            "agent.max_total_tokens",
            f"{agent.max_total_tokens} leaves no room for a turn after a prompt of data.max_prompt_length="
            f"{data.max_prompt_length}",
            *_LENGTH_KEYS,
        )
    engine_length = data.max_prompt_length + data.max_response_length
    if agent.max_total_tokens > engine_length:
        problems.add(
            "agent.max_total_tokens",
            f"{agent.max_total_tokens} exceeds the engine's max_model_len (data.max_prompt_length + "
            f"data.max_response_length = {engine_length})",
            *_LENGTH_KEYS,
        )
