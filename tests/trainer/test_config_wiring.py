"""Every key documented in docs/config.md reaches the component that uses it.

For each documented leaf key the test builds what the trainer builds from a config (`trainer.roles`'s
component settings, `derive_sizes`, the pools, the placement, the estimator's arguments) once from a
base config and once with that key changed to another valid value, and asserts the two differ. The keys
that the runtime reads itself (the loop, the data loader, the model setup) are listed in
``RUNTIME_READS`` with the file and the expression that reads them, and that expression must be in
that file; the ``monitor`` section is handed whole to the `TrainingMonitor`, so each of its fields must
be read by the monitor's code. A key that is none of these (documented and validated, but read by
nobody) fails the test. No Ray, no models: the settings are plain dataclasses.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import pytest

from hybridflow.data import write_rows
from hybridflow.metrics.monitor import MonitorConfig
from hybridflow.resharding.manager import ReshardingConfig
from hybridflow.rewards import RewardConfig as RewardManagerConfig
from hybridflow.rollout.config import RolloutConfig as EngineConfig
from tests.trainer._config_docs import documented_defaults
from trainer.config import ROLES, RunConfig, derive_sizes, load_config
from trainer.roles import (
    actor_rollout_options,
    actor_settings,
    build_pools,
    critic_settings,
    engine_settings,
    model_settings,
    resharding_settings,
    reward_model_settings,
    reward_settings,
)
from workers.config import ActorConfig, ModelConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
MONITOR_DIR = REPO_ROOT / "hybridflow" / "metrics" / "monitor"
TOTAL_STEPS = 10
MODEL_DIR = Path("model")

RUNTIME_READS: dict[str, tuple[str, str]] = {
    # key: (file that reads it, the expression that reads it)
    "model.path": ("trainer/model_setup.py", "config.model.path"),
    "model.tokenizer": ("trainer/model_setup.py", "config.model.tokenizer"),
    **{
        f"model.tiny.{name}": ("trainer/model_setup.py", f"tiny.{name}")
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "max_position_embeddings",
            "initializer_range",
            "seed",
        )
    },
    "data.train_files": ("trainer/rl_trainer.py", "data.train_files"),
    "data.val_files": ("trainer/rl_trainer.py", "data.val_files"),
    "data.prompt_key": ("trainer/rl_trainer.py", "prompt_key=data.prompt_key"),
    "data.val_batch_size": ("trainer/rl_trainer.py", "self.config.data.val_batch_size"),
    "data.shuffle": ("trainer/rl_trainer.py", "shuffle=data.shuffle"),
    "rollout.temperature": ("trainer/steps.py", "trainer.config.rollout.temperature"),
    "rollout.top_p": ("trainer/steps.py", "top_p=rollout.top_p"),
    "rollout.top_k": ("trainer/steps.py", "top_k=rollout.top_k"),
    "rollout.val_sampling.n": ("trainer/rl_trainer.py", "n=val.n"),
    "rollout.val_sampling.temperature": ("trainer/rl_trainer.py", "temperature=val.temperature"),
    "rollout.val_sampling.top_p": ("trainer/rl_trainer.py", "top_p=val.top_p"),
    "rollout.val_sampling.top_k": ("trainer/rl_trainer.py", "top_k=val.top_k"),
    "reward_model.weight": ("trainer/rl_trainer.py", "settings.weight"),
    "algorithm.adv_estimator": ("trainer/steps.py", "algorithm.adv_estimator"),
    "algorithm.kl_penalty": ("trainer/steps.py", "algorithm.kl_penalty"),
    "algorithm.kl_ctrl.type": ("trainer/rl_trainer.py", "kl.type"),
    "algorithm.kl_ctrl.kl_coef": ("trainer/rl_trainer.py", "kl.kl_coef"),
    "algorithm.kl_ctrl.target_kl": ("trainer/rl_trainer.py", "kl.target_kl"),
    "algorithm.kl_ctrl.horizon": ("trainer/rl_trainer.py", "kl.horizon"),
    "resharding.max_log_prob_gap": ("trainer/fit.py", "config.resharding.max_log_prob_gap"),
    "trainer.total_epochs": ("trainer/rl_trainer.py", "config.trainer.total_epochs"),
    "trainer.total_steps": ("trainer/rl_trainer.py", "config.trainer.total_steps"),
    "trainer.val_every": ("trainer/fit.py", "config.val_every"),
    "trainer.val_before_train": ("trainer/fit.py", "config.val_before_train"),
    "trainer.save_every": ("trainer/fit.py", "config.save_every"),
    "trainer.checkpoint_dir": ("trainer/rl_trainer.py", "self.config.trainer.checkpoint_dir"),
    "trainer.resume": ("trainer/rl_trainer.py", "self.config.trainer.resume"),
    "trainer.loggers": ("trainer/rl_trainer.py", "config.trainer.loggers"),
    "trainer.console": ("trainer/ray_runtime.py", "config.trainer.console"),
    "trainer.project": ("trainer/rl_trainer.py", "config.trainer.project"),
    "trainer.experiment": ("trainer/rl_trainer.py", "config.trainer.experiment"),
    "trainer.output_dir": ("trainer/rl_trainer.py", "config.trainer.output_dir"),
    "trainer.wandb_mode": ("trainer/rl_trainer.py", "config.trainer.wandb_mode"),
    "recipe": ("trainer/config/recipe.py", "config.recipe"),
}

EXTRA_POOL = "resource.pools={extra: {nodes: 1, slots_per_node: 1}}"
SHAPING = "reward.shaping=[{name: overlong_penalty, kwargs: {max_response_length: 8, cache_length: 2}}]"

CONTEXT: dict[str, tuple[str, ...]] = {
    # overrides, applied to both configs, under which the key takes effect
    "actor.max_tokens_per_micro_batch": ("actor.dynamic_batching=true",),
    "critic.max_tokens_per_micro_batch": ("critic.dynamic_batching=true",),
    "ref.max_tokens_per_micro_batch": ("ref.dynamic_batching=true",),
    "reward_model.max_tokens_per_micro_batch": ("reward_model.dynamic_batching=true",),
    "actor.kl_loss_coef": ("actor.use_kl_loss=true",),
    "algorithm.gamma": ("algorithm.adv_estimator=gae",),
    "algorithm.lam": ("algorithm.adv_estimator=gae",),
    "resource.pools.<name>.nodes": (EXTRA_POOL,),
    "resource.pools.<name>.slots_per_node": (EXTRA_POOL,),
    "resource.placement": (EXTRA_POOL,),
    "reward.shaping[].name": (SHAPING,),
    "reward.shaping[].kwargs": (SHAPING,),
}

CHANGED: dict[str, str] = {
    # overrides for keys whose changed value the generic rule (`_changed_value`) cannot pick
    "model.dtype": "model.dtype=bfloat16",
    "rollout.engine": "rollout.engine=hf",
    "rollout.max_num_batched_tokens": "rollout.max_num_batched_tokens=4096",
    "rollout.cache_dir": "rollout.cache_dir=compile_cache",
    "rollout.dtype": "rollout.dtype=bfloat16",
    "actor.lr_scheduler": "actor.lr_scheduler=cosine",
    "critic.lr_scheduler": "critic.lr_scheduler=cosine",
    "actor.betas": "actor.betas=[0.8,0.99]",
    "critic.betas": "critic.betas=[0.8,0.99]",
    "actor.param_dtype": "actor.param_dtype=bfloat16",
    "critic.param_dtype": "critic.param_dtype=bfloat16",
    "actor.policy_loss": "actor.policy_loss=gspo",
    "actor.policy_loss_kwargs": "actor.policy_loss_kwargs={clip_eps_low: 0.1}",
    "actor.dual_clip_c": "actor.dual_clip_c=3.0",
    "actor.loss_agg_mode": "actor.loss_agg_mode=seq-mean-token-mean",
    "critic.loss_agg_mode": "critic.loss_agg_mode=seq-mean-token-mean",
    "actor.kl_estimator": "actor.kl_estimator=k2",
    "actor.skip_zero_advantage_rows": "actor.skip_zero_advantage_rows=false",
    "actor.rollout_correction": "actor.rollout_correction=token",
    "reward.default_fn": "reward.default_fn=math_verify",
    "reward.fn_by_source": "reward.fn_by_source={toy: math_verify}",
    "reward.shaping": SHAPING,
    "reward.shaping[].name": "reward.shaping=[{name: length_penalty, kwargs: {coef: 0.1, max_response_length: 8}}]",
    "reward.shaping[].kwargs": (
        "reward.shaping=[{name: overlong_penalty, kwargs: {max_response_length: 8, cache_length: 4}}]"
    ),
    "reward_model.param_dtype": "reward_model.param_dtype=bfloat16",
    "reward_model.path": "reward_model.path={root}/rm_other",
    "reward_model.tokenizer": "reward_model.tokenizer={root}/rm_tokenizer",
    "algorithm.estimator_kwargs": "algorithm.estimator_kwargs={eps: 0.01}",
    "resource.pools": EXTRA_POOL,
    "resource.pools.<name>.nodes": "resource.pools.extra.nodes=2",
    "resource.pools.<name>.slots_per_node": "resource.pools.extra.slots_per_node=2",
    "resource.placement": "resource.placement={critic: extra}",
}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[str, ...]:
    """Overrides of a loadable config with every optional section present: data files that exist, a
    critic, a reward model (directories that exist) and an output folder."""
    root = tmp_path_factory.mktemp("wiring")
    data = root / "train.jsonl"
    write_rows([{"data_source": "toy", "prompt": [{"role": "user", "content": "1+1="}], "reward_model": {"ground_truth": "2"}}], data)
    for name in ("rm", "rm_other", "rm_tokenizer"):
        (root / name).mkdir()
    return (  # the first names the data file, in the folder that `_reaches` takes as {root}
        f"data.train_files=[{data}]",
        "critic.lr=1e-5",
        f"reward_model.path={root / 'rm'}",
        f"trainer.output_dir={root / 'out'}",
    )


def _effects(config: RunConfig) -> dict[str, object]:
    """What the trainer builds from ``config`` for its components, as comparable values."""
    sizes = derive_sizes(config)
    out: dict[str, object] = {
        "sizes": sizes,
        "actor": actor_settings(config, sizes, TOTAL_STEPS),
        "actor model": model_settings(config, config.actor, MODEL_DIR),
        "actor_rollout options": actor_rollout_options(config),
        "engine": engine_settings(config),
        "resharding": resharding_settings(config),
        "reward manager": reward_settings(config),
        "pools": {name: vars(pool) for name, pool in build_pools(config).items()},
        "placement": {role: config.resource.pool_of(role) for role in ROLES},
        "estimator arguments": config.algorithm.advantage_params(),
        "monitor": config.monitor,
    }
    if config.critic is not None:
        out["critic"] = critic_settings(config, sizes, TOTAL_STEPS, MODEL_DIR)
    if config.reward_model is not None:
        out["reward model"] = reward_model_settings(config)
    return out


@functools.cache
def _built(overrides: tuple[str, ...]) -> tuple[RunConfig, dict[str, object]]:
    """The config of ``overrides`` and its `_effects` (shared by the keys with the same context)."""
    config = load_config(None, overrides)
    return config, _effects(config)


def _changed_value(key: str, default: object) -> str:
    """A valid value other than ``default``, as an override value."""
    if isinstance(default, bool):
        return str(not default).lower()
    if isinstance(default, int):
        if default == -1:
            return "5"
        return str(default // 2 if default >= 2 and default % 2 == 0 else default + 1)
    if isinstance(default, float):
        return repr(default / 2 if default > 0 else 0.5)
    raise AssertionError(f"{key}: no generic change of {default!r}; add one to CHANGED")


def _override_key(key: str) -> str:
    """The override path of a documented key (``resource.pools.<name>.nodes`` for the pool ``extra``)."""
    return key.replace("<name>", "extra")


def _monitor_reads(key: str) -> str | None:
    """None when the monitor's code (beyond its config class) reads the field of ``monitor.<field>``."""
    name = key.removeprefix("monitor.")
    code = "\n".join(p.read_text() for p in MONITOR_DIR.glob("*.py") if p.name != "config.py")
    if not re.search(rf"\.{name}\b", code):
        return f"{key}: no code under {MONITOR_DIR.relative_to(REPO_ROOT)} reads .{name}"
    return None


