"""`RewardModelWorker`: scores prompt + response with a sequence-classification reward model.

Sharding: the reward model is FSDP2-sharded over all ranks like the critic, although it only runs
inference. It shares the devices with the actor, critic and rollout engine, and a reward model is often
as large as the policy: sharding costs one all-gather per layer per forward, replication would cost a
full copy of the weights on every device for the whole run.

Score position: the score of a sequence is the classification head's output at its **last valid
token** (from the attention masks), not at the last token that differs from the pad id as the Hugging
Face head does it. When the pad id equals the end-of-sequence id, which many models use, the Hugging
Face rule would skip the response's own final end-of-sequence token. Packing and padding therefore
never change a row's score.

Tokens: by default the policy's token ids are scored as they are, which assumes that the reward model
shares the policy's vocabulary. A reward model with another tokenizer is given
``reward_model.tokenizer``; prompt and response are then taken from the batch's text columns
(`PROMPT_TEXT_COLUMN`, `RESPONSE_TEXT_COLUMN`) and re-tokenised (see `reward_model_tokens`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedTokenizerBase

from hybridflow.algos import last_valid_token_mask, masked_sum
from hybridflow.contract import MODEL_INPUTS
from hybridflow.controller import DataParallel, Worker, register
from hybridflow.data.chat import render_plain
from hybridflow.parallel import on_worker_device, reshard_all
from hybridflow.protocol import Batch
from workers.config import RewardModelConfig
from workers.critic import TokenHeadModel, shard_head_model
from workers.training import micro_batches, sequence_inputs

__all__ = [
    "PROMPT_TEXT_COLUMN",
    "RESPONSE_TEXT_COLUMN",
    "RewardModelWorker",
    "load_score_model",
    "reward_model_tokens",
    "sequence_scores",
]

PROMPT_TEXT_COLUMN = "raw_prompt"
"""Non-tensor column with each prompt when re-tokenising: a string, or chat messages rendered with the
reward model's chat template."""
RESPONSE_TEXT_COLUMN = "response_text"
"""Non-tensor column with each decoded response (str) when re-tokenising."""


def load_score_model(path: str, dtype: torch.dtype = torch.float32) -> TokenHeadModel:
    """The sequence classifier in ``path`` (one label) as a backbone with a per-token score head."""
    classifier = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype, local_files_only=True)
    if classifier.config.num_labels != 1:
        raise ValueError(f"{path}: a reward model has one label, this one has {classifier.config.num_labels}")
    head = getattr(classifier, "score", None)
    if not isinstance(head, nn.Linear):
        raise ValueError(f"{type(classifier).__name__} has no linear `score` head to read the reward from")
    return TokenHeadModel(classifier.base_model, head)


def sequence_scores(model: nn.Module, batch: Batch, use_packing: bool) -> torch.Tensor:
    """The head's output at the last valid token of prompt + response: ``[batch]`` fp32.

    Reads ``input_ids``/``attention_mask`` and ``responses``/``response_mask``, on the model's device.
    """
    input_ids, attention_mask = sequence_inputs(batch)
    per_token = model(input_ids, attention_mask, packed=use_packing)
    return masked_sum(per_token, last_valid_token_mask(attention_mask), dim=-1)


