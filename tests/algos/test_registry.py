"""Registry behaviour: lookup, errors that list the valid names, registration from outside."""

import pytest
import torch
from torch.testing import assert_close

from hybridflow.algos import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATION_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    Registry,
    UnknownNameError,
    aggregate_loss,
    compute_advantage,
    compute_kl,
    compute_policy_loss,
    register_advantage_estimator,
    register_aggregation_mode,
    register_kl_estimator,
    register_policy_loss,
)


def test_builtin_names_are_registered():
    assert ADVANTAGE_ESTIMATORS.names() == (
        "gae",
        "gpg",
        "grpo",
        "opo",
        "pass_at_k",
        "reinforce_pp",
        "reinforce_pp_baseline",
        "remax",
        "rloo",
    )
    assert POLICY_LOSSES.names() == (
        "cispo",
        "clip_cov",
        "gmpo",
        "gspo",
        "kl_cov",
        "ppo_clip",
        "reinforce",
        "sapo",
    )
    assert KL_ESTIMATORS.names() == ("k1", "k2", "k3")
    assert AGGREGATION_MODES.names() == (
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
        "token-mean",
    )


def test_decorator_registers_and_returns_function_unchanged():
    reg = Registry("widget")

    @reg.register("double")
    def double(x):
        return 2 * x

    assert reg.get("double") is double
    assert double(3) == 6
    assert "double" in reg
    assert list(reg) == ["double"]
    assert len(reg) == 1


def test_unknown_name_error_names_bad_name_and_all_choices():
    reg = Registry("widget")
    reg.add("alpha", lambda: 1)
    reg.add("beta", lambda: 2)
    with pytest.raises(UnknownNameError) as info:
        reg.get("gamma")
    message = str(info.value)
    assert "'gamma'" in message
    assert "alpha" in message and "beta" in message
    assert "widget" in message
    # Both exception types a caller may reasonably catch.
    assert isinstance(info.value, KeyError)
    assert isinstance(info.value, ValueError)


def test_unknown_name_suggests_close_match():
    with pytest.raises(KeyError, match="did you mean 'grpo'"):
        ADVANTAGE_ESTIMATORS.get("grop")


@pytest.mark.parametrize(
    ("lookup", "bad", "valid"),
    [
        (lambda: compute_advantage({}, "nope"), "nope", ADVANTAGE_ESTIMATORS.names()),
        (lambda: compute_kl(torch.zeros(1, 1), torch.zeros(1, 1), "k4"), "k4", KL_ESTIMATORS.names()),
        (
            lambda: aggregate_loss(torch.zeros(1, 1), torch.ones(1, 1), "mean"),
            "mean",
            AGGREGATION_MODES.names(),
        ),
        (
            lambda: compute_policy_loss("ppo", *(torch.zeros(1, 1),) * 4),
            "ppo",
            POLICY_LOSSES.names(),
        ),
    ],
)
def test_family_lookups_list_valid_choices(lookup, bad, valid):
    with pytest.raises(ValueError) as info:
        lookup()
    message = str(info.value)
    assert repr(bad) in message
    for name in valid:
        assert name in message


def test_duplicate_registration_is_refused_unless_override():
    reg = Registry("widget")
    reg.add("a", lambda: 1)
    with pytest.raises(ValueError, match="already registered"):
        reg.add("a", lambda: 2)
    reg.add("a", lambda: 3, override=True)
    assert reg.get("a")() == 3


def test_invalid_names_and_entries_are_refused():
    reg = Registry("widget")
    with pytest.raises(ValueError, match="non-empty string"):
        reg.add("", lambda: 1)
    with pytest.raises(TypeError, match="callable"):
        reg.add("x", 42)


def test_unregister_removes_name():
    reg = Registry("widget")
    reg.add("a", lambda: 1)
    reg.unregister("a")
    assert "a" not in reg
    with pytest.raises(UnknownNameError):
        reg.unregister("a")


@pytest.fixture
def scratch_names():
    """Remove whatever a test registers, so the global registries stay as the library made them."""
    added = []
    yield added
    for registry, name in added:
        registry.unregister(name)


