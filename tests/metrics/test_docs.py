"""docs/metrics.md names every metric the library produces."""

from __future__ import annotations

from pathlib import Path

import torch

from hybridflow.metrics import PhaseTimer, step_metrics, throughput_metrics
from hybridflow.protocol import Batch

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_every_metric_name_is_documented():
    mask = torch.ones(2, 3)
    full = Batch(
        {
            "response_mask": mask,
            "scores": torch.tensor([0.0, 1.0]),
            "token_level_rewards": torch.ones(2, 3),
            "group_ids": torch.tensor([0, 0]),
            "advantages": torch.ones(2, 3),
            "returns": torch.ones(2, 3),
            "values": torch.ones(2, 3),
            "rollout_log_probs": -torch.ones(2, 3),
            "old_log_probs": -torch.ones(2, 3),
        },
        {"finish_reason": ["stop", "length"]},
    )
    timer = PhaseTimer()
    with timer.step():
        pass
    names = {
        *step_metrics(full),
        *throughput_metrics(total_tokens=1, response_tokens=1, step_seconds=1.0, generation_seconds=1.0),
        *timer.metrics(),
    }
    assert len(names) > 30  # every column above contributed
    text = DOCS.read_text()
    missing = sorted(name for name in names if f"`{name}`" not in text)
    assert not missing, f"docs/metrics.md lacks {missing}"
