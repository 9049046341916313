"""``resharding.free_kv_cache`` decides whether the vLLM engine gives its KV cache back while training
(real Ray, gloo, FSDP2 and the CPU build of vLLM)."""

from __future__ import annotations

import pytest
import torch

from hybridflow.controller import ResourcePool, RoleSpec, create_colocated_worker_groups, register
from hybridflow.protocol import Batch
from hybridflow.resharding.manager import ReshardingConfig
from hybridflow.rollout.sampling import SamplingParams
from tests.workers._policy import ADAM, actor_args, vllm_rollout, write_policy
from workers.actor import ActorRolloutRefWorker


class SwitchReportingActor(ActorRolloutRefWorker):
    """The shipped actor, also answering what the engine freed or restored at each layout switch."""

    @register(dispatch="rank_zero")
    def engine_bytes_by_switch(self) -> list[tuple[str, int]]:
        return [(report.direction, report.engine_bytes) for report in self.resharder.reports]


def _switches(policy, free_kv_cache: bool) -> list[tuple[str, int]]:
    """The engine bytes of each switch of two generations with ``free_kv_cache``."""
    pool = ResourcePool([1], cpus_per_slot=0.5, name=f"free-kv-{free_kv_cache}")
    spec = RoleSpec(
        SwitchReportingActor,
        actor_args(
            policy,
            ADAM,
            # Eager (the helper's default): the cache's bytes are the same either way.
            vllm_rollout(1),
            ReshardingConfig(bucket_bytes=1 << 16, free_kv_cache=free_kv_cache),
            with_ref=False,
        ),
    )
    group = create_colocated_worker_groups(pool, {"actor": spec}, name=f"free-kv-{free_kv_cache}")["actor"]
    try:
        group.init_model()
        prompts = Batch({"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.ones(1, 3).long()})
        for seed in (1, 2):
            group.generate_sequences(prompts, SamplingParams(n=1, temperature=1.0, max_new_tokens=4, seed=seed))
        return group.engine_bytes_by_switch()
    finally:
        group.hosts.shutdown()
        pool.release()


@pytest.mark.parametrize("free_kv_cache", [True, False])
def test_free_kv_cache_decides_whether_the_engine_releases_its_cache(ray_cluster, tmp_path, free_kv_cache):
    switches = _switches(write_policy(tmp_path / "policy", seed=1), free_kv_cache)
    assert [direction for direction, _ in switches] == ["to_inference", "to_training"] * 2
    moved = {engine_bytes for _, engine_bytes in switches}
    if free_kv_cache:  # the same cache freed after, and restored before, every generation
        assert len(moved) == 1 and moved.pop() > 1 << 20, switches
    else:  # kept allocated from start-up on: nothing to free or restore
        assert moved == {0}, switches
