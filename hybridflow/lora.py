"""LoRA adapters on a Hugging Face causal LM: the ``actor.lora`` section, adding and switching adapters,
merging them into the base weights, and the PEFT adapter directory.

A LoRA-adapted linear layer computes ``W x + scaling * B (A x)`` with the frozen base weight
``W [out, in]``, ``A [rank, in]``, ``B [out, rank]`` and ``scaling = alpha / rank``. ``B`` starts at
zero, so a freshly adapted model computes exactly what the base model computes. The adapters are
added in place (the model keeps its class and its Hugging Face names, each adapted layer's weight moving
to ``<layer>.base_layer.weight`` beside ``<layer>.lora_A.default.weight`` and
``<layer>.lora_B.default.weight``), so FSDP2 wraps it as any other model.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from safetensors.torch import save_file
from torch import nn

from hybridflow.config_fields import check_bounds, config_field

if TYPE_CHECKING:
    import peft
    from peft.tuners.tuners_utils import BaseTunerLayer

__all__ = [
    "ADAPTER_NAME",
    "LoraConfig",
    "adapters_disabled",
    "add_adapters",
    "is_adapter_name",
    "merge_adapters",
    "peft_adapter_name",
    "save_peft_adapter",
]

ADAPTER_NAME = "default"
"""The one adapter an adapted model holds (its name appears in the parameter names)."""

_BASE_SEGMENT = ".base_layer."
_ADAPTER_SEGMENTS = (f".lora_A.{ADAPTER_NAME}.", f".lora_B.{ADAPTER_NAME}.")


@dataclass(frozen=True)
class LoraConfig:
    """The ``actor.lora`` section: LoRA adapters on the actor (null: full fine-tuning).

    ``rank`` and ``alpha`` set each adapter's shape and scale (``scaling = alpha / rank``); ``dropout`` is
    the dropout on the adapters' input while training. ``target_modules`` names the linear layers that
    get an adapter, by the last segment of their name (``q_proj``, ``down_proj``, ...). ``push`` is what
    the weight sync hands the rollout engine: ``adapters`` sends the adapter tensors alone to an engine
    that holds the same adapters (HF, vLLM), ``merged`` sends full weights with the adapters merged in
    (``W + scaling * B A``), bucket by bucket. ``seed`` draws the ``A`` matrices (the same on every rank).
    """

    rank: int = config_field(8, ge=1)
    alpha: float = config_field(16.0, gt=0)
    dropout: float = config_field(0.0, ge=0, le=0.9)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    push: Literal["adapters", "merged"] = "adapters"
    seed: int = config_field(0, ge=0)

    def __post_init__(self) -> None:
        check_bounds(self, "actor.lora")
        if not self.target_modules:
            raise ValueError("actor.lora.target_modules: name at least one linear layer")

    @property
    def scaling(self) -> float:
        """The factor of ``B A`` in each adapted layer: ``alpha / rank``."""
        return self.alpha / self.rank

    def peft_config(self) -> peft.LoraConfig:
        """The same adapters as PEFT describes them (``B`` initialised to zero)."""
        # PEFT is imported where adapters are built, not where a config section is read.
        import peft

        return peft.LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            init_lora_weights=True,
            bias="none",
        )


def is_adapter_name(name: str) -> bool:
    """Whether the parameter ``name`` is an adapter tensor (``...lora_A.default.weight`` or ``lora_B``)."""
    return any(segment in name for segment in _ADAPTER_SEGMENTS)


def add_adapters(model: nn.Module, config: LoraConfig) -> nn.Module:
    """Add ``config``'s adapters to ``model`` in place and return it; only the adapters stay trainable.

    ``A`` is drawn from ``config.seed`` in a private random scope, so every rank builds the same adapters
    without disturbing the caller's stream; ``B`` is zero. The model's training/eval mode is kept.

    Raises:
        ValueError: naming ``actor.lora.target_modules`` when no layer of ``model`` matches.
    """
    from peft import inject_adapter_in_model

    training = model.training
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        try:
            inject_adapter_in_model(config.peft_config(), model, adapter_name=ADAPTER_NAME)
        except ValueError as error:
            raise ValueError(f"actor.lora.target_modules {list(config.target_modules)}: {error}") from error
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter_name(name))
    model.train(training)
    return model


def _adapter_layers(model: nn.Module) -> list[BaseTunerLayer]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [module for module in model.modules() if isinstance(module, BaseTunerLayer)]


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run ``model`` as its base model (every adapter off) inside the block: the reference policy of a
    LoRA actor, with no second copy of the weights. On exit the adapters are on and trainable again."""
    layers = _adapter_layers(model)
    if not layers:
        raise ValueError("adapters_disabled: the model has no adapters")
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def merge_adapters(weights: Iterable[tuple[str, torch.Tensor]], scaling: float) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's weights under its own names, adapters merged in, from an adapted model's stream.

    ``weights`` yields ``(name, full_tensor)`` of an adapted model (``state_dict`` names, in any order
    that brings each layer's ``base_layer.weight``, ``lora_A`` and ``lora_B`` together). Each adapted
    weight comes out once its three tensors have arrived, as ``W + scaling * B @ A [out, in]`` in ``W``'s
    dtype under the plain name (``...q_proj.weight``); the other entries pass through renamed
    (``base_layer.bias`` -> ``bias``). At most one layer's three tensors are held at once when they come
    in order, as a ``state_dict`` gives them.
    """
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        if _BASE_SEGMENT in name and name.endswith(".weight"):
            layer, part = name[: -len(f"{_BASE_SEGMENT}weight")], "W"
        elif is_adapter_name(name):
            layer, part = name.split(".lora_")[0], name.split(".lora_")[1][0]
        else:
            yield name.replace(_BASE_SEGMENT, "."), tensor
            continue
        parts = pending.setdefault(layer, {})
        parts[part] = tensor
        if len(parts) == 3:
            del pending[layer]
            base = parts["W"]
            delta = parts["B"].to(base.dtype) @ parts["A"].to(base.dtype)
            yield f"{layer}.weight", torch.add(base, delta, alpha=scaling)
    if pending:
        raise ValueError(f"merge_adapters: layers missing a base weight or an adapter: {sorted(pending)}")


def peft_adapter_name(name: str) -> str:
    """The key PEFT's adapter files use for an adapted model's parameter ``name``
    (``model.layers.0.self_attn.q_proj.lora_A.default.weight`` ->
    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``)."""
    return "base_model.model." + name.replace(f".{ADAPTER_NAME}.", ".")


def save_peft_adapter(
    target: Path, adapters: Mapping[str, torch.Tensor], config: LoraConfig, base_model: str | None = None
) -> Path:
    """Write a PEFT adapter directory (``adapter_config.json``, ``adapter_model.safetensors``) that
    ``peft.PeftModel.from_pretrained`` (and vLLM's ``LoRARequest``) loads onto the base model.

    Args:
        target: the directory, created if needed.
        adapters: the adapter tensors under the adapted model's parameter names (`is_adapter_name`).
        config: the adapters' shape and scale.
        base_model: recorded as ``base_model_name_or_path``.
    """
    target.mkdir(parents=True, exist_ok=True)
    tensors = {peft_adapter_name(name): t.detach().contiguous().cpu() for name, t in adapters.items()}
    save_file(tensors, str(target / "adapter_model.safetensors"))
    peft_config = config.peft_config()
    peft_config.base_model_name_or_path = base_model
    peft_config.save_pretrained(str(target))
    return target
