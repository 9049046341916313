"""The rollout as a placeable role in the config: where it runs by default, what splits it off, and the
checks that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow.data import write_rows
from trainer.config import ConfigError, derive_sizes, derive_values, load_config
from trainer.roles import build_pools, role_specs
from trainer.runtime import uncorrected_staleness
from workers.rollout import RolloutWorker

POOL = "resource.pools={rollout_pool: {nodes: 1, slots_per_node: 3}}"


@pytest.fixture
def base(tmp_path: Path) -> list[str]:
    data = tmp_path / "train.jsonl"
    row = {"data_source": "toy", "prompt": [{"role": "user", "content": "1+1="}], "reward_model": {"ground_truth": "2"}}
    write_rows([row], data)
    return [f"data.train_files=[{data}]", "data.train_batch_size=6", "rollout.n=4", "actor.ppo_mini_batch_size=24"]


def problems(overrides: list[str]) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    return info.value.problems


def test_the_rollout_follows_the_actor_unless_placed_elsewhere(base):
    colocated = load_config(None, base).resource
    assert colocated.pool_of("rollout") == "global" and not colocated.splits_rollout
    moved = load_config(None, [*base, POOL, "resource.placement={actor_rollout: rollout_pool}"]).resource
    assert moved.pool_of("rollout") == "rollout_pool" and not moved.splits_rollout
    split = load_config(None, [*base, POOL, "resource.placement={rollout: rollout_pool}"]).resource
    assert split.pool_of("rollout") == "rollout_pool" and split.splits_rollout


def test_a_split_run_starts_a_rollout_role_and_an_actor_without_engine(base, tmp_path):
    config = load_config(None, [*base, POOL, "resource.placement={rollout: rollout_pool}"])
    sizes = derive_sizes(config)
    assert sizes.rollout_dp_size == 3  # the rollout pool's 3 engines, not the actor's 2 ranks
    specs = role_specs(config, sizes, 1, tmp_path)
    assert specs["rollout"].cls is RolloutWorker
    assert derive_values(config, sizes, 1, tmp_path).actor.rollout_split
    colocated = load_config(None, base)
    assert "rollout" not in role_specs(colocated, derive_sizes(colocated), 1, tmp_path)
    assert not derive_values(colocated, derive_sizes(colocated), 1, tmp_path).actor.rollout_split


def test_custom_resources_reach_the_pools_bundles(base):
    config = load_config(
        None,
        [
            *base,
            "resource.custom_resources={trainer_node: 1}",
            "resource.pools={rollout_pool: {custom_resources: {rollout_node: 0.5}}}",
        ],
    )
    pools = build_pools(config)
    assert pools["global"].custom_resources == {"trainer_node": 1}
    assert pools["rollout_pool"].custom_resources == {"rollout_node": 0.5}


def test_split_checks_name_their_keys(base):
    found = problems(
        [
            *base,
            "resource.pools={rollout_pool: {nodes: 1, slots_per_node: 3, custom_resources: {rollout_node: 0}}}",
            "resource.placement={rollout: rollout_pool}",
            "rollout.tp_size=2",
            "model.tiny.num_kv_heads=2",
            "agent.environment=tool_calls",
        ]
    )
    text = "\n".join(found)
    assert "resource.pools.rollout_pool.custom_resources.rollout_node: must be a positive amount" in text
    assert "resource.placement.rollout: multi-turn episodes (agent) run only on the colocated engine" in text
    assert "rollout.tp_size: 2 does not divide the world size 3 of the rollout pool" in text


def test_stale_rows_without_the_rollout_correction_are_warned_of(base):
    split = [*base, POOL, "resource.placement={rollout: rollout_pool}", "resharding.max_log_prob_gap=null"]
    assert uncorrected_staleness(load_config(None, split)) is None  # synchronous: nothing stale
    ahead = [*split, "async_rollout.max_staleness=2"]
    notice = uncorrected_staleness(load_config(None, ahead))
    assert notice is not None
    assert "async_rollout.max_staleness=2" in notice and "actor.rollout_correction=token" in notice
    for correction in ("token", "sequence"):
        assert uncorrected_staleness(load_config(None, [*ahead, f"actor.rollout_correction={correction}"])) is None
