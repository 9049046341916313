"""Worker roles: each a `Worker` subclass whose public methods are ``@register``'ed (docs/workers.md).

- `workers.actor.ActorRolloutRefWorker`: policy training (FSDP2), generation (vLLM/HF), reference policy.
- `workers.critic.CriticWorker`: a value head on a causal-LM backbone, clipped value loss.
- `workers.reward_model.RewardModelWorker`: scores from a sequence-classification model.
"""
