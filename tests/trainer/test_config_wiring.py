"""Every key documented in docs/config.md is read by the code it configures.

The sections a component consumes (``rollout``, ``actor``, ``critic``, ``ref``, ``reward_model``,
``reward``, ``resharding``, ``monitor``) are that component's own dataclasses, handed to it whole: for
each of their fields the test asserts that the code of the component (or of the trainer) reads it as an
attribute. For the trainer's own sections the test builds what the trainer builds from a config
(`derive_sizes`, `derive_values`, the pools, the placement, the estimator's arguments) once from a base
config and once with the key changed to another valid value, and asserts the two differ; the keys that
the runtime reads itself (the loop, the data loader, the model setup) are listed in ``RUNTIME_READS``
with the expression that reads them, which must be in the trainer's code. A key that is none of these
(documented and validated, but read by nobody) fails the test. No Ray, no models.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import pytest

from hybridflow.data import write_rows
from hybridflow.metrics.monitor import MonitorConfig
from tests.trainer._config_docs import documented_defaults
from trainer.config import ROLES, ConfigError, RunConfig, derive_sizes, derive_values, load_config
from trainer.roles import build_pools, role_specs
from workers.config import ActorConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
TOTAL_STEPS = 10
MODEL_DIR = Path("model")

SECTION_READERS: dict[str, tuple[str, ...]] = {
    # a component's section: the folders and files whose code reads its fields
    "rollout": ("hybridflow/rollout", "workers/actor.py", "trainer"),
    "actor": ("workers", "trainer", "hybridflow/lora.py"),
    "critic": ("workers", "trainer"),
    "ref": ("workers", "trainer"),
    "reward_model": ("workers", "trainer"),
    "teacher": ("workers", "trainer"),
    "reward": ("hybridflow/rewards", "trainer"),
    "resharding": ("hybridflow/resharding", "workers/actor.py", "trainer"),
    "monitor": ("hybridflow/metrics/monitor",),
    "agent": ("hybridflow/agents", "workers/actor.py", "trainer"),
}

RUNTIME_READS: dict[str, str] = {
    # a key of the trainer's own sections: the expression in trainer/ that reads it
    "model.path": "config.model.path",
    "model.tokenizer": "config.model.tokenizer",
    **{
        f"model.tiny.{name}": f"tiny.{name}"
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
    "data.train_files": "data.train_files",
    "data.val_files": "data.val_files",
    "data.prompt_key": "prompt_key=data.prompt_key",
    "data.val_batch_size": "config.data.val_batch_size",
    "data.shuffle": "shuffle=data.shuffle",
    "algorithm.adv_estimator": "algorithm.adv_estimator",
    "algorithm.kl_penalty": "algorithm.kl_penalty",
    "algorithm.kl_ctrl.type": "kl.type",
    "algorithm.kl_ctrl.kl_coef": "kl.kl_coef",
    "algorithm.kl_ctrl.target_kl": "kl.target_kl",
    "algorithm.kl_ctrl.horizon": "kl.horizon",
    "trainer.total_epochs": "config.trainer.total_epochs",
    "trainer.total_steps": "config.trainer.total_steps",
    "trainer.val_every": "config.val_every",
    "trainer.val_before_train": "config.val_before_train",
    "trainer.save_every": "config.save_every",
    "trainer.checkpoint_dir": "config.trainer.checkpoint_dir",
    "trainer.resume": "config.trainer.resume",
    "trainer.existing_output": "config.trainer.existing_output",
    "trainer.loggers": "config.trainer.loggers",
    "trainer.console": "config.trainer.console",
    "trainer.machine_peak_file": "config.trainer.machine_peak_file",
    "trainer.rollout_dump": "config.trainer.rollout_dump",
    "trainer.project": "config.trainer.project",
    "trainer.experiment": "config.trainer.experiment",
    "trainer.output_dir": "config.trainer.output_dir",
    "trainer.wandb_mode": "config.trainer.wandb_mode",
    "recipe": "config.recipe",
    "async_rollout.max_staleness": "config.async_rollout.max_staleness",
    "async_rollout.partial_round_tokens": "config.async_rollout.partial_round_tokens",
}

EXTRA_POOL = "resource.pools={extra: {nodes: 1, slots_per_node: 1}}"

CONTEXT: dict[str, tuple[str, ...]] = {
    # overrides, applied to both configs, under which the key takes effect
    "algorithm.gamma": ("algorithm.adv_estimator=gae",),
    "algorithm.lam": ("algorithm.adv_estimator=gae",),
    "resource.pools.<name>.nodes": (EXTRA_POOL,),
    "resource.pools.<name>.slots_per_node": (EXTRA_POOL,),
    "resource.placement": (EXTRA_POOL,),
    "resource.pools.<name>.custom_resources": (EXTRA_POOL,),
}

CHANGED: dict[str, str] = {
    # overrides for keys whose changed value the generic rule (`_changed_value`) cannot pick
    "model.dtype": "model.dtype=bfloat16",
    "algorithm.estimator_kwargs": "algorithm.estimator_kwargs={eps: 0.01}",
    "resource.pools": EXTRA_POOL,
    "resource.pools.<name>.nodes": "resource.pools.extra.nodes=2",
    "resource.pools.<name>.slots_per_node": "resource.pools.extra.slots_per_node=2",
    "resource.placement": "resource.placement={critic: extra}",
    "resource.custom_resources": "resource.custom_resources={trainer_node: 1}",
    "resource.pools.<name>.custom_resources": "resource.pools.extra.custom_resources={rollout_node: 1}",
    "trainer.machine_peak_file": "trainer.machine_peak_file={root}/peaks.json",
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
    """What the trainer builds from ``config`` beside the sections it hands over whole, as comparable
    values."""
    sizes = derive_sizes(config)
    values = derive_values(config, sizes, TOTAL_STEPS, MODEL_DIR)
    return {
        "sizes": sizes,
        "actor values": values.actor,
        "critic values": values.critic,
        "reward model dtype": role_specs(config, sizes, TOTAL_STEPS, MODEL_DIR)["reward_model"].args[1],
        "pools": {name: vars(pool) for name, pool in build_pools(config).items()},
        "placement": {role: config.resource.pool_of(role) for role in ROLES},
        "estimator arguments": config.algorithm.advantage_params(),
    }


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


def _code(paths: tuple[str, ...]) -> str:
    """The Python source under ``paths`` (folders or files), the monitor's config class left out."""
    files = []
    for path in paths:
        target = REPO_ROOT / path
        files += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    return "\n".join(p.read_text() for p in files if p != REPO_ROOT / "hybridflow/metrics/monitor/config.py")


