"""Activation checkpointing of decoder layers (non-reentrant), applied before FSDP2 sharding."""

from __future__ import annotations

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

# The wrapper inserts this segment into parameter names; weights.hf_param_name strips it again.
CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."


def _parent_and_attr(model: nn.Module, module: nn.Module) -> tuple[nn.Module, str]:
    for parent in model.modules():
        for attr, child in parent.named_children():
            if child is module:
                return parent, attr
    raise ValueError(f"{type(module).__name__} is not a submodule of {type(model).__name__}")


def apply_activation_checkpointing(model: nn.Module, layers: list[nn.Module]) -> list[nn.Module]:
    """Replace each of ``layers`` inside ``model`` by a checkpointed wrapper and return the wrappers.

    Each layer keeps only its inputs for backward and recomputes its activations there. Non-reentrant
    checkpointing is used because the reentrant variant rejects keyword arguments (HF layers receive
    ``position_embeddings``/``attention_mask`` as keywords) and only back-propagates into a layer
    whose positional inputs require grad.
    """
    wrapped = []
    for layer in layers:
        parent, attr = _parent_and_attr(model, layer)
        wrapper = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        setattr(parent, attr, wrapper)
        wrapped.append(wrapper)
    return wrapped
