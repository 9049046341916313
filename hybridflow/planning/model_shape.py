"""The shapes of a decoder-only transformer, read from its Hugging Face ``config.json``.

The memory planner needs every parameter tensor's shape (FSDP2 shards each tensor along dim 0, so the
per-rank bytes depend on the shapes, not only on the total) and the sizes that set activation memory.
Supported are the architectures the library trains: Qwen2, Qwen3, Llama and Mistral, whose parameters
are an embedding, per layer q/k/v/o projections, a gated MLP and two RMSNorms, a final RMSNorm, and an
untied or tied head.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "HeadKind",
    "ModelShape",
    "count_parameters",
    "lora_shapes",
    "parameter_shapes",
]

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")

HeadKind = Literal["lm", "value", "score"]
"""What sits on the backbone: ``lm`` the causal-LM head (``lm_head``, absent when tied to the
embedding), ``value`` the critic's ``hidden -> 1`` linear with bias (`workers.critic.TokenHeadModel`),
``score`` a sequence classifier's bias-free ``hidden -> num_labels`` linear."""


@dataclass(frozen=True)
class ModelShape:
    """Sizes of a decoder-only transformer.

    Attributes:
        model_type: the ``config.json`` ``model_type`` (one of `SUPPORTED_MODEL_TYPES`).
        vocab_size, hidden_size, num_layers, intermediate_size: as in ``config.json``.
        num_heads, num_kv_heads, head_dim: attention heads (grouped-query: ``num_kv_heads`` <= ``num_heads``).
        tie_word_embeddings: the LM head reuses the embedding matrix.
        qkv_bias, o_bias, mlp_bias: which projections carry a bias.
        qk_norm: per-head RMSNorm on queries and keys (Qwen3).
        num_labels: outputs of a sequence-classification head (reward models); unused otherwise.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    num_labels: int = 2

    @property
    def q_dim(self) -> int:
        """Width of the query projection's output, ``num_heads * head_dim``."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection's output, ``num_kv_heads * head_dim``."""
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], source: str = "config.json") -> ModelShape:
        """The shape a ``config.json`` dictionary describes; ``source`` names it in error messages.

        Raises:
            ValueError: the model type is not supported, or a required key is missing.
        """
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"{source}: model_type {model_type!r} is not one the planner knows "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )

        def required(key: str) -> int:
            if config.get(key) is None:
                raise ValueError(f"{source}: {model_type} config has no {key!r}")
            return int(config[key])

        hidden, heads = required("hidden_size"), required("num_attention_heads")
        head_dim = config.get("head_dim") or hidden // heads
        attention_bias = bool(config.get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=required("vocab_size"),
            hidden_size=hidden,
            num_layers=required("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            intermediate_size=required("intermediate_size"),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases and no o_proj bias; the others follow attention_bias.
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=model_type != "qwen2" and attention_bias,
            mlp_bias=bool(config.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            # Hugging Face's default classifier has two labels when config.json names none.
            num_labels=len(config["id2label"])
            if config.get("id2label")
            else int(config.get("num_labels", 2)),
        )


def _layer_shapes(shape: ModelShape, index: int) -> dict[str, tuple[int, ...]]:
    h, prefix = shape.hidden_size, f"model.layers.{index}."
    shapes: dict[str, tuple[int, ...]] = {}
    for name, width in (("q_proj", shape.q_dim), ("k_proj", shape.kv_dim), ("v_proj", shape.kv_dim)):
        shapes[f"{prefix}self_attn.{name}.weight"] = (width, h)
        if shape.qkv_bias:
            shapes[f"{prefix}self_attn.{name}.bias"] = (width,)
    shapes[f"{prefix}self_attn.o_proj.weight"] = (h, shape.q_dim)
    if shape.o_bias:
        shapes[f"{prefix}self_attn.o_proj.bias"] = (h,)
    if shape.qk_norm:
        shapes[f"{prefix}self_attn.q_norm.weight"] = (shape.head_dim,)
        shapes[f"{prefix}self_attn.k_norm.weight"] = (shape.head_dim,)
    inter = shape.intermediate_size
    for name, dims in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))):
        shapes[f"{prefix}mlp.{name}.weight"] = dims
        if shape.mlp_bias:
            shapes[f"{prefix}mlp.{name}.bias"] = (dims[0],)
    shapes[f"{prefix}input_layernorm.weight"] = (h,)
    shapes[f"{prefix}post_attention_layernorm.weight"] = (h,)
    return shapes


def parameter_shapes(shape: ModelShape, head: HeadKind = "lm") -> dict[str, tuple[int, ...]]:
    """Every parameter tensor of the model, by its Hugging Face name, in module order.

    A tied LM head is the embedding itself and is listed once (as ``model.parameters()`` yields it).
    """
    h = shape.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab_size, h)}
    for index in range(shape.num_layers):
        shapes.update(_layer_shapes(shape, index))
    shapes["model.norm.weight"] = (h,)
    if head == "lm" and not shape.tie_word_embeddings:
        shapes["lm_head.weight"] = (shape.vocab_size, h)
    elif head == "value":
        shapes["head.weight"] = (1, h)
        shapes["head.bias"] = (1,)
    elif head == "score":
        shapes["score.weight"] = (shape.num_labels, h)
    return shapes


def lora_shapes(shape: ModelShape, target_modules: Iterable[str], rank: int) -> dict[str, tuple[int, ...]]:
    """The LoRA adapter tensors `hybridflow.lora.add_adapters` adds to the decoder layers' linear layers
    named in ``target_modules``: ``lora_A [rank, in]`` and ``lora_B [out, rank]`` of each, under the
    adapted model's names, in module order."""
    targets = set(target_modules)
    shapes: dict[str, tuple[int, ...]] = {}
    for index in range(shape.num_layers):
        for name, dims in _layer_shapes(shape, index).items():
            layer = name.removesuffix(".weight")
            if len(dims) == 2 and layer.rsplit(".", 1)[-1] in targets:
                out_features, in_features = dims
                shapes[f"{layer}.lora_A.default.weight"] = (rank, in_features)
                shapes[f"{layer}.lora_B.default.weight"] = (out_features, rank)
    return shapes


def count_parameters(shape: ModelShape, head: HeadKind = "lm") -> int:
    """Number of parameters (``sum(p.numel() for p in model.parameters())`` of the built model)."""
    total = 0
    for dims in parameter_shapes(shape, head).values():
        numel = 1
        for dim in dims:
            numel *= dim
        total += numel
    return total
