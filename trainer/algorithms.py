"""`rl_step`: PPO and GRPO (and every estimator of the config) as one step function.

In the order the data flows (the controller only moves Batches; weights stay on the workers)::

    rollouts  = generate(prompts)            # [B*n] rows, inference layout
    rollouts |= score(rollouts)              # reward functions (+ weight * reward model)
                                             # (with an agent section: agent_generate(prompts),
                                             # episodes scored by their environment)
    rollouts |= old_log_probs(rollouts)      # training layout; skipped when the update is one
                                             # on-policy optimizer step (it takes its own)
    rollouts |= ref_log_probs(rollouts)      # if a KL term is used
    rollouts |= values(rollouts)             # PPO only
    rollouts |= advantages(rollouts)         # KL in the reward, then the estimator; on the controller
    update_critic(rollouts)                  # PPO only
    update_actor(rollouts)
"""

from __future__ import annotations

from hybridflow.protocol import Batch
from trainer.agent_rollout import agent_generate
from trainer.runtime import Runtime
from trainer.steps import (
    advantages,
    generate,
    old_log_probs,
    ref_log_probs,
    score,
    update_actor,
    update_critic,
    values,
)

__all__ = ["needs_old_log_probs", "rl_step"]


def needs_old_log_probs(runtime: Runtime) -> bool:
    """Whether the step must compute old log-probs before the update.

    With one optimizer step per batch the update's own forward gives them (see
    `ActorRolloutRefWorker.update_actor`); several optimizer steps, or a KL penalty in the reward, need
    them first.
    """
    return runtime.sizes.actor.optimizer_steps_per_step > 1 or runtime.config.algorithm.use_kl_in_reward


def rl_step(runtime: Runtime, prompts: Batch) -> Batch:
    """One PPO/GRPO step as the config describes it; returns the step's rollouts."""
    config = runtime.config
    if config.agent is None:
        rollouts = generate(runtime, prompts)
        rollouts |= score(runtime, rollouts)
    else:
        rollouts = agent_generate(runtime, prompts)  # scored by the episodes' environment
    if needs_old_log_probs(runtime):
        rollouts |= old_log_probs(runtime, rollouts)
    if config.needs_reference:
        rollouts |= ref_log_probs(runtime, rollouts)
    if runtime.critic is not None:
        rollouts |= values(runtime, rollouts)
    rollouts |= advantages(runtime, rollouts)
    if runtime.critic is not None:
        update_critic(runtime, rollouts)
    update_actor(runtime, rollouts)
    return rollouts