def _reaches(key: str, default: object, base: tuple[str, ...], runtime: dict[str, tuple[str, str]]) -> str | None:
    """None when a change to ``key`` reaches a component (or a listed runtime read), else the reason."""
    if key in runtime:
        path, expression = runtime[key]
        if expression not in (REPO_ROOT / path).read_text():
            return f"{key}: {path} does not contain {expression!r}: nobody reads it there"
        return None
    if key.startswith("monitor."):
        return _monitor_reads(key)
    context = (*base, *CONTEXT.get(key, ()))
    root = base[0].removeprefix("data.train_files=[").removesuffix("/train.jsonl]")
    override = CHANGED[key].replace("{root}", root) if key in CHANGED else f"{_override_key(key)}={_changed_value(key, default)}"
    before, before_effects = _built(context)
    after = load_config(None, (*context, override))
    if before == after:
        return f"{key}: the override {override!r} left the config unchanged"
    after_effects = _effects(after)
    changed = [part for part, value in before_effects.items() if after_effects[part] != value]
    if not changed:
        return f"{key}: changing it ({override!r}) reaches no component and no runtime read is listed"
    return None


def _documented_keys() -> dict[str, object]:
    """The documented config keys (the tables of the sections), without the derived-sizes table."""
    sections = {spec.name for spec in dataclasses.fields(RunConfig)}
    return {key: value for key, value in documented_defaults().items() if key.split(".")[0] in sections}


