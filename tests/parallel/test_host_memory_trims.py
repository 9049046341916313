"""On CPU the resharding manager trims the heap at its layout switches only for engines that hold
host memory of their own: around the HF engine the memory a phase frees stays for the next phase.

Measured by page faults: a phase that allocates, touches and frees ``BLOCK_BYTES`` between two
switches faults those pages in again after every trim, and not at all when nothing trims.
"""

from __future__ import annotations

import resource

import torch

from hybridflow.parallel import build_meshes, shard_model
from hybridflow.resharding.manager import ReshardingConfig, ReshardingManager
from hybridflow.rollout import HFRolloutEngine
from tests.parallel._helpers import run_distributed, tiny_qwen2

# Below glibc's largest dynamic mmap threshold (32 MiB), so after the first free it is served from
# the heap, and below twice itself, so glibc's own trimming on free leaves it there.
BLOCK_BYTES = 12 * 2**20
PAGE_BYTES = resource.getpagesize()
CYCLES = 6


class TrimmingHFEngine(HFRolloutEngine):
    """The HF engine under the policy of an engine with host memory of its own (vLLM's)."""

    trims_host_memory = True


def _faults_per_cycle(manager: ReshardingManager) -> float:
    def cycle() -> None:
        with manager:
            pass
        block = torch.ones(BLOCK_BYTES // 4)  # a phase's activations: allocated, touched, freed
        del block

    for _ in range(2):  # the first frees raise glibc's mmap threshold above the block
        cycle()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(CYCLES):
        cycle()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / CYCLES


def _job(rank: int, world_size: int) -> None:
    meshes = build_meshes(world_size, 1)
    model = shard_model(tiny_qwen2(seed=0), meshes.train)
    block_pages = BLOCK_BYTES / PAGE_BYTES
    faults = {}
    for engine_class in (HFRolloutEngine, TrimmingHFEngine):
        engine = engine_class(tiny_qwen2(seed=1), eos_token_ids=[2], pad_token_id=0)
        manager = ReshardingManager(model, engine, None, ReshardingConfig(), torch.device("cpu"))
        faults[engine_class.__name__] = _faults_per_cycle(manager)
        # The switches still streamed the training weights into the engine.
        engine_state = engine.model.state_dict()
        for name, tensor in tiny_qwen2(seed=0).state_dict().items():
            torch.testing.assert_close(engine_state[name], tensor, msg=name)
    assert faults["HFRolloutEngine"] < 0.2 * block_pages, (faults, block_pages)
    assert faults["TrimmingHFEngine"] > 0.8 * block_pages, (faults, block_pages)


def test_switches_around_the_hf_engine_leave_freed_memory_to_the_next_phase():
    run_distributed(_job, 1)
