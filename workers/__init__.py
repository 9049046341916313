"""Worker roles: each a `Worker` subclass whose public methods are ``@register``'ed.

- `workers.actor.ActorRolloutRefWorker`: policy training (FSDP2), generation (vLLM/HF), reference policy.
"""
