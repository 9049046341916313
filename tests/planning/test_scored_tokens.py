"""The log-prob head's tokens in the memory planner against the actor's own forward: packed under the
varlen SDPA attention (the CPU path) the head scores the positions that predict a response token alone,
``response_length`` per row; unpacked, every position of the padded rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hybridflow.protocol import Batch
from tests.parallel._helpers import VOCAB, tiny_qwen2
from tests.trainer._runs import write_task
from tests.trainer.test_plan import _overrides
from trainer.config import load_config
from trainer.plan import plan_memory
from workers.actor import sequence_log_probs

ROWS, PROMPT, RESPONSE = 8, 16, 48


class _LogitRows(TorchDispatchMode):
    """Rows of every matrix product that produces ``[rows, VOCAB]`` logits while active."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default) and out.shape[-1] == VOCAB:
            self.rows.append(out.shape[0])
        return out


def _head_rows(use_packing: bool) -> int:
    """Positions whose logits the real `sequence_log_probs` computes for ROWS full-length rows with
    distinct prompts (the planner's worst case)."""
    model = tiny_qwen2()
    generator = torch.Generator().manual_seed(0)
    batch = Batch(
        {
            "input_ids": torch.randint(3, VOCAB, (ROWS, PROMPT), generator=generator),
            "attention_mask": torch.ones(ROWS, PROMPT, dtype=torch.long),
            "responses": torch.randint(3, VOCAB, (ROWS, RESPONSE), generator=generator),
            "response_mask": torch.ones(ROWS, RESPONSE, dtype=torch.long),
        }
    )
    with torch.no_grad(), _LogitRows() as logits:
        sequence_log_probs(model, batch, temperature=1.0, use_packing=use_packing, chunk_size=None)
    return sum(logits.rows)


@pytest.mark.parametrize(
    ("use_packing", "scored"), [(True, ROWS * RESPONSE), (False, ROWS * (PROMPT + RESPONSE))]
)
def test_the_planned_logits_are_those_of_the_positions_the_actor_scores(
    tmp_path: Path, use_packing: bool, scored: int
) -> None:
    assert _head_rows(use_packing) == scored
    task = write_task(tmp_path)
    # `_overrides`: 8-row micro-batches of 16 + 48 tokens, vocabulary 5000.
    keys = _overrides(task, "actor.logit_chunk_size=4096", f"actor.use_packing={str(use_packing).lower()}")
    (process,) = plan_memory(load_config(None, keys)).processes
    update = next(phase for phase in process.phases if phase.phase == "update")
    # 8 rows x 64 tokens in the micro-batch, of which 8 x 48 are scored when packed; 20 bytes per logit
    # under grad.
    assert update.moment == f"head backward, {ROWS * (PROMPT + RESPONSE)} tokens"
    assert update.components["logits"] == scored * 5000 * 20