def test_custom_advantage_estimator_is_found_by_name(scratch_names):
    @register_advantage_estimator("test_constant_adv")
    def constant(data, *, value=1.0):
        mask = data["response_mask"].float()
        return value * mask, value * mask

    scratch_names.append((ADVANTAGE_ESTIMATORS, "test_constant_adv"))
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv, ret = compute_advantage({"response_mask": mask}, "test_constant_adv", value=2.5)
    assert_close(adv, torch.tensor([[2.5, 2.5, 0.0], [2.5, 0.0, 0.0]]))
    assert_close(ret, adv)


def test_custom_policy_loss_kl_and_aggregation_are_found_by_name(scratch_names):
    @register_aggregation_mode("test-sum")
    def total(loss_mat, mask, *, global_token_count=None, global_seq_count=None, norm_constant=None):
        return (loss_mat * mask).sum()

    @register_kl_estimator("test_abs")
    def abs_kl(log_prob, ref_log_prob):
        return (log_prob - ref_log_prob).abs()

    @register_policy_loss("test_neg_adv")
    def neg_adv(log_prob, old_log_prob, advantages, response_mask, *, loss_agg_mode="token-mean", **_):
        return aggregate_loss(-advantages, response_mask, loss_agg_mode), {}

    scratch_names += [
        (AGGREGATION_MODES, "test-sum"),
        (KL_ESTIMATORS, "test_abs"),
        (POLICY_LOSSES, "test_neg_adv"),
    ]
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss_mat = torch.tensor([[1.0, 2.0, 100.0]])
    assert_close(aggregate_loss(loss_mat, mask, "test-sum"), torch.tensor(3.0))
    assert_close(
        compute_kl(torch.tensor([[-1.0]]), torch.tensor([[-3.0]]), "test_abs"), torch.tensor([[2.0]])
    )
    zeros = torch.zeros(1, 3)
    loss, _ = compute_policy_loss("test_neg_adv", zeros, zeros, loss_mat, mask, loss_agg_mode="test-sum")
    assert_close(loss, torch.tensor(-3.0))


def test_resolve_looks_names_up_and_passes_functions_through():
    reg = Registry("widget")

    def double(x):
        return 2 * x

    reg.add("double", double)
    assert reg.resolve("double") is double
    assert reg.resolve(abs) is abs  # a function need not be registered
    with pytest.raises(UnknownNameError, match="valid choices: double"):
        reg.resolve("triple")


def test_algorithm_helpers_take_functions_in_place_of_names():
    """What a worker process does with the functions resolved on the controller: no registry lookup."""

    def total(loss_mat, mask, *, global_token_count=None, global_seq_count=None, norm_constant=None):
        return (loss_mat * mask).sum()

    def abs_kl(log_prob, ref_log_prob):
        return (log_prob - ref_log_prob).abs()

    def neg_adv(log_prob, old_log_prob, advantages, response_mask, *, loss_agg_mode="token-mean", **_):
        return aggregate_loss(-advantages, response_mask, loss_agg_mode), {}

    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss_mat = torch.tensor([[1.0, 2.0, 100.0]])
    assert_close(aggregate_loss(loss_mat, mask, total), torch.tensor(3.0))
    assert_close(compute_kl(torch.tensor([[-1.0]]), torch.tensor([[-3.0]]), abs_kl), torch.tensor([[2.0]]))
    zeros = torch.zeros(1, 3)
    loss, _ = compute_policy_loss(neg_adv, zeros, zeros, loss_mat, mask, loss_agg_mode=total)
    assert_close(loss, torch.tensor(-3.0))
    # A built-in loss hands a function-valued loss_agg_mode on to aggregate_loss.
    loss, _ = compute_policy_loss("reinforce", zeros, zeros, loss_mat, mask, loss_agg_mode=total)
    assert_close(loss, torch.tensor(-3.0))


def test_compute_advantage_rejects_unknown_parameter_and_lists_accepted():
    data = {
        "scores": torch.tensor([1.0, 0.0]),
        "response_mask": torch.ones(2, 1),
        "group_ids": torch.tensor([0, 0]),
    }
    with pytest.raises(TypeError) as info:
        compute_advantage(data, "grpo", lam=0.95)
    message = str(info.value)
    assert "lam" in message and "norm_by_std" in message and "eps" in message


def test_missing_data_key_is_named():
    with pytest.raises(KeyError, match="group_ids"):
        compute_advantage({"scores": torch.ones(2), "response_mask": torch.ones(2, 1)}, "rloo")
