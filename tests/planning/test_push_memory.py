"""The weight push's memory terms against a real push: WeightStreamer's all-gathers on 2 gloo ranks
(the actor's side, colocated or split) and the rollout worker's hand-over of received tensors (the
engine's side of a split rollout)."""

from __future__ import annotations

import itertools
import weakref

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from hybridflow.models import build_tiny_causal_lm
from hybridflow.parallel import build_meshes, shard_model
from hybridflow.parallel.launch import run_ranks
from hybridflow.planning import gather_buffer_bytes, gloo_gather_copy_bytes
from hybridflow.planning.host_memory import HostPeakSampler
from hybridflow.resharding.streaming import WeightStreamer
from workers.rollout import _drained

BUCKET = 1 << 20
# Embedding and head: 24,000 x 256 fp32 = 24.6 MB each, far over the 1 MiB bucket; every other
# tensor fits in it.
VOCAB, HIDDEN = 24_000, 256


def _push_peak(rank: int, world: int) -> tuple[int, list[int]]:
    """Peak live-heap bytes above the level before a push whose consumer lets go of each tensor as
    the next arrives (as the sender and the engine do), and the full tensors' bytes."""
    model = build_tiny_causal_lm(
        VOCAB, HIDDEN, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=512
    )
    model = shard_model(model, build_meshes(world, tp_size=1).train, mp_policy=MixedPrecisionPolicy())
    streamer = WeightStreamer(BUCKET, torch.device("cpu"))
    sizes = []
    with HostPeakSampler() as sampler:
        for _, tensor in streamer.stream(model):
            sizes.append(tensor.numel() * tensor.element_size())
    return sampler.live - sampler.start_live, sizes


def test_a_cpu_push_holds_gloos_copy_of_the_largest_tensor_besides_the_gather_buffer() -> None:
    for peak, sizes in run_ranks(_push_peak, 2):
        largest = VOCAB * HIDDEN * 4
        assert max(sizes) == largest
        planned = gather_buffer_bytes(sizes, BUCKET) + gloo_gather_copy_bytes(sizes)
        assert planned == BUCKET + 2 * largest
        # gloo's all_gather_into_tensor gathers into a flat tensor of its own and copies it out: the
        # head's own allocation and that copy stand together (the gather buffer alone is 0.52 of it).
        assert 0.9 * planned <= peak <= 1.1 * planned, (peak, planned)


def test_the_rollout_worker_hands_the_engine_each_received_tensor_without_keeping_it() -> None:
    alive: list[weakref.ref[torch.Tensor]] = []

    def arrivals():  # as BroadcastReceiver.receive: a fresh tensor each, dropped once the next is asked for
        for _ in range(3):
            tensor = torch.ones(1000)
            alive.append(weakref.ref(tensor))
            yield tensor
            del tensor

    stream = arrivals()
    weights = _drained([next(stream)], stream)  # the first one, taken ahead to see whether weights came
    loaded = 0
    for tensor in weights:  # an engine that copies each tensor in and drops it
        loaded += int(tensor.sum())
        del tensor
        # What the engine has let go of is gone, the first tensor included.
        assert all(ref() is None for ref in alive[:-1])
    assert loaded == 3000 and alive[0]() is None
    # itertools.chain([first], rest), as before, keeps the first one while the rest arrive.
    stream = arrivals()
    for tensor in itertools.chain([next(stream)], stream):
        del tensor
        assert alive[3]() is not None
