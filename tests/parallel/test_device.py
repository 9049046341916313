"""Device placement decided in one place (`DevicePlan`), and every role and helper following it.

On a CPU-only machine a batch left on the host cannot be told apart from one moved to "the device",
so placement is checked where it can be observed: on the ``meta`` device (a second device every torch
has), on a process whose ``torch.cuda.is_available()`` is forced to ``True`` (what a CPU worker sees on
a GPU machine), and in the pure decision itself.
"""

from __future__ import annotations

import inspect
import itertools

import numpy as np
import pytest
import torch

from hybridflow.controller.register import registered_methods
from hybridflow.controller.worker import WorkerContext
from hybridflow.parallel import (
    FLASH_ATTENTION,
    VARLEN_SDPA,
    build_meshes,
    choose_attn_implementation,
    local_device_plan,
    on_worker_device,
    places_batches_on_device,
    plan_devices,
    process_group_device_plan,
    run_ranks,
)
from hybridflow.protocol import Batch
from trainer.config import schema
from workers.actor import ActorRolloutRefWorker
from workers.critic import CriticWorker
from workers.reward_model import RewardModelWorker
from workers.teacher import TeacherWorker

ROLES = (ActorRolloutRefWorker, CriticWorker, RewardModelWorker, TeacherWorker)
# Methods that hand their Batch to a rollout engine, which places its own inputs (the HF engine moves
# them to its model's device; vLLM takes token lists; episodes start from the prompts' id lists).
ENGINE_INPUTS = {(ActorRolloutRefWorker, "generate_sequences"), (ActorRolloutRefWorker, "generate_episodes")}


def _context(use_gpu: bool) -> WorkerContext:
    return WorkerContext(
        rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1", master_port=0, use_gpu=use_gpu
    )


# ---------------------------------------------------------------------------------------- the decision


def test_a_cpu_worker_is_planned_on_the_cpu_even_where_gpus_are_visible():
    plan = plan_devices(False, cuda_available=True, flash_attn_installed=True)
    assert plan.device == torch.device("cpu")
    assert plan.device_type == "cpu"
    assert plan.backend == "gloo"
    assert plan.default_compute_dtype == torch.float32
    assert plan.attn_implementation("bfloat16") == VARLEN_SDPA


def test_a_gpu_worker_gets_its_gpu_nccl_and_bf16_by_default():
    plan = plan_devices(True, cuda_available=True, flash_attn_installed=True)
    assert plan.device == torch.device("cuda", 0)
    assert (plan.device_type, plan.backend) == ("cuda", "nccl")
    assert plan.compute_dtype(None) == torch.bfloat16
    policy = plan.mixed_precision(None)
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert plan.attn_implementation(None) == FLASH_ATTENTION
    # An explicit dtype wins over the default, and fp32 compute turns flash-attention off.
    assert plan.mixed_precision("float32").param_dtype == torch.float32
    assert plan.attn_implementation("float32") == VARLEN_SDPA


def test_a_gpu_asked_for_where_none_is_visible_is_refused():
    with pytest.raises(ValueError, match="use_gpu"):
        plan_devices(True, cuda_available=False, flash_attn_installed=False)


def test_an_unknown_param_dtype_is_refused_by_name():
    plan = plan_devices(False, cuda_available=False, flash_attn_installed=False)
    with pytest.raises(ValueError, match="'fp8'"):
        plan.compute_dtype("fp8")


def test_flash_attention_only_with_half_precision_on_cuda_when_installed():
    chosen = {
        (device, dtype, installed): choose_attn_implementation(device, dtype, installed)
        for device, dtype, installed in itertools.product(
            ("cpu", "cuda"), (torch.float32, torch.bfloat16, torch.float16), (False, True)
        )
    }
    flash = {key for key, attn in chosen.items() if attn == FLASH_ATTENTION}
    assert flash == {("cuda", torch.bfloat16, True), ("cuda", torch.float16, True)}
    assert set(chosen.values()) == {FLASH_ATTENTION, VARLEN_SDPA}


def test_the_run_config_defaults_to_bf16_on_gpu_and_fp32_on_cpu():
    gpu = plan_devices(True, cuda_available=True, flash_attn_installed=False)
    cpu = plan_devices(False, cuda_available=False, flash_attn_installed=False)
    defaults = (schema.ActorConfig(), schema.CriticConfig(), schema.RewardModelConfig())
    for param_dtype in (section.param_dtype for section in defaults):
        assert gpu.compute_dtype(param_dtype) == torch.bfloat16
        assert cpu.compute_dtype(param_dtype) == torch.float32


