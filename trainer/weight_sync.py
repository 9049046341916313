"""The controller's side of a rollout pool of its own: joining the weight group and pushing weights.

With ``resource.placement.rollout`` on a pool apart from the actor, the engines hold their own weights
(`workers.rollout.RolloutWorker`). Before each generation the actor's rank 0 broadcasts the current
weights to every engine over the weight group (`hybridflow.resharding.transport`), under the policy
version it trained to; when the engines already serve that version, only the version travels.
Colocated runs never come here: their engine is fed in-process by the `ReshardingManager`.
"""

from __future__ import annotations

from hybridflow.controller import RayWorkerGroup, wait_together

__all__ = ["connect_weight_group", "push_weights"]


def connect_weight_group(actor: RayWorkerGroup, rollout: RayWorkerGroup) -> None:
    """Make the weight group: the actor's rank 0 (sender, group rank 0) and every rollout rank."""
    world_size = 1 + rollout.world_size
    address, port = actor.weight_group_address(world_size)[0]
    wait_together(
        [actor.join_weight_group(address, port, world_size), rollout.join_weight_group(address, port, world_size)]
    )


def push_weights(actor: RayWorkerGroup, rollout: RayWorkerGroup) -> dict[str, float]:
    """Bring every engine to the actor's current policy version; returns the sender's ``weight_push/*``
    (none when nothing changed) and ``rollout/policy_version``, ``rollout/receive_s`` (the slowest
    engine's).

    A rank of either pool that fails or dies fails the push within seconds, naming role, method and rank
    (`wait_together`), and both pools' processes are stopped.
    """
    sent, received = wait_together([actor.push_weights(), rollout.receive_weights()])
    metrics = dict(sent[0])
    versions = {report["rollout/policy_version"] for report in received}
    if len(versions) != 1:
        raise RuntimeError(f"the rollout engines serve different policy versions after a push: {sorted(versions)}")
    metrics["rollout/policy_version"] = versions.pop()
    receive = [report["rollout/receive_s"] for report in received if "rollout/receive_s" in report]
    if receive:
        metrics["rollout/receive_s"] = max(receive)
    return metrics