def _section_reads(key: str) -> str | None:
    """None when the code of the section's component (or the trainer) reads the field of ``key``, or
    when the field is an actor loss argument, which reaches the policy loss by its name
    (`ActorConfig.policy_loss_params`)."""
    section = key.split(".")[0]
    name = key.split(".")[-1].removesuffix("[]")
    if section == "actor" and name in ActorConfig().loss_arguments():
        return None
    if not re.search(rf"\.{name}\b", _code(SECTION_READERS[section])):
        return f"{key}: no code under {', '.join(SECTION_READERS[section])} reads .{name}"
    return None


def _reaches(key: str, default: object, base: tuple[str, ...], runtime: dict[str, str]) -> str | None:
    """None when ``key`` is read: a section field by its component, a trainer key by a listed runtime
    read or through what the trainer derives from it; else the reason."""
    if key.split(".")[0] in SECTION_READERS:
        return _section_reads(key)
    if key in runtime:
        if runtime[key] not in _code(("trainer",)):
            return f"{key}: no code under trainer/ contains {runtime[key]!r}: nobody reads it"
        return None
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
    # data.shuffle reaches no derived value: the data loader reads it.
    unlisted = {key: read for key, read in RUNTIME_READS.items() if key != "data.shuffle"}
    problem = _reaches("data.shuffle", True, base, unlisted)
    assert problem is not None and "reaches no component" in problem


def test_a_runtime_entry_whose_read_is_gone_fails(base):
    wrong = {**RUNTIME_READS, "data.shuffle": "shuffle=data.no_such_key"}
    problem = _reaches("data.shuffle", True, base, wrong)
    assert problem is not None and "nobody reads it" in problem


def test_a_section_field_that_no_code_reads_fails():
    assert _section_reads("actor.ppo_mini_batch_size") is None
    problem = _section_reads("actor.no_such_knob")
    assert problem is not None and "reads .no_such_knob" in problem


def test_the_derived_values_follow_the_other_keys(base):
    """The values a worker takes from outside its sections, by hand from the keys they come from."""
    config = load_config(None, (*base, "data.max_prompt_length=100", "data.max_response_length=60", "data.seed=4"))
    sizes = derive_sizes(config)
    values = derive_values(config, sizes, TOTAL_STEPS, MODEL_DIR)
    actor = values.actor
    assert (actor.engine.max_model_len, actor.engine.dtype) == (160, "float32")
    assert actor.objective.norm_constant == 60.0
    # 64 prompts * 8 samples / 64 rows per mini-batch = 8 optimizer steps per step.
    assert actor.optimizer_steps == TOTAL_STEPS * 8
    assert (actor.seed, actor.model_path, actor.dtype, actor.with_ref) == (4, "model", "float32", False)
    assert values.critic is not None and values.critic.loss_norm_constant == 60.0
    bf16 = load_config(None, (*base, "model.dtype=bfloat16"))
    assert derive_values(bf16, derive_sizes(bf16), 1, MODEL_DIR).actor.engine.dtype == "bfloat16"
    fp16 = load_config(None, (*base, "model.dtype=bfloat16", "rollout.dtype=float16"))
    assert derive_values(fp16, derive_sizes(fp16), 1, MODEL_DIR).actor.engine.dtype == "float16"


def test_the_component_knobs_load_and_reach_the_workers(base):
    knobs = (
        "rollout.hf_max_batch_rows=3",
        "rollout.enable_prefix_caching=false",
        "actor.use_packing=false",
        "actor.logit_chunk_size=16",
        "critic.use_packing=false",
        "reward_model.use_packing=false",
    )
    config = load_config(None, (*base, *knobs))
    specs = role_specs(config, derive_sizes(config), TOTAL_STEPS, MODEL_DIR)
    actor, _, rollout, _, _ = specs["actor_rollout"].args
    assert (rollout.hf_max_batch_rows, rollout.enable_prefix_caching) == (3, False)
    assert (actor.use_packing, actor.logit_chunk_size) == (False, 16)
    assert specs["critic"].args[0].use_packing is False
    assert specs["reward_model"].args[0].use_packing is False


def test_an_error_names_the_yaml_key(base):
    with pytest.raises(ConfigError, match=r"actor\.ppo_mini_batch_size: must be >= 1, got 0"):
        load_config(None, (*base, "actor.ppo_mini_batch_size=0"))
    with pytest.raises(ConfigError, match=r"rollout\.hf_max_batch_rows: must be >= 1, got 0"):
        load_config(None, (*base, "rollout.hf_max_batch_rows=0"))
    with pytest.raises(ConfigError, match=r"rollout\.tp_size: 3 does not divide"):
        load_config(None, (*base, "rollout.tp_size=3"))