def test_every_documented_key_reaches_its_component(base):
    documented = _documented_keys()
    assert len(documented) > 150, "the docs/config.md tables were not parsed"
    problems = []
    for key, default in sorted(documented.items()):
        try:
            problem = _reaches(key, default, base, RUNTIME_READS)
        except Exception as error:  # a change the schema refuses is the test's own mistake: name the key
            problem = f"{key}: {type(error).__name__}: {error}"
        if problem is not None:
            problems.append(problem)
    assert not problems, "documented keys that reach nothing:\n" + "\n".join(problems)


def test_every_monitor_field_is_documented():
    documented = documented_defaults()
    fields = {f"monitor.{spec.name}" for spec in dataclasses.fields(MonitorConfig)}
    assert fields <= set(documented), sorted(fields - set(documented))


def test_a_key_read_by_the_runtime_only_fails_without_its_table_entry(base):
    # rollout.top_p reaches no component setting: the sampling step reads it.
    unlisted = {key: read for key, read in RUNTIME_READS.items() if key != "rollout.top_p"}
    problem = _reaches("rollout.top_p", 1.0, base, unlisted)
    assert problem is not None and "reaches no component" in problem


def test_a_runtime_entry_whose_read_is_gone_fails(base):
    wrong = {**RUNTIME_READS, "rollout.top_p": ("trainer/steps.py", "top_p=rollout.no_such_key")}
    problem = _reaches("rollout.top_p", 1.0, base, wrong)
    assert problem is not None and "nobody reads it" in problem


def test_the_default_config_builds_each_components_own_defaults(base):
    """One default per setting: a run left at its defaults gets the component classes' defaults, apart
    from the values the trainer derives from other keys."""
    config = load_config(None, base)
    actor = actor_settings(config, derive_sizes(config), TOTAL_STEPS)
    derived = {
        "optim": dataclasses.replace(actor.optim, total_steps=ActorConfig().optim.total_steps),
        "loss_norm_constant": None,  # data.max_response_length
        "policy_loss_params": {},  # actor.clip_eps_low, clip_eps_high, dual_clip_c
    }
    assert dataclasses.replace(actor, **derived) == ActorConfig()
    assert model_settings(config, config.actor, MODEL_DIR) == ModelConfig(path=str(MODEL_DIR))
    assert engine_settings(config) == EngineConfig()
    assert reward_settings(config) == RewardManagerConfig()
    assert resharding_settings(config) == ReshardingConfig()
