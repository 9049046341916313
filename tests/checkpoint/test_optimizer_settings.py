"""On resume the config's optimizer settings win over the checkpoint's, and nothing else changes.

A real AdamW with the trainer's schedule, saved and loaded through `save_training_state` /
`load_training_state` (a torch distributed checkpoint in a one-process gloo group). The learning rate
that `clip_and_step` reports (the value logged as ``actor/lr``) is computed here by hand from the
config and the schedule's position.
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
from torch import nn

from workers.config import ActorConfig
from workers.training import build_lr_scheduler, clip_and_step, load_training_state, save_training_state

TOTAL_STEPS = 10
WARMUP = 2
STEPS_BEFORE_SAVE = 4


@pytest.fixture(scope="module")
def single_rank():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _built(config: ActorConfig) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, betas=tuple(config.betas), weight_decay=config.weight_decay
    )
    return model, optimizer, build_lr_scheduler(optimizer, config, TOTAL_STEPS)


def _train(model: nn.Module, optimizer, scheduler, steps: int) -> list[float]:
    lrs = []
    for step in range(steps):
        optimizer.zero_grad()
        inputs = torch.arange(8.0).reshape(2, 4) + step
        model(inputs).square().mean().backward()
        lrs.append(clip_and_step(model, optimizer, scheduler, grad_clip=None)[1])
    return lrs


def _cosine_factor(step: int, min_lr_ratio: float = 0.0) -> float:
    """The schedule by hand: linear warm-up over WARMUP optimizer steps, then cosine over the rest."""
    import math

    if step < WARMUP:
        return (step + 1) / WARMUP
    progress = (step - WARMUP) / (TOTAL_STEPS - WARMUP)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.fixture(scope="module")
def saved(single_rank, tmp_path_factory):
    """A checkpoint of STEPS_BEFORE_SAVE updates at lr 1e-5, betas (0.9, 0.999), weight decay 0.01."""
    folder = tmp_path_factory.mktemp("optimizer")
    config = ActorConfig(lr=1e-5, lr_scheduler="cosine", warmup_steps=WARMUP)
    model, optimizer, scheduler = _built(config)
    lrs = _train(model, optimizer, scheduler, STEPS_BEFORE_SAVE)
    save_training_state(folder, "actor", model, optimizer, scheduler, STEPS_BEFORE_SAVE, rank=0)
    continued = _train(model, optimizer, scheduler, 1)
    return folder, config, lrs, continued[0], optimizer.state_dict()


def test_the_checkpoint_run_logs_the_schedule_computed_by_hand(saved):
    _, _, lrs, _, _ = saved
    assert lrs == pytest.approx([1e-5 * _cosine_factor(step) for step in range(STEPS_BEFORE_SAVE)], rel=1e-12)


def test_an_unchanged_config_resumes_bit_for_bit(saved):
    folder, config, _, continued_lr, _ = saved
    model, optimizer, scheduler = _built(config)
    assert load_training_state(folder, "actor", model, optimizer, scheduler) == STEPS_BEFORE_SAVE
    assert _train(model, optimizer, scheduler, 1) == [continued_lr]


def test_an_edited_lr_betas_and_weight_decay_win_over_the_checkpoint(saved):
    """The probe: the checkpoint trained at 1e-5, the config now says 1e-4; the next update's lr is
    1e-4 times the schedule at the saved position (the old code reported 1e-5 times it)."""
    folder, _, _, continued_lr, saved_optimizer = saved
    edited = ActorConfig(lr=1e-4, lr_scheduler="cosine", warmup_steps=WARMUP, betas=(0.8, 0.95), weight_decay=0.1)
    model, optimizer, scheduler = _built(edited)
    load_training_state(folder, "actor", model, optimizer, scheduler)
    group = optimizer.param_groups[0]
    assert (group["betas"], group["weight_decay"], group["initial_lr"]) == ((0.8, 0.95), 0.1, 1e-4)
    # The moments and the step count still come from the checkpoint.
    loaded_state = optimizer.state_dict()["state"]
    assert loaded_state[0]["step"] == STEPS_BEFORE_SAVE
    assert not torch.equal(loaded_state[0]["exp_avg"], torch.zeros_like(loaded_state[0]["exp_avg"]))
    lr = _train(model, optimizer, scheduler, 1)[0]
    assert lr == pytest.approx(1e-4 * _cosine_factor(STEPS_BEFORE_SAVE), rel=1e-12)
    assert lr == pytest.approx(10 * continued_lr, rel=1e-12)
    assert saved_optimizer["param_groups"][0]["lr"] != optimizer.param_groups[0]["lr"]
