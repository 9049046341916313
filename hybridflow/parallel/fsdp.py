"""FSDP2 (``fully_shard``) wrapping of a Hugging Face causal LM."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from hybridflow.parallel.checkpointing import apply_activation_checkpointing
from hybridflow.parallel.device import local_device_plan


def find_decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks of ``model``, in forward order.

    HF models name their block class in ``_no_split_modules`` (e.g. ``["Qwen2DecoderLayer"]``); that is
    the unit to shard and to checkpoint. Models without it fall back to ``model.model.layers``.
    """
    block_names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in block_names]
    if not layers:
        inner = getattr(model, "model", None)
        layers = list(getattr(inner, "layers", None) or ())
    if not layers:
        raise ValueError(
            f"cannot find decoder layers in {type(model).__name__}: it declares no _no_split_modules "
            "and has no model.layers"
        )
    return layers


def default_mixed_precision(device_type: str) -> MixedPrecisionPolicy:
    """The mixed-precision policy used when none is given: the `DevicePlan` default of a worker
    computing on ``device_type``.

    bf16 compute with fp32 gradient reduction on CUDA; fp32 on CPU (bf16 there is opt-in through
    ``param_dtype``, measurements in docs/parallel.md).
    """
    return local_device_plan(device_type == "cuda").mixed_precision(None)


def shard_model(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    reshard_after_forward: bool = True,
    mp_policy: MixedPrecisionPolicy | None = None,
    activation_checkpointing: bool = False,
) -> nn.Module:
    """Shard ``model`` in place with FSDP2 over the 1-d ``mesh`` and return it.

    Every decoder layer becomes its own FSDP unit (one all-gather per layer), then the root takes the
    rest (embeddings, final norm, lm_head; tied embeddings stay one parameter because both ends live in
    the root unit). ``reshard_after_forward`` applies to the layers: ``False`` keeps gathered layer
    weights from forward to backward (faster, more memory). The root keeps FSDP2's default, which does
    not reshard after forward. Activation checkpointing wraps the layers before sharding, so the wrapped
    layer is what FSDP2 shards.
    """
    layers = find_decoder_layers(model)
    if activation_checkpointing:
        layers = apply_activation_checkpointing(model, layers)
    mp_policy = mp_policy or default_mixed_precision(mesh.device_type)
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    return model


def reshard_all(model: nn.Module) -> None:
    """Free every gathered FSDP2 unit of ``model``.

    After a forward without backward the root (and layers with ``reshard_after_forward=False``) hold
    full weights; parameter reads then see plain tensors instead of DTensors, and memory stays high.
    """
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


MicroBatch = TypeVar("MicroBatch")


def accumulation_steps(model: nn.Module, parts: Sequence[MicroBatch], gather_once: bool) -> Iterator[MicroBatch]:
    """Yield ``parts``, the micro-batches of one optimizer step, for the caller's forward and backward.

    With ``gather_once`` FSDP2 gathers ``model``'s weights once for the whole step instead of twice per
    micro-batch, and reduces the gradients once: before each part but the last, the layers keep their
    gathered weights after forward and backward and skip the gradient reduce-scatter (FSDP2 accumulates
    the unsharded gradients in its reduce dtype, fp32); the last part's backward reduces and reshards.
    Under mixed precision each gather is also a cast of every weight, so this saves two casts of the
    model per micro-batch; the cost is the memory of the gathered weights and an unsharded fp32
    gradient for the whole step. Afterwards the layers reshard after forward again, as `shard_model`
    made them. Without ``gather_once`` it yields ``parts`` unchanged.
    """
    if not gather_once:
        yield from parts
        return
    # Layers only: the root unit never reshards after forward (FSDP2's default for it).
    layers = [m for m in model.modules() if isinstance(m, FSDPModule) and m is not model]
    for layer in layers:
        layer.set_reshard_after_forward(False, recurse=False)
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            model.set_requires_gradient_sync(last)
            model.set_reshard_after_backward(last)
            yield part
    finally:
        for layer in layers:
            layer.set_reshard_after_forward(True, recurse=False)
        model.set_requires_gradient_sync(True)
        model.set_reshard_after_backward(True)
