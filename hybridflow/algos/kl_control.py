"""Controllers for the KL-penalty coefficient ``beta``.

Both expose ``value`` (the current ``beta``) and ``update(current_kl, n_steps)``, called once per
training step with the batch's mean KL (nats per sequence or per token: whichever unit
``target_kl`` is given in).
"""

from __future__ import annotations

__all__ = ["AdaptiveKLController", "FixedKLController", "build_kl_controller"]


class FixedKLController:
    """Constant coefficient: ``update`` leaves ``value`` unchanged.

    Args:
        coef: the KL coefficient ``beta`` (>= 0).
    """

    def __init__(self, coef: float) -> None:
        if coef < 0:
            raise ValueError(f"coef must be >= 0, got {coef}")
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> float:
        """Return the (unchanged) coefficient."""
        return self.value


class AdaptiveKLController:
    """Proportional controller steering the observed KL towards a target.

    From Ziegler et al., "Fine-Tuning Language Models from Human Preferences" (arXiv:1909.08593,
    section 2.2)::

        e       = clip(current_kl / target_kl - 1, -0.2, 0.2)
        beta   <- beta * (1 + e * n_steps / horizon)

    The clip bounds the change per update so one noisy KL reading cannot swing ``beta``; ``horizon``
    is the number of samples over which the error is corrected, ``n_steps`` the samples since the
    last update (usually the batch size).

    Args:
        init_coef: initial ``beta`` (> 0; a zero coefficient could never grow multiplicatively).
        target_kl: desired KL (> 0), in the unit of the ``current_kl`` you will pass.
        horizon: correction horizon in samples (> 0).
    """

    def __init__(self, init_coef: float, target_kl: float, horizon: float) -> None:
        if init_coef <= 0:
            raise ValueError(f"init_coef must be > 0, got {init_coef}")
        if target_kl <= 0:
            raise ValueError(f"target_kl must be > 0, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value = float(init_coef)
        self.target_kl = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        """Update and return ``beta`` from the observed mean KL ``current_kl``."""
        error = min(max(float(current_kl) / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value


def build_kl_controller(
    kind: str, coef: float, target_kl: float | None = None, horizon: float | None = None
) -> FixedKLController | AdaptiveKLController:
    """Build a controller from config values: ``kind`` is ``"fixed"`` or ``"adaptive"``."""
    if kind == "fixed":
        return FixedKLController(coef)
    if kind == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError("adaptive KL controller needs target_kl and horizon")
        return AdaptiveKLController(coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller kind {kind!r}; valid choices: adaptive, fixed")
