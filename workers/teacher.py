"""`TeacherWorker`: a frozen causal LM of its own path that scores the student's sampled tokens.

On-policy distillation (docs/distillation.md) needs, for every response token the policy (the student)
sampled, its log-prob under another model (the teacher). The teacher is loaded from ``teacher.path``,
FSDP2-sharded over the ranks of its pool and never trained. Placed like the reward model: on the
``global`` pool it shares the actor's processes (one process per slot holds both); mapped to a pool of
its own by ``resource.placement.teacher``, it runs in processes of its own.

The teacher reads the student's token ids as they are, so the two must share one tokenizer:
`check_same_vocabulary` refuses a mismatch before any worker starts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch.distributed.device_mesh import init_device_mesh
from transformers import PreTrainedTokenizerBase

from hybridflow.contract import MODEL_INPUTS
from hybridflow.controller import DataParallel, Worker, register
from hybridflow.models.io import load_causal_lm, load_tokenizer_dir
from hybridflow.parallel import (
    load_fsdp_params,
    offload_fsdp_params,
    on_worker_device,
    reshard_all,
    shard_model,
)
from hybridflow.protocol import Batch
from workers.actor import sequence_log_probs
from workers.config import TeacherConfig
from workers.training import micro_batches

__all__ = ["TEACHER_LOG_PROBS", "TeacherWorker", "check_same_vocabulary"]

TEACHER_LOG_PROBS = "teacher_log_probs"
"""The column `TeacherWorker.compute_teacher_log_prob` writes."""


def check_same_vocabulary(
    tokenizer: PreTrainedTokenizerBase, tokenizer_source: str | Path, teacher_path: str | Path
) -> None:
    """Refuse a teacher that would read the actor's token ids as other tokens.

    The teacher's tokenizer (saved in ``teacher_path``) must map every token to the id the actor's
    ``tokenizer`` (from ``tokenizer_source``) gives it, and the teacher's embedding must hold every
    one of those ids.

    Raises:
        ValueError: naming ``teacher.path``, both folders, and the first difference found.
    """
    where = f"teacher.path: the teacher ({teacher_path}) and the actor (tokenizer {tokenizer_source})"
    try:
        teacher_tokenizer = load_tokenizer_dir(teacher_path)
    except (OSError, ValueError) as error:
        raise ValueError(f"teacher.path: no tokenizer could be read from {teacher_path}: {error}") from error
    actor_tokens = {i: token for token, i in tokenizer.get_vocab().items()}
    teacher_tokens = {i: token for token, i in teacher_tokenizer.get_vocab().items()}
    if actor_tokens != teacher_tokens:
        first = min(
            i
            for i in actor_tokens.keys() | teacher_tokens.keys()
            if actor_tokens.get(i) != teacher_tokens.get(i)
        )
        raise ValueError(
            f"{where} must share one tokenizer: the teacher's has {len(teacher_tokens)} tokens, the actor's "
            f"{len(actor_tokens)}, and id {first} is {teacher_tokens.get(first)!r} in the teacher's, "
            f"{actor_tokens.get(first)!r} in the actor's"
        )
    config_file = Path(teacher_path) / "config.json"
    if not config_file.is_file():
        raise ValueError(
            f"teacher.path: {teacher_path} holds no config.json (not a Hugging Face model folder)"
        )
    embedded = json.loads(config_file.read_text()).get("vocab_size")
    if embedded is not None and embedded < len(tokenizer):
        raise ValueError(
            f"{where}: the teacher's embedding holds {embedded} ids, fewer than the {len(tokenizer)} tokens "
            "of the shared tokenizer"
        )


class TeacherWorker(Worker):
    """A frozen causal LM, FSDP2-sharded over all ranks of its pool, that computes the log-probs of
    given response tokens.

    Publishes only the ``"world"`` mesh: scoring is data-parallel over every rank.

    Args:
        config: the ``teacher`` section (``path`` set).
        dtype: the dtype the weights load in (a run's is ``model.dtype``).
    """

    def __init__(self, config: TeacherConfig, dtype: str = "float32") -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.mesh = init_device_mesh(self.device.type, (self.world_size,), mesh_dim_names=("fsdp",))

    @register(dispatch="one_to_all")
    def init_model(self) -> dict[str, float]:
        """Load and shard the teacher."""
        start = time.perf_counter()
        config = self.config
        if config.path is None:
            raise ValueError("teacher.path: required: a local causal-LM model directory")
        model = load_causal_lm(config.path, getattr(torch, self.dtype)).to(self.device)
        model.set_attn_implementation(self.device_plan.attn_implementation(config.param_dtype))
        model.requires_grad_(False)
        self.model = shard_model(
            model, self.mesh, mp_policy=self.device_plan.mixed_precision(config.param_dtype)
        )
        if config.param_offload:
            offload_fsdp_params(self.model)
        return {"init/teacher_load_s": time.perf_counter() - start}

    @register(dispatch=DataParallel(), reads=MODEL_INPUTS, writes=(TEACHER_LOG_PROBS,))
    @on_worker_device
    def compute_teacher_log_prob(self, batch: Batch, *, temperature: float) -> Batch:
        """``teacher_log_probs [batch, response_len]`` (nats): ``log_softmax(logits / temperature)`` of the
        teacher at each response token of ``responses``, 0 on padding.

        Input: ``input_ids``/``attention_mask [batch, prompt_len]`` (left-padded prompts) and
        ``responses``/``response_mask [batch, response_len]`` (the student's samples, right-padded).
        """
        config = self.config
        if config.param_offload:
            load_fsdp_params(self.model, self.device)
        parts, restore = micro_batches(batch, config.forward_micro_batch_size, config.token_budget)
        with torch.no_grad():
            outs = [
                sequence_log_probs(
                    self.model,
                    part,
                    temperature=temperature,
                    use_packing=config.use_packing,
                    chunk_size=config.logit_chunk_size,
                ).log_probs
                for part in parts
            ]
        reshard_all(self.model)
        if config.param_offload:
            offload_fsdp_params(self.model)
        log_probs = torch.cat(outs)[restore.to(outs[0].device)]
        return Batch({TEACHER_LOG_PROBS: log_probs * batch["response_mask"].to(log_probs.dtype)})
