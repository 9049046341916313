"""Run config: loading, overrides, one validation pass naming every key, freezing, derived sizes."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from hybridflow.agents import AgentConfig
from hybridflow.algos import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATION_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    register_advantage_estimator,
)
from hybridflow.data import write_rows
from tests.trainer._config_docs import documented_defaults
from trainer.config import (
    CONFIG_DIR,
    ROLES,
    ConfigError,
    CriticConfig,
    PoolConfig,
    RewardModelConfig,
    RunConfig,
    ShapingSpec,
    TeacherConfig,
    config_from_dict,
    config_to_dict,
    derive_sizes,
    load_config,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
GRPO = CONFIG_DIR / "grpo.yaml"
PPO = CONFIG_DIR / "ppo.yaml"


@pytest.fixture
def data_files(tmp_path: Path) -> list[str]:
    """Overrides pointing the data section at files that exist (the shipped YAML expects generated data)."""
    train, val = tmp_path / "train.parquet", tmp_path / "test.parquet"
    row = {"data_source": "toy", "prompt": [{"role": "user", "content": "1+1="}], "reward_model": {"ground_truth": "2"}}
    write_rows([row], train)
    write_rows([row], val)
    return [f"data.train_files=[{train}]", f"data.val_files=[{val}]"]


def problems_of(path: Path | None, overrides: list[str]) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return info.value.problems


# ------------------------------------------------------------------------------------ loading


def test_shipped_grpo_config_loads_with_its_values(data_files):
    config = load_config(GRPO, data_files)
    assert config.algorithm.adv_estimator == "grpo"
    assert config.rollout.n == 8
    assert config.actor.lr == 1e-4
    assert config.critic is None
    assert config.model.tiny.hidden_size == 256
    # interpolations resolve against the file's own values
    assert config.trainer.checkpoint_dir == "outputs/hybridflow/grpo-arith2/checkpoints"


def test_shipped_ppo_config_loads_with_a_critic(data_files):
    config = load_config(PPO, data_files)
    assert config.algorithm.adv_estimator == "gae"
    assert isinstance(config.critic, CriticConfig)
    assert config.critic.lr == 1e-4
    assert config.algorithm.kl_ctrl.type == "adaptive"
    assert config.needs_reference
    assert config.algorithm.advantage_params() == {"gamma": 1.0, "lam": 0.95}


def test_overrides_apply_in_order_and_parse_values(data_files):
    config = load_config(
        GRPO,
        [
            *data_files,
            "actor.lr=3e-5",
            "rollout.n=4",
            "rollout.n=2",  # the later override wins
            "actor.ppo_mini_batch_size=128",
            "trainer.loggers=[console,tensorboard]",
            "trainer.output_dir=/tmp/run7",
            "reward.fn_by_source.gsm8k=math_verify",
        ],
    )
    assert config.actor.lr == 3e-5
    assert config.rollout.n == 2
    assert config.trainer.loggers == ("console", "tensorboard")
    assert config.trainer.checkpoint_dir == "/tmp/run7/checkpoints"
    assert dict(config.reward.fn_by_source) == {"gsm8k": "math_verify"}


def test_override_creates_an_optional_section_with_defaults(data_files):
    config = load_config(GRPO, [*data_files, "critic.lr=2e-5"])
    assert config.critic is not None
    assert config.critic.lr == 2e-5
    assert config.critic.cliprange_value == CriticConfig().cliprange_value
    no_critic = load_config(PPO, [*data_files, "critic=null", "algorithm.adv_estimator=grpo"])
    assert no_critic.critic is None


def test_defaults_alone_need_only_training_data(data_files):
    config = load_config(None, data_files[:1])
    assert config == dataclasses.replace(RunConfig(), data=config.data, trainer=config.trainer)
    assert config.trainer.output_dir == "outputs/hybridflow/default"


# ------------------------------------------------------------------------------------ errors


def test_unknown_key_suggests_the_close_match(data_files):
    problems = problems_of(GRPO, [*data_files, "actor.lrr=1e-5", "acter.lr=1"])
    assert "actor.lrr: unknown key; did you mean 'actor.lr'?" in problems
    assert "acter: unknown key; did you mean 'actor'?" in problems


def test_unknown_key_without_a_close_match_lists_the_valid_keys(data_files):
    (problem,) = problems_of(GRPO, [*data_files, "algorithm.zzz=1"])
    assert problem.startswith("algorithm.zzz: unknown key; valid keys here: adv_estimator, gamma, lam")


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("actor.ppo_epochs=two", "actor.ppo_epochs: expected an integer, got 'two' (str)"),
        ("rollout.n=true", "rollout.n: expected an integer, got True (bool)"),
        ("actor.lr=[1]", "actor.lr: expected a number, got [1] (list)"),
        ("data.shuffle=3", "data.shuffle: expected true or false, got 3 (int)"),
        ("actor.grad_clip=x", "actor.grad_clip: expected a number or null, got 'x' (str)"),
        ("actor=5", "actor: expected a mapping, got 5 (int)"),
        (
            "actor.lr_scheduler=cosin",
            "actor.lr_scheduler: expected one of 'constant', 'cosine', 'linear', got 'cosin'; did you mean 'cosine'?",
        ),
        (
            "trainer.loggers=[console,tb]",
            "trainer.loggers[1]: expected one of 'console', 'jsonl', 'tensorboard', 'wandb', got 'tb'",
        ),
    ],
)
def test_wrong_type_names_the_key(data_files, override, expected):
    assert problems_of(GRPO, [*data_files, override]) == (expected,)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("actor.lr=-1", "actor.lr: must be > 0, got -1.0"),
        ("rollout.top_p=1.5", "rollout.top_p: must be > 0 and <= 1, got 1.5"),
        ("algorithm.lam=2", "algorithm.lam: must be >= 0 and <= 1, got 2.0"),
        ("actor.dual_clip_c=1", "actor.dual_clip_c: must be > 1, got 1.0"),
        ("rollout.top_k=0", "rollout.top_k: must be -1 (disabled) or >= 1, got 0"),
    ],
)
def test_values_out_of_range_name_the_key(data_files, override, expected):
    assert problems_of(GRPO, [*data_files, override]) == (expected,)


def test_mini_batch_must_divide_the_rows_per_step(data_files):
    # grpo.yaml: 64 prompts * 8 samples = 512 rows per step
    (problem,) = problems_of(GRPO, [*data_files, "actor.ppo_mini_batch_size=96"])
    assert problem == (
        "actor.ppo_mini_batch_size: 96 does not divide the rows per step, data.train_batch_size * rollout.n = 512"
    )


def test_micro_batch_times_world_must_divide_the_mini_batch(data_files):
    # 512 rows per mini-batch over 2 ranks = 256 per rank; 48 does not divide 256
    (problem,) = problems_of(GRPO, [*data_files, "actor.ppo_micro_batch_size=48"])
    assert problem == (
        "actor.ppo_micro_batch_size: 48 * data-parallel world 2 does not divide "
        "actor.ppo_mini_batch_size = 512 (per-rank mini-batch 256)"
    )


def test_mini_batch_must_split_over_the_world(data_files):
    problems = problems_of(
        GRPO,
        [*data_files, "resource.slots_per_node=3", "data.train_batch_size=3", "actor.ppo_mini_batch_size=8"],
    )
    assert problems == (
        "actor.ppo_mini_batch_size: 8 rows do not split evenly over the data-parallel world of 3 ranks",
    )


def test_tp_size_must_divide_the_world(data_files):
    # a model (a hub name) instead of the tiny builder, so only the world constrains the TP size
    problems = problems_of(GRPO, [*data_files, "rollout.tp_size=3", "model.path=org/any-model"])
    assert problems == (
        "rollout.tp_size: 3 does not divide the world size 2 of the actor_rollout pool (valid tp sizes: [1, 2])",
    )


def test_prompts_must_split_over_the_inference_groups(data_files):
    overrides = ["data.train_batch_size=63", "actor.ppo_mini_batch_size=504", "actor.ppo_micro_batch_size=63"]
    (problem,) = problems_of(GRPO, [*data_files, *overrides])
    assert problem.startswith("data.train_batch_size: 63 prompts do not split evenly over the 2 inference")


@pytest.mark.parametrize(
    ("key", "registry", "kind"),
    [
        ("algorithm.adv_estimator", ADVANTAGE_ESTIMATORS, "advantage estimator"),
        ("actor.policy_loss", POLICY_LOSSES, "policy loss"),
        ("actor.loss_agg_mode", AGGREGATION_MODES, "loss aggregation mode"),
        ("actor.kl_estimator", KL_ESTIMATORS, "kl estimator"),
        ("algorithm.kl_penalty", KL_ESTIMATORS, "kl estimator"),
    ],
)
def test_unknown_registry_name_lists_the_valid_choices(data_files, key, registry, kind):
    (problem,) = problems_of(GRPO, [*data_files, f"{key}=nonesuch"])
    assert problem == f"{key}: unknown {kind} 'nonesuch'; valid choices: {', '.join(registry.names())}"


def test_unknown_estimator_suggests_the_close_name(data_files):
    (problem,) = problems_of(GRPO, [*data_files, "algorithm.adv_estimator=grp"])
    assert "gae, gpg, grpo, " in problem
    assert problem.endswith("(did you mean 'grpo'?)")


def test_gae_requires_a_critic(data_files):
    (problem,) = problems_of(PPO, [*data_files, "critic=null"])
    assert problem.startswith("critic: required when algorithm.adv_estimator is 'gae'")


def test_every_problem_is_reported_in_one_error(data_files):
    with pytest.raises(ConfigError) as info:
        load_config(
            PPO,
            [
                *data_files,
                "actor.lrr=1",
                "rollout.temperature=hot",
                "critic.ppo_mini_batch_size=100",
                "actor.policy_loss=ppo",
                "reward.default_fn=nowhere.py:score",
            ],
        )
    keys = [problem.split(":")[0] for problem in info.value.problems]
    # schema misfits in tree order, then the rules
    assert keys == [
        "rollout.temperature",
        "actor.lrr",
        "critic.ppo_mini_batch_size",
        "actor.policy_loss",
        "reward.default_fn",
    ]
    assert str(info.value).startswith(
        "5 problems in the run config:\n  - rollout.temperature: expected a number"
    )


def test_a_bad_value_does_not_cascade_into_dependent_rules(data_files):
    # rollout.n is unusable, so the batch divisibility that depends on it is not reported as well
    assert problems_of(GRPO, [*data_files, "rollout.n=many", "actor.ppo_mini_batch_size=96"]) == (
        "rollout.n: expected an integer, got 'many' (str)",
    )


def test_split_placement_is_checked(data_files):
    problems = problems_of(
        PPO,
        [
            *data_files,
            "resource.placement.critc=gpu",
            "resource.placement.critic=gpus",
            "resource.pools.gpu.nodes=1",
        ],
    )
    assert problems == (
        "resource.placement.critic: unknown pool 'gpus'; pools: global, gpu",
        f"resource.placement.critc: unknown role; did you mean 'critic'? roles: {', '.join(ROLES)}",
    )


def test_missing_files_and_bad_overrides_are_reported(tmp_path):
    missing = tmp_path / "nope.parquet"
    problems = problems_of(GRPO, [f"data.train_files=[{missing}]", "data.val_files=[]", "actor.lr"])
    assert problems == ("override 'actor.lr': expected key.sub=value",)
    problems = problems_of(
        GRPO, [f"data.train_files=[{missing}]", "data.val_files=[]", "trainer.val_every=0"]
    )
    assert problems == (f"data.train_files[0]: file '{missing}' not found",)
    assert problems_of(tmp_path / "absent.yaml", []) == (
        f"{tmp_path / 'absent.yaml'}: config file not found",
    )


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_pp_baseline"])
def test_group_estimators_refuse_one_sample_per_prompt(data_files, estimator):
    # 64 prompts * 1 sample = 64 rows: the batch sizes fit, only the group size is wrong
    sizes = ["actor.ppo_mini_batch_size=64", "actor.ppo_micro_batch_size=16"]
    problems = problems_of(GRPO, [*data_files, *sizes, "rollout.n=1", f"algorithm.adv_estimator={estimator}"])
    assert problems == (
        f"rollout.n: must be >= 2 for algorithm.adv_estimator {estimator!r}, which compares the samples of "
        "each prompt: with rollout.n=1 every group has one sample and every advantage is 0",
    )


@pytest.mark.parametrize("estimator", ["gae", "reinforce_pp"])
def test_estimators_without_groups_take_one_sample_per_prompt(data_files, estimator):
    config = load_config(PPO, [*data_files, "rollout.n=1", f"algorithm.adv_estimator={estimator}"])
    assert (config.rollout.n, config.algorithm.adv_estimator) == (1, estimator)


def test_an_unknown_estimator_is_reported_once_not_as_a_group_size(data_files):
    sizes = ["actor.ppo_mini_batch_size=64", "actor.ppo_micro_batch_size=16"]
    (problem,) = problems_of(GRPO, [*data_files, *sizes, "rollout.n=1", "algorithm.adv_estimator=grpoo"])
    assert problem.startswith("algorithm.adv_estimator: unknown advantage estimator 'grpoo'")


def test_dual_clip_is_refused_for_a_loss_without_it(data_files):
    (problem,) = problems_of(PPO, [*data_files, "actor.policy_loss=gspo"])
    assert problem == "actor.dual_clip_c: policy loss 'gspo' takes no dual_clip_c; set it to null"


def test_dynamic_batching_budget_must_hold_one_sequence(data_files):
    # grpo.yaml: 16 prompt + 8 response tokens
    (problem,) = problems_of(
        GRPO, [*data_files, "actor.dynamic_batching=true", "actor.max_tokens_per_micro_batch=20"]
    )
    assert problem.startswith("actor.max_tokens_per_micro_batch: 20 cannot hold one sequence")


# ------------------------------------------------------------------------------------ reward model


def test_reward_model_section_is_absent_unless_given(data_files, tmp_path):
    assert load_config(GRPO, data_files).reward_model is None
    config = load_config(GRPO, [*data_files, f"reward_model.path={tmp_path}", "reward_model.weight=0.5"])
    assert config.reward_model == RewardModelConfig(path=str(tmp_path), weight=0.5)
    # colocated with the actor unless placed elsewhere
    assert config.resource.pool_of("reward_model") == "global"
    split = load_config(
        GRPO,
        [
            *data_files,
            f"reward_model.path={tmp_path}",
            "resource.pools.rm_pool.slots_per_node=1",
            "resource.placement.reward_model=rm_pool",
        ],
    )
    assert split.resource.pool_of("reward_model") == "rm_pool"


def test_reward_model_problems_name_their_keys(data_files, tmp_path):
    assert problems_of(GRPO, [*data_files, "reward_model.weight=0.5"]) == (
        "reward_model.path: required: a local sequence-classification model directory (or set reward_model to null)",
    )
    missing = tmp_path / "no_such_model"
    problems = problems_of(
        GRPO,
        [
            *data_files,
            f"reward_model.path={missing}",
            f"reward_model.tokenizer={missing}",
            "reward_model.weight=.nan",
            "reward_model.dynamic_batching=true",
            "reward_model.max_tokens_per_micro_batch=20",
            "reward_model.forward_micro_batch_size=0",
            "resource.placement.reward_model=nowhere",
        ],
    )
    assert problems == (
        "reward_model.forward_micro_batch_size: must be >= 1, got 0",
        "reward_model.max_tokens_per_micro_batch: 20 cannot hold one sequence of data.max_prompt_length + "
        "data.max_response_length = 24 tokens",
        "resource.placement.reward_model: unknown pool 'nowhere'; pools: global",
        f"reward_model.path: directory '{missing}' not found",
        f"reward_model.tokenizer: directory '{missing}' not found",
        "reward_model.weight: must be a finite number, got nan",
    )


def test_the_old_reward_role_name_points_at_the_reward_model(data_files):
    (problem,) = problems_of(GRPO, [*data_files, "resource.placement.reward=global"])
    assert problem == (
        f"resource.placement.reward: unknown role; did you mean 'reward_model'? roles: {', '.join(ROLES)}"
    )


# ------------------------------------------------------------------------------------ frozen


def test_loaded_config_is_frozen(data_files):
    config = load_config(GRPO, data_files)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.actor.lr = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.actor = config.actor  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.reward.fn_by_source["x"] = "y"  # type: ignore[index]
    assert isinstance(config.data.train_files, tuple)


def test_config_survives_pickle_and_dict_round_trips(data_files):
    config = load_config(PPO, [*data_files, "reward.shaping=[{name: clip, kwargs: {low: -1, high: 1}}]"])
    assert pickle.loads(pickle.dumps(config)) == config
    assert config_from_dict(config_to_dict(config)) == config
    assert config.reward.shaping[0].kwargs["high"] == 1


# ------------------------------------------------------------------------------------ derived sizes


def test_derived_sizes_by_hand(tmp_path, data_files):
    config = load_config(
        PPO,
        [
            *data_files,
            "resource.slots_per_node=4",
            "rollout.tp_size=2",
            "data.train_batch_size=8",
            "rollout.n=4",
            "actor.ppo_mini_batch_size=16",
            "actor.ppo_micro_batch_size=2",
            "actor.ppo_epochs=3",
            "resource.pools.critic_pool.slots_per_node=2",
            "resource.placement.critic=critic_pool",
            "critic.ppo_mini_batch_size=8",
            "critic.ppo_micro_batch_size=4",
            "critic.ppo_epochs=1",
        ],
    )
    sizes = derive_sizes(config)
    # 4 ranks in 2 TP groups of 2; 8 prompts * 4 samples = 32 rows
    assert (sizes.world_size, sizes.rollout_dp_size, sizes.rows_per_step) == (4, 2, 32)
    assert sizes.prompts_per_rollout_dp_rank == 4
    # actor: 32 / 16 = 2 mini-batches, * 3 epochs = 6 optimizer steps; 16 / 4 ranks = 4 rows, / 2 = 2 micro
    actor = sizes.actor
    assert (actor.mini_batches_per_epoch, actor.optimizer_steps_per_step) == (2, 6)
    assert (actor.mini_batch_per_rank, actor.micro_batch_per_rank, actor.grad_accum_steps) == (4, 2, 2)
    # critic on its own 2-rank pool: 32 / 8 = 4 mini-batches; 8 / 2 = 4 rows per rank, one micro-batch
    critic = sizes.critic
    assert critic is not None
    assert (critic.world_size, critic.mini_batches_per_epoch, critic.grad_accum_steps) == (2, 4, 1)
    # the config itself is unchanged by deriving
    assert config.actor.ppo_mini_batch_size == 16


def test_dynamic_batching_leaves_micro_batch_counts_open(data_files):
    sizes = derive_sizes(
        load_config(GRPO, [*data_files, "actor.dynamic_batching=true", "actor.ppo_micro_batch_size=7"])
    )
    assert sizes.actor.micro_batch_per_rank is None
    assert sizes.actor.grad_accum_steps is None
    assert sizes.actor.mini_batch_per_rank == 256


def test_derive_sizes_refuses_an_unchecked_config(data_files):
    config = load_config(GRPO, data_files)
    broken = dataclasses.replace(config, actor=dataclasses.replace(config.actor, ppo_mini_batch_size=100))
    with pytest.raises(ConfigError, match=r"actor\.ppo_mini_batch_size: 100 does not divide"):
        derive_sizes(broken)


def test_algorithm_params_follow_the_chosen_function(data_files):
    config = load_config(GRPO, data_files)
    assert config.algorithm.advantage_params() == {"norm_by_std": True}
    # The shipped file leaves the clip to ppo_clip's own 0.2: nothing is passed.
    assert config.actor.policy_loss_params() == {}
    clipped = load_config(GRPO, [*data_files, "actor.clip_eps_high=0.28"])
    assert clipped.actor.policy_loss_params() == {"clip_eps_high": 0.28}
    reinforce = load_config(GRPO, [*data_files, "actor.policy_loss=reinforce"])
    assert reinforce.actor.policy_loss_params() == {}


# ------------------------------------------------------------------------------------ docs


def _leaf_defaults(cls: type, prefix: str) -> dict[str, object]:
    """Every leaf key under ``prefix`` with its default, as plain data."""
    out: dict[str, object] = {}
    for spec in dataclasses.fields(cls):
        key = f"{prefix}.{spec.name}" if prefix else spec.name
        default = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
        if dataclasses.is_dataclass(default):
            out.update(_leaf_defaults(type(default), key))
        else:
            out[key] = config_to_dict(default)
    return out


def test_docs_give_every_key_with_its_default():
    documented = documented_defaults()
    defaults = _leaf_defaults(RunConfig, "")
    del defaults["critic"], defaults["reward_model"], defaults["teacher"], defaults["agent"]
    defaults.update(_leaf_defaults(AgentConfig, "agent"))
    defaults.update(_leaf_defaults(CriticConfig, "critic"))
    defaults.update(_leaf_defaults(RewardModelConfig, "reward_model"))
    defaults.update(_leaf_defaults(TeacherConfig, "teacher"))
    defaults.update(_leaf_defaults(ShapingSpec, "reward.shaping[]"))
    defaults.update(_leaf_defaults(PoolConfig, "resource.pools.<name>"))
    missing = sorted(set(defaults) - set(documented))
    assert not missing, f"docs/config.md lacks {missing}"
    wrong = {key: (documented[key], value) for key, value in defaults.items() if documented[key] != value}
    assert not wrong, f"docs/config.md gives wrong defaults (documented, actual): {wrong}"


def test_a_registered_group_estimator_also_refuses_one_sample_per_prompt(data_files):
    @register_advantage_estimator("test_config.leave_one_out", compares_group_samples=True)
    def leave_one_out(data, **params):
        raise AssertionError("validation must not run the estimator")

    sizes = ["actor.ppo_mini_batch_size=64", "actor.ppo_micro_batch_size=16"]
    try:
        overrides = [*data_files, *sizes, "rollout.n=1", "algorithm.adv_estimator=test_config.leave_one_out"]
        problems = problems_of(GRPO, overrides)
    finally:
        ADVANTAGE_ESTIMATORS.unregister("test_config.leave_one_out")
    assert len(problems) == 1 and problems[0].startswith("rollout.n: must be >= 2")