def reward_model_tokens(
    tokenizer: PreTrainedTokenizerBase, prompt: str | Sequence[Mapping[str, str]], response: str
) -> list[int]:
    """The reward model's token ids for one prompt and its decoded response.

    A string prompt is followed by the response as it is. Chat messages get the response as a final
    assistant message, rendered with the tokenizer's chat template; without one, in the plain
    ``role: content`` format that `hybridflow.data.chat.render_plain` gives the policy.
    """
    if isinstance(prompt, str):
        return tokenizer(prompt + response)["input_ids"]
    messages = [dict(m) for m in prompt]
    if getattr(tokenizer, "chat_template", None) is None:
        return tokenizer(render_plain(messages) + response)["input_ids"]
    text = tokenizer.apply_chat_template(
        [*messages, {"role": "assistant", "content": response}], tokenize=False
    )
    # The template writes its own special tokens; adding them again would double the BOS.
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class RewardModelWorker(Worker):
    """A reward model, FSDP2-sharded over all ranks, for inference.

    Publishes only the ``"world"`` mesh: scoring is data-parallel over every rank.

    Args:
        config: the ``reward_model`` section (``path`` set).
        dtype: the dtype the weights load in (a run's is ``model.dtype``).
    """

    def __init__(self, config: RewardModelConfig, dtype: str = "float32") -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.mesh = init_device_mesh(self.device.type, (self.world_size,), mesh_dim_names=("fsdp",))
        self.tokenizer: PreTrainedTokenizerBase | None = None

    @register(dispatch="one_to_all")
    def init_model(self) -> dict[str, float]:
        """Load and shard the reward model (and its tokenizer when re-tokenising)."""
        start = time.perf_counter()
        if self.config.path is None:
            raise ValueError("reward_model.path: required: a local sequence-classification model directory")
        model = load_score_model(self.config.path, getattr(torch, self.dtype))
        self.model = shard_head_model(
            model.to(self.device), self.mesh, self.config.param_dtype, self.device_plan, trainable=False
        )
        self.model.eval()
        if self.config.tokenizer is not None:
            self.tokenizer = AutoTokenizer.from_pretrained(self.config.tokenizer, local_files_only=True)
        return {"init/reward_model_load_s": time.perf_counter() - start}

    @register(dispatch=DataParallel(), reads=MODEL_INPUTS, writes=("rm_scores", "token_level_rm_scores"))
    @on_worker_device
    def compute_rm_score(self, batch: Batch) -> Batch:
        """Score each prompt + response.

        Input: ``input_ids``/``attention_mask [batch, prompt_len]``, ``responses``/``response_mask
        [batch, response_len]``; when re-tokenising also `PROMPT_TEXT_COLUMN` and `RESPONSE_TEXT_COLUMN`.

        Output: ``rm_scores [batch]`` fp32, the model's score (its unit); ``token_level_rm_scores
        [batch, response_len]`` fp32, that score at the last valid response token and 0 elsewhere (all
        0 for an empty response: the score has no token to sit on).
        """
        config = self.config
        # Re-tokenised rows are built on the host; they go where the incoming batch was placed.
        sequences = self._sequences(batch).to(self.device)
        parts, restore = micro_batches(sequences, config.forward_micro_batch_size, config.token_budget)
        with torch.no_grad():
            scores = torch.cat([sequence_scores(self.model, p, config.use_packing) for p in parts])
        reshard_all(self.model)
        scores = scores[restore.to(scores.device)]
        last = last_valid_token_mask(batch["response_mask"])
        return Batch(
            {"rm_scores": scores, "token_level_rm_scores": last.to(scores.dtype) * scores.unsqueeze(-1)}
        )

    def _sequences(self, batch: Batch) -> Batch:
        """The token rows to score, as prompt columns plus response columns."""
        if self.tokenizer is None:
            return batch.select("input_ids", "attention_mask", "responses", "response_mask", meta=False)
        columns = (PROMPT_TEXT_COLUMN, RESPONSE_TEXT_COLUMN)
        missing = [c for c in columns if c not in batch.non_tensors]
        if missing:
            raise ValueError(
                f"reward_model.tokenizer is set, so the batch must carry the text columns {missing}; "
                f"it has {batch.keys()}"
            )
        rows = [
            reward_model_tokens(self.tokenizer, prompt, response)
            for prompt, response in zip(batch[columns[0]], batch[columns[1]], strict=True)
        ]
        width = max(len(r) for r in rows)
        input_ids = torch.zeros(len(rows), width, dtype=torch.long)
        attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, ids in enumerate(rows):
            input_ids[i, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            attention_mask[i, : len(ids)] = 1
        # The whole re-tokenised text sits in the prompt columns and the response columns are empty:
        # the micro-batching and the forward read prompt + response and need no split between them.
        empty = input_ids[:, :0]
        return Batch(
            {
                "input_ids": input_ids,
                "attention_mask": attention_mask,
                "responses": empty,
                "response_mask": empty,
            }
        )
