"""`CriticWorker`: the PPO value model, a linear value head on a causal-LM backbone, trained with FSDP2.

Value convention. ``values[b, t]`` is V(s_t): the return expected from response token ``t`` onwards,
predicted from the state *before* that token is generated, i.e. from the final hidden state at the
token that precedes response token ``t`` (the last prompt token for ``t = 0``). This is the position
whose logits give the actor's log-prob of response token ``t``, so ``values``, ``old_log_probs`` and
``advantages`` line up column by column, and GAE's ``delta_t = r_t + gamma * V_{t+1} - V_t`` uses the
value before and after token ``t``. Columns where ``response_mask`` is 0 hold 0.

`TokenHeadModel` (a backbone with a linear head on every token) is shared with the reward model.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from transformers import AutoModel

from hybridflow.algos import clipped_value_loss, masked_sum
from hybridflow.contract import MODEL_INPUTS
from hybridflow.controller import DataParallel, Worker, register
from hybridflow.parallel import (
    DevicePlan,
    accumulation_steps,
    on_worker_device,
    pack_sequences,
    packing_kwargs,
    position_ids_from_mask,
    reshard_all,
    shard_model,
    unpack_tokens,
)
from hybridflow.protocol import Batch
from workers.config import CriticConfig, CriticDerived
from workers.training import (
    build_lr_scheduler,
    build_optimizer,
    clip_and_step,
    gather_full_state,
    global_sum,
    load_training_state,
    micro_batches,
    mini_batches,
    save_training_state,
    sequence_inputs,
)

__all__ = ["CriticWorker", "TokenHeadModel", "load_value_model", "response_values", "shard_head_model"]


class TokenHeadModel(nn.Module):
    """A transformer backbone with a linear head applied to every token's final hidden state.

    The critic's value model (head ``hidden -> 1``) and the reward model's scorer. The backbone is
    named ``model`` as in Hugging Face task models, so `shard_model` finds its decoder layers at
    ``model.layers`` and its parameter names match the directory it was loaded from. Under FSDP2 the
    head belongs to the root unit, whose weights are gathered by this module's forward: call the
    module itself, never ``.model`` or ``.head`` alone.
    """

    def __init__(self, backbone: nn.Module, head: nn.Linear) -> None:
        super().__init__()
        if head.out_features != 1:
            raise ValueError(f"the head must have one output, got {head.out_features}")
        self.model = backbone
        self.head = head
        self.config = backbone.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, packed: bool) -> torch.Tensor:
        """Head output at every token of ``input_ids [batch, seq_len]``: ``[batch, seq_len]`` fp32, 0 at pads.

        ``attention_mask [batch, seq_len]`` marks valid tokens (any padding side). With ``packed`` the
        valid tokens run as one row (no compute on padding); otherwise the padded batch runs with
        positions counted over valid tokens only, so both give each row the result it has alone.
        """
        if packed:
            rows = pack_sequences(input_ids, attention_mask)
            kwargs = packing_kwargs(self.model, rows)
            hidden = self.model(input_ids=rows.input_ids, use_cache=False, **kwargs).last_hidden_state
            # A copy, not the view unpack_tokens returns: FSDP2 hooks the root's outputs for backward,
            # and an in-place op on a view would bypass that hook.
            return unpack_tokens(self.head(hidden[0]).squeeze(-1).float(), rows).clone()
        hidden = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        ).last_hidden_state
        per_token = self.head(hidden).squeeze(-1).float()
        return torch.where(attention_mask.bool(), per_token, 0.0)


def load_value_model(path: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> TokenHeadModel:
    """The backbone of the causal LM in ``path`` (its ``lm_head`` is not loaded) and a new value head.

    The head's weight is drawn from ``N(0, initializer_range)`` with a generator seeded by ``seed`` and
    its bias is 0, so every rank builds the same head before sharding. A zero weight would make the
    first update reach only the head (no gradient flows through a zero matrix into the backbone).
    """
    backbone = AutoModel.from_pretrained(path, dtype=dtype, local_files_only=True)
    text_config = backbone.config.get_text_config()
    head = nn.Linear(text_config.hidden_size, 1)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.weight.normal_(0.0, text_config.initializer_range, generator=generator)
        head.bias.zero_()
    return TokenHeadModel(backbone, head.to(dtype))


def shard_head_model(
    model: TokenHeadModel,
    mesh: DeviceMesh,
    param_dtype: str | None,
    plan: DevicePlan,
    *,
    trainable: bool,
    activation_checkpointing: bool = False,
) -> nn.Module:
    """Shard ``model`` with FSDP2 over ``mesh``: each decoder layer a unit, then the root (embeddings,
    final norm, head). The compute dtype and the attention follow ``plan`` for ``param_dtype`` (None:
    the device's default); activation checkpointing applies to a trainable model only. Attention is a
    per-sequence (varlen) kind, so packed rows cost no dense mask over a micro-batch's tokens."""
    model.model.set_attn_implementation(plan.attn_implementation(param_dtype))
    model.requires_grad_(trainable)
    return shard_model(
        model,
        mesh,
        mp_policy=plan.mixed_precision(param_dtype),
        activation_checkpointing=activation_checkpointing and trainable,
    )


def response_values(model: nn.Module, batch: Batch, use_packing: bool) -> torch.Tensor:
    """V(s_t) for each response token: ``[batch, response_len]``, 0 where ``response_mask`` is 0.

    Reads ``input_ids``/``attention_mask [batch, prompt_len]`` (left-padded, at least one prompt
    column) and ``responses``/``response_mask [batch, response_len]``, on the model's device.
    Differentiable.
    """
    input_ids, attention_mask = sequence_inputs(batch)
    response_mask = batch["response_mask"]
    response_len = response_mask.shape[1]
    if input_ids.shape[1] <= response_len:
        raise ValueError(
            "the batch has no prompt columns: the value of response token 0 needs a token before it"
        )
    per_token = model(input_ids, attention_mask, packed=use_packing)
    # Column t is read at the token before response token t (see the module docstring).
    values = per_token[:, -response_len - 1 : -1]
    return torch.where(response_mask.bool(), values, 0.0)


class CriticWorker(Worker):
    """The value model, FSDP2-sharded over all ranks, with its AdamW optimizer and LR schedule.

    Publishes only the ``"world"`` mesh: values and updates are data-parallel over every rank.

    Args:
        config: the ``critic`` section.
        derived: the backbone's directory, the resolved loss aggregation, the schedule's span, the seed
            and the loss's norm constant (``trainer.config.derive_values``).
    """

    def __init__(self, config: CriticConfig, derived: CriticDerived) -> None:
        super().__init__()
        self.config = config
        self.derived = derived
        self.mesh = init_device_mesh(self.device.type, (self.world_size,), mesh_dim_names=("fsdp",))
        self.update_steps = 0

    @register(dispatch="one_to_all")
    def init_model(self) -> dict[str, float]:
        """Load the backbone, add the value head, shard, and build the optimizer and schedule."""
        start = time.perf_counter()
        config, derived = self.config, self.derived
        model = load_value_model(derived.model_path, getattr(torch, derived.dtype), derived.seed)
        self.model = shard_head_model(
            model.to(self.device),
            self.mesh,
            config.param_dtype,
            self.device_plan,
            trainable=True,
            activation_checkpointing=config.activation_checkpointing,
        )
        self.optimizer = build_optimizer(self.model, config)
        self.scheduler = build_lr_scheduler(self.optimizer, config, derived.optimizer_steps)
        return {"init/critic_load_s": time.perf_counter() - start}

    # ------------------------------------------------------------------ values

    @register(dispatch=DataParallel(), reads=MODEL_INPUTS, writes=("values",))
    @on_worker_device
    def compute_values(self, batch: Batch) -> Batch:
        """``values [batch, response_len]`` (unit of the returns) under the current critic, no grad.

        Input: ``input_ids``, ``attention_mask``, ``responses``, ``response_mask``.
        """
        config = self.config
        self.model.eval()
        parts, restore = micro_batches(batch, config.forward_micro_batch_size, config.token_budget)
        with torch.no_grad():
            values = torch.cat(
                [response_values(self.model, p, config.use_packing) for p in parts]
            )
        reshard_all(self.model)
        return Batch({"values": values[restore.to(values.device)].cpu()})

    # ------------------------------------------------------------------ training

    @register(dispatch=DataParallel(allow_padding=False), reads=(*MODEL_INPUTS, "values", "returns"))
    @on_worker_device
    def update_critic(self, batch: Batch) -> dict[str, float]:
        """Regress the values on ``returns``: ``critic.ppo_epochs`` passes of mini-batches, each an optimizer step.

        ``batch`` needs ``input_ids``, ``attention_mask``, ``responses``, ``response_mask``, ``values``
        (the predictions the returns were computed with: the clip centre) and ``returns``, all
        ``[batch, ...]``. Each micro-batch's loss is normalised by the token and row counts of the
        whole mini-batch over all ranks, so the step does not depend on the micro-batch size or the
        number of ranks. Returns ``critic/value_loss``, ``critic/vf_clip_frac``, ``critic/values_mean``
        (before the step), ``critic/grad_norm`` and ``critic/lr``, averaged over mini-batches.
        """
        config = self.config
        self.model.train()
        totals: dict[str, float] = defaultdict(float)
        steps = 0
        for epoch in range(config.ppo_epochs):
            seed = self.derived.seed + 1000 * self.update_steps + epoch
            for mini in mini_batches(batch, config.ppo_mini_batch_size, self.world_size, config.shuffle, seed):
                for key, value in self._train_mini_batch(mini).items():
                    totals[key] += value
                steps += 1
        self.update_steps += 1
        reshard_all(self.model)
        return {key: value / steps for key, value in totals.items()}

    def _train_mini_batch(self, mini: Batch) -> dict[str, float]:
        config = self.config
        mask = mini["response_mask"]
        global_tokens = global_sum(mask.sum())
        global_seqs = global_sum(mask.bool().any(dim=-1).sum())
        parts, _ = micro_batches(mini, config.ppo_micro_batch_size, config.token_budget)
        self.optimizer.zero_grad(set_to_none=True)
        local: dict[str, float] = defaultdict(float)
        for part in accumulation_steps(self.model, parts, config.gather_once_per_mini_batch):
            values = response_values(self.model, part, config.use_packing)
            part_mask = part["response_mask"]
            loss, raw = clipped_value_loss(
                values,
                part["values"].to(values.dtype),
                part["returns"].to(values.dtype),
                part_mask,
                cliprange_value=config.cliprange_value,
                # The function, not the name: a recipe may have registered it in the controller only.
                loss_agg_mode=self.derived.aggregation,
                global_token_count=global_tokens,
                global_seq_count=global_seqs,
                norm_constant=self.derived.loss_norm_constant,
            )
            # FSDP2 averages gradients over ranks; the loss shares are meant to be summed.
            (loss * self.world_size).backward()
            # Token-weighted shares, so that the sums over micro-batches and ranks are mini-batch means.
            tokens = max(global_tokens, 1.0)
            local["critic/value_loss"] += loss.item()
            local["critic/vf_clip_frac"] += raw["clip_frac"].item() * part_mask.sum().item() / tokens
            local["critic/values_mean"] += masked_sum(values.detach(), part_mask).item() / tokens
        grad_norm, lr = clip_and_step(self.model, self.optimizer, self.scheduler, config.grad_clip)
        metrics = {key: global_sum(value) for key, value in sorted(local.items())}
        metrics.update({"critic/grad_norm": grad_norm, "critic/lr": lr})
        return metrics

    @register(dispatch="one_to_all")
    def gather_full_state(self) -> dict[str, torch.Tensor] | None:
        """The critic's full weights (``model.*`` backbone names, ``head.weight``/``head.bias``) on
        rank 0, ``None`` elsewhere. A collective; for inspection and small models."""
        return gather_full_state(self.model, self.rank)

    # ------------------------------------------------------------------ checkpoints

    @register(dispatch="one_to_all")
    def save_checkpoint(self, directory: str) -> None:
        """Write a distributed checkpoint (model + optimizer shards, schedule, step count) under
        ``directory``. File names carry ``critic`` so the actor can save into the same directory."""
        save_training_state(
            Path(directory), "critic", self.model, self.optimizer, self.scheduler, self.update_steps, self.rank
        )

    @register(dispatch="one_to_all")
    def load_checkpoint(self, directory: str) -> None:
        """Restore what `save_checkpoint` wrote (the model must be initialised first)."""
        self.update_steps = load_training_state(Path(directory), "critic", self.model, self.optimizer, self.scheduler)
