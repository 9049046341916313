"""recipes/latent_grpo: the latent log-density, the straight-through flip, the advantage, and the latent
rollout against the training-layout forward (single process, the HF engine on a tiny model)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from hybridflow.algos import compute_policy_loss
from hybridflow.data.synthetic import arithmetic_rows, write_splits
from hybridflow.parallel.packing import position_ids_from_mask
from hybridflow.protocol import Batch
from hybridflow.rollout import HFRolloutEngine, SamplingParams
from recipes.latent_grpo.forward import latent_sequence_log_probs, sequence_embeddings
from recipes.latent_grpo.latent import (
    LatentSampling,
    first_position_selection,
    informative_groups,
    latent_grpo_advantages,
    latent_log_density,
    one_sided_gumbel,
    soft_embeddings,
)
from recipes.latent_grpo.rollout import LatentRolloutRecord, latent_rollout
from tests.rollout import _tiny
from trainer.config import load_config

RECIPE_CONFIG = Path(__file__).resolve().parents[2] / "recipes" / "latent_grpo" / "config.yaml"


def test_latent_log_density_matches_the_formula_by_hand():
    log_probs = torch.tensor([[-0.5, -1.0, -2.0]])
    g = torch.tensor([[0.0, -1.5, 1.0]])
    # d = g - logp = 0.5, -0.5, 3.0; each term -d - exp(-d).
    terms = [-0.5 - math.exp(-0.5), 0.5 - math.exp(0.5), -3.0 - math.exp(-3.0)]
    assert latent_log_density(log_probs, g).item() == pytest.approx(sum(terms) / 3, abs=1e-6)


def test_straight_through_flip_keeps_the_sign_and_bounds_the_gradient():
    # A policy that has moved past its stored noise: d = g - logp = 0.5, -0.5, -3.0 (two candidates
    # below g, which the one-sided noise never gives under the sampling policy).
    g = torch.tensor([[0.0, -1.5, -5.0], [0.0, -1.5, -5.0]])
    plain = torch.tensor([[-0.5, -1.0, -2.0]] * 2, requires_grad=True)
    flipped = torch.tensor([[-0.5, -1.0, -2.0]] * 2, requires_grad=True)
    # Row 0 has a positive advantage (no flip), row 1 a non-positive one.
    flip = torch.tensor([False, True])
    value_plain = latent_log_density(plain, g)
    value_flipped = latent_log_density(flipped, g, flip)
    assert torch.equal(value_plain, value_flipped)
    value_plain.sum().backward()
    value_flipped.sum().backward()
    # d/dlogp_k of the mean term: (1 - exp(-d_k)) / 3.
    d = [0.5, -0.5, -3.0]
    expected = torch.tensor([1 - math.exp(-x) for x in d]) / 3
    torch.testing.assert_close(plain.grad, torch.stack([expected, expected]))
    # Flipped, a candidate with d < 0 takes the term at -d: d/dlogp = (exp(d) - 1) / 3.
    flipped_row = torch.tensor([1 - math.exp(-0.5), math.exp(-0.5) - 1, math.exp(-3.0) - 1]) / 3
    torch.testing.assert_close(flipped.grad, torch.stack([expected, flipped_row]))
    # The sign is kept (negative: a non-positive advantage still lowers the candidate's log-prob) ...
    assert (flipped.grad[1, 1:] < 0).all() and (plain.grad[1, 1:] < 0).all()
    # ... and the size bounded by 1/K, where the plain gradient at d = -3 is (e^3 - 1) / 3 = 6.36.
    assert flipped.grad[1, 1:].abs().max() < 1 / 3 < plain.grad[1, 2].abs()
    assert flipped.grad[1, 2].item() == pytest.approx((math.exp(-3.0) - 1) / 3)
    # The flip that negated the gradient instead, (2 d.detach() - d), would give +(exp(-d) - 1) / 3 here.
    negated = -expected[1]
    assert negated > 0 and not torch.isclose(flipped.grad[1, 1], negated)


def test_dual_clip_of_the_recipe_config_bounds_a_negative_advantage_token(tmp_path):
    write_splits(arithmetic_rows(16, 4, digits=2, style="bare", seed=0), tmp_path, ("parquet",))
    config = load_config(
        RECIPE_CONFIG,
        [f"data.train_files=[{tmp_path / 'train.parquet'}]", f"data.val_files=[{tmp_path / 'test.parquet'}]"],
    )
    params = config.actor.policy_loss_params()
    assert params["dual_clip_c"] == 3.0
    # One token each, token-mean: A = -1 with ratio e^2 = 7.39 (PPO's term 7.39, the dual clip's 3);
    # A = -1 with ratio 2 (PPO's term 2 < 3: kept); A = +2 with ratio e^2 (clipped at 1.2: -2.4).
    log_prob = torch.tensor([[2.0], [math.log(2.0)], [2.0]])
    advantages = torch.tensor([[-1.0], [-1.0], [2.0]])
    loss, metrics = compute_policy_loss(
        config.actor.policy_loss, log_prob, torch.zeros(3, 1), advantages, torch.ones(3, 1), **params
    )
    assert loss.item() == pytest.approx((3.0 + 2.0 - 2.4) / 3, abs=1e-6)
    assert metrics["dual_clip_frac"].item() == pytest.approx(1 / 3)


def test_group_filtering_keeps_only_groups_whose_rewards_differ():
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5])
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    # Group 0 all right, group 2 all wrong, group 3 all equal (partial credit): dropped; group 1 kept.
    assert informative_groups(scores, group_ids).tolist() == [False] * 3 + [True] * 3 + [False] * 6


def test_without_first_position_selection_every_row_keeps_its_first_advantage():
    scores = torch.tensor([1.0, 1.0, 0.0])
    mask = torch.ones(3, 2, dtype=torch.long)
    group_ids = torch.zeros(3, dtype=torch.long)
    old_log_probs = torch.tensor([[-1.0, -1.0], [-0.5, -0.5], [0.0, 0.0]])
    truncated = torch.zeros(3, dtype=torch.bool)
    a = (1 - 2 / 3) / (math.sqrt(1 / 3) + 1e-6)
    plain = latent_grpo_advantages(scores, mask, group_ids, truncated, old_log_probs, select_first=False)
    torch.testing.assert_close(plain, torch.tensor([[a, a], [a, a], [-2 * a, -2 * a]]))
    # With it, only row 1 (the higher mean old log-prob of the two positive rows) keeps its first one.
    selected = latent_grpo_advantages(scores, mask, group_ids, truncated, old_log_probs)
    torch.testing.assert_close(selected, torch.tensor([[0.0, a], [a, a], [0.0, -2 * a]]))


def test_truncated_samples_get_zero_advantage_and_stay_out_of_the_statistics():
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0, 1.0, 0.0])
    truncated = torch.tensor([False, False, False, False, True, False, True])
    group_ids = torch.tensor([0, 0, 0, 0, 0, 1, 1])
    mask = torch.ones(7, 3, dtype=torch.long)
    mask[1, 2] = 0
    # The old log-probs decide the first position's winner among group 0's positive rows 0 and 2.
    old_log_probs = torch.tensor([[-1.0] * 3, [-0.1] * 3, [-0.5] * 3, [-2.0] * 3, [0.0] * 3, [-1.0] * 3, [0.0] * 3])
    advantages = latent_grpo_advantages(scores, mask, group_ids, truncated, old_log_probs)
    # Group 0 counts rows 0-3 only (row 4's score 5 is left out): mean 0.5, Bessel std sqrt(1/3).
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    # Group 1 has one untruncated row: mean 0, std 1.
    expected = torch.tensor(
        [[0.0, a, a], [0.0, -a, 0.0], [a, a, a], [0.0, -a, -a], [0.0, 0.0, 0.0], [1 / (1 + 1e-6)] * 3, [0.0] * 3]
    )
    torch.testing.assert_close(advantages, expected)


def test_first_position_keeps_one_positive_row_per_group():
    advantages = torch.tensor([[2.0, 2.0], [1.0, 1.0], [-1.0, -1.0], [-3.0, -3.0], [-1.0, -1.0]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1], [1, 1]])
    group_ids = torch.tensor([0, 0, 0, 1, 1])
    # Length-normalised: row 0 mean -1.0, row 1 mean -0.5 (one token): row 1 wins.
    old_log_probs = torch.tensor([[-1.0, -1.0], [-0.5, -9.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    out = first_position_selection(advantages, mask, group_ids, old_log_probs)
    # Group 1 has no positive row: unchanged.
    expected = torch.tensor([[0.0, 2.0], [1.0, 1.0], [0.0, -1.0], [-3.0, -3.0], [-1.0, -1.0]])
    torch.testing.assert_close(out, expected)


def test_one_sided_noise_lies_in_its_clamped_range():
    noise = one_sided_gumbel((4000,), 0.5, torch.Generator().manual_seed(0))
    assert noise.min().item() >= 0.0 and noise.max().item() <= 4.5 * 0.5 + 1e-6
    # P(G <= -1.5) = exp(-exp(1.5)) ~ 1.1%: those draws land exactly on 0.
    assert 0.002 < (noise == 0).float().mean().item() < 0.03


EOT = _tiny.tokenizer().convert_tokens_to_ids("=")
LATENT = LatentSampling(top_k=4, tau=0.7, noise_scale=1.0, end_of_thinking_id=EOT)
SAMPLING = SamplingParams(n=3, temperature=1.0, max_new_tokens=10, seed=0)


def _rollout(model, record=None, sampling=SAMPLING, seed=0):
    engine = HFRolloutEngine(model, eos_token_ids=(2,), pad_token_id=0)
    embedding = model.get_input_embeddings().weight.detach()
    return latent_rollout(
        engine.embedding_session, embedding, _tiny.prompts(), sampling, LATENT, (2,), 0,
        torch.Generator().manual_seed(seed), record,
    )


@pytest.fixture(scope="module")
def peaked_model():
    """A tiny model whose end-of-thinking token is likely enough that rows leave the latent phase."""
    model = _tiny.model()
    with torch.no_grad():
        model.lm_head.weight[EOT] *= 3
    return model


def test_rebuilt_soft_embeddings_reproduce_the_rollouts_inputs(peaked_model):
    record = LatentRolloutRecord(inputs=[])
    rollouts = _rollout(peaked_model, record)
    latent = rollouts["latent_mask"].bool()
    assert latent.any() and (~latent & rollouts["response_mask"].bool()).any()
    embedding = peaked_model.get_input_embeddings().weight.detach()
    rebuilt, _ = sequence_embeddings(rollouts, embedding, LATENT.tau)
    width = rollouts["responses"].shape[1]
    fed = torch.stack(record.inputs, dim=1)  # [rows, steps, hidden]: the input after each position
    steps = fed.shape[1]
    # The input after position t reaches the model when the row goes on to position t + 1.
    consumed = rollouts["response_mask"][:, 1 : steps + 1].bool()
    consumed = torch.cat([consumed, consumed.new_zeros(len(consumed), steps - consumed.shape[1])], dim=1)
    assert consumed.sum() > 20
    torch.testing.assert_close(rebuilt[:, -width:][:, :steps][consumed], fed[consumed], atol=1e-6, rtol=0)
    # The latent inputs are mixtures, not token embeddings.
    mixed = soft_embeddings(rollouts["latent_ids"][latent], rollouts["latent_g"][latent], LATENT.tau, embedding)
    assert not torch.isclose(mixed.unsqueeze(1), embedding.unsqueeze(0), atol=1e-4).all(-1).any()


def test_training_forward_reproduces_the_rollouts_log_probs(peaked_model):
    rollouts = _rollout(peaked_model, seed=1)
    embedding = peaked_model.get_input_embeddings().weight.detach()
    with torch.no_grad():
        trained = latent_sequence_log_probs(peaked_model, rollouts, embedding, LATENT.tau, SAMPLING.temperature)
    mask = rollouts["response_mask"].bool()
    torch.testing.assert_close(trained[mask], rollouts["rollout_log_probs"][mask], atol=2e-5, rtol=0)
    # A stale policy (other weights) does not.
    with torch.no_grad():
        stale = latent_sequence_log_probs(_tiny.model(seed=3), rollouts, embedding, LATENT.tau, 1.0)
    assert (stale[mask] - rollouts["rollout_log_probs"][mask]).abs().max() > 0.1


def test_greedy_rollout_draws_no_noise(peaked_model):
    greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=10, seed=0)
    first = _rollout(peaked_model, sampling=greedy, seed=0)
    second = _rollout(peaked_model, sampling=greedy, seed=5)
    assert torch.equal(first["responses"], second["responses"])
    assert torch.equal(first["latent_g"], second["latent_g"])
    # Without noise g is the log-prob itself, so the top candidate's g is its log-prob.
    latent = first["latent_mask"].bool()
    assert (first["latent_g"][latent][:, 0] <= 0).all()


def _gradient(model, rollouts, advantage: float) -> torch.Tensor:
    """The gradient of the summed training-layout log-probs in the LM head, with every advantage set to
    ``advantage`` (<= 0 turns the flip on where ``g - logp < 0``)."""
    model.zero_grad()
    batch = rollouts | Batch({"advantages": torch.full(rollouts["response_mask"].shape, advantage)})
    embedding = model.get_input_embeddings().weight.detach()
    latent_sequence_log_probs(model, batch, embedding, LATENT.tau, SAMPLING.temperature).sum().backward()
    return model.lm_head.weight.grad.clone()


def test_the_flip_is_inert_on_policy_and_acts_after_an_optimizer_step(peaked_model):
    model = copy.deepcopy(peaked_model)
    rollouts = _rollout(model, seed=2)
    assert rollouts["latent_mask"].any()
    # Under the sampling policy g - logp is the one-sided noise, >= 0: the flip changes nothing.
    torch.testing.assert_close(_gradient(model, rollouts, -1.0), _gradient(model, rollouts, 1.0), rtol=0, atol=0)
    # One optimizer step that raises the latent steps' log-densities moves logp past some stored g ...
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model.zero_grad()
    embedding = model.get_input_embeddings().weight.detach()
    (-latent_sequence_log_probs(model, rollouts, embedding, LATENT.tau, 1.0).sum()).backward()
    optimizer.step()
    embeds, mask = sequence_embeddings(rollouts, embedding, LATENT.tau)
    with torch.no_grad():
        logits = model(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    width = rollouts["responses"].shape[1]
    candidates = logits[:, -width - 1 : -1].log_softmax(-1).gather(-1, rollouts["latent_ids"])
    latent = rollouts["latent_mask"].bool()
    assert ((rollouts["latent_g"] - candidates)[latent] < 0).any()
    # ... and there, on the second pass over the batch, the flip acts.
    assert not torch.equal(_gradient(model, rollouts, -1.0), _gradient(model, rollouts, 1.0))