def test_the_worker_context_follows_use_gpu():
    context = _context(use_gpu=False)
    assert (context.device, context.backend) == (torch.device("cpu"), "gloo")
    assert context.device_plan == local_device_plan(False)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="use_gpu"):
            _ = _context(use_gpu=True).device


# ---------------------------------------------------------------------------------------- batches


class _MetaWorker:
    """A role whose device is ``meta``: whatever reaches its methods shows where it was placed."""

    device = torch.device("meta")

    @on_worker_device
    def record(self, batch: Batch, scale: float, *, extra: Batch) -> dict[str, object]:
        return {
            "batch": {key: value.device for key, value in batch.tensors.items()},
            "extra": {key: value.device for key, value in extra.tensors.items()},
            "scale": scale,
            "text": list(batch["text"]),
            "meta": dict(batch.meta),
        }


def test_on_worker_device_moves_every_batch_argument_to_the_worker_device():
    batch = Batch(
        {"input_ids": torch.ones(2, 3, dtype=torch.long), "advantages": torch.zeros(2, 3)},
        {"text": np.array(["a", "b"], dtype=object)},
        {"temperature": 0.7},
    )
    extra = Batch({"returns": torch.zeros(2)})
    seen = _MetaWorker().record(batch, 2.0, extra=extra)
    meta = torch.device("meta")
    assert seen["batch"] == {"input_ids": meta, "advantages": meta}
    assert seen["extra"] == {"returns": meta}
    assert (seen["scale"], seen["text"], seen["meta"]) == (2.0, ["a", "b"], {"temperature": 0.7})
    # The caller's batch is not moved in place.
    assert batch["advantages"].device == torch.device("cpu")


def _takes_a_batch(method: object) -> bool:
    parameters = inspect.signature(method).parameters.values()
    return any(p.annotation in ("Batch", Batch) for p in parameters)


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.__name__)
def test_every_role_method_that_takes_a_batch_runs_it_on_the_worker_device(role):
    batch_methods = {
        name for name in registered_methods(role) if _takes_a_batch(getattr(role, name))
    } - {name for owner, name in ENGINE_INPUTS if owner is role}
    assert batch_methods, f"{role.__name__} has no registered method taking a Batch"
    unplaced = sorted(name for name in batch_methods if not places_batches_on_device(getattr(role, name)))
    assert unplaced == [], f"{role.__name__} leaves these methods' batches on the host: {unplaced}"


# ---------------------------------------------------------------------------------------- meshes


def _meshes_with_cuda_visible(rank: int, world_size: int) -> dict[str, object]:
    """In a gloo group whose process claims a GPU (as a CPU worker does on a GPU machine)."""
    torch.cuda.is_available = lambda: True
    from hybridflow.algos import AGGREGATION_MODES
    from hybridflow.resharding.manager import ReshardingConfig
    from hybridflow.rollout.config import RolloutConfig
    from workers.config import (
        ActorConfig,
        ActorDerived,
        CriticConfig,
        CriticDerived,
        RefConfig,
        RewardModelConfig,
    )

    derived = ActorDerived(model_path="", objective=ActorConfig().objective())
    actor = ActorRolloutRefWorker(ActorConfig(), RefConfig(), RolloutConfig(), ReshardingConfig(), derived)
    critic = CriticDerived(model_path="", aggregation=AGGREGATION_MODES.get("token-mean"))
    return {
        "plan": (process_group_device_plan().device_type, process_group_device_plan().backend),
        "default_mesh": build_meshes(world_size, 1).train.device_type,
        "actor": (actor.meshes.train.device_type, actor.meshes.infer.device_type, actor.device.type),
        "critic": CriticWorker(CriticConfig(), critic).mesh.device_type,
        "reward_model": RewardModelWorker(RewardModelConfig()).mesh.device_type,
    }


def test_meshes_of_cpu_workers_are_cpu_meshes_where_cuda_is_visible():
    (seen,) = run_ranks(_meshes_with_cuda_visible, 1, timeout_s=120)
    assert seen == {
        "plan": ("cpu", "gloo"),
        "default_mesh": "cpu",
        "actor": ("cpu", "cpu", "cpu"),
        "critic": "cpu",
        "reward_model": "cpu",
    }


def _rank_placement(rank: int, world_size: int) -> tuple[str, str, str]:
    import torch.distributed as dist

    plan = process_group_device_plan()
    return dist.get_backend(), str(plan.device), str(torch.ones(1, device=plan.device).device)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_run_ranks_on_gpus_gives_each_rank_nccl_and_its_own_gpu():
    assert run_ranks(_rank_placement, 2, use_gpu=True, timeout_s=120) == [("nccl", "cuda:0", "cuda:0")] * 2
