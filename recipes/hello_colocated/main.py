"""A first dataflow program: a policy-gradient loop over two colocated roles on CPU.

The task is a 16-armed bandit whose best arm pays 1. Each rank of a 2-rank group holds a replica
of a softmax policy (the ``policy`` role) and a scorer (the ``scorer`` role) in the same process.
Every step the controller:

    prompts  = one row per sample
    actions  = policy.sample(prompts)              # data-parallel: each rank samples half
    rewards  = scorer.score(actions)               # data-parallel, colocated in the same processes
    batch    = actions | rewards | advantages      # advantages computed on the controller
    metrics  = policy.update(batch)                # gradients all-reduced over gloo

Run:  python -m recipes.hello_colocated.main [--steps 30]
(or python recipes/hello_colocated/main.py ...)
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import ray
import torch
import torch.distributed as dist

from hybridflow.controller import (
    DataParallel,
    ResourcePool,
    RoleSpec,
    Worker,
    create_colocated_worker_groups,
    register,
)
from hybridflow.protocol import Batch

NUM_ARMS = 16
BEST_ARM = 11


class BanditPolicy(Worker):
    """Softmax policy over arms; replicated on every rank, kept in sync by all-reduced gradients."""

    def __init__(self, lr: float) -> None:
        super().__init__()
        torch.manual_seed(0)  # same initial replica on every rank
        self.logits = torch.zeros(NUM_ARMS, requires_grad=True)
        self.optimizer = torch.optim.SGD([self.logits], lr=lr)
        self.generator = torch.Generator().manual_seed(1000 + self.rank)

    @register(dispatch=DataParallel())
    def sample(self, prompts: Batch) -> Batch:
        probs = torch.softmax(self.logits.detach(), dim=0)
        actions = torch.multinomial(probs, len(prompts), replacement=True, generator=self.generator)
        return prompts | Batch({"action": actions, "pid": torch.full((len(prompts),), os.getpid())})

    @register(dispatch=DataParallel())
    def update(self, batch: Batch) -> dict[str, float]:
        log_probs = torch.log_softmax(self.logits, dim=0)[batch["action"]]
        # Sum over local rows divided by the global row count: the all-reduced gradient is the
        # gradient of the mean over the whole batch, whatever the number of ranks.
        loss = -(batch["advantage"] * log_probs).sum() / batch.meta["global_rows"]
        self.optimizer.zero_grad()
        loss.backward()
        dist.all_reduce(self.logits.grad)
        self.optimizer.step()
        return {"p_best": torch.softmax(self.logits.detach(), 0)[BEST_ARM].item()}


class ArmScorer(Worker):
    """Pays 1 for the best arm and 0 otherwise."""

    @register(dispatch=DataParallel())
    def score(self, actions: Batch) -> Batch:
        reward = (actions["action"] == BEST_ARM).float()
        return Batch({"reward": reward, "scorer_pid": torch.full((len(actions),), os.getpid())})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2.0)
    args = parser.parse_args()

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    temp_dir = tempfile.mkdtemp(prefix="hf-demo-", dir="/tmp")
    ray.init(num_cpus=4, include_dashboard=False, _temp_dir=temp_dir, logging_level="WARNING")
    try:
        pool = ResourcePool([2], cpus_per_slot=1.0, name="demo")
        groups = create_colocated_worker_groups(
            pool, {"policy": RoleSpec(BanditPolicy, (args.lr,)), "scorer": RoleSpec(ArmScorer)}
        )
        policy, scorer = groups["policy"], groups["scorer"]
        prompts = Batch({"sample_id": torch.arange(args.samples)}, meta={"global_rows": args.samples})
        for step in range(1, args.steps + 1):
            actions = policy.sample(prompts)
            rewards = scorer.score(actions)
            batch = actions | rewards.select("reward")
            advantage = batch["reward"] - batch["reward"].mean()
            metrics = policy.update(batch | Batch({"advantage": advantage}))
            if step == 1:
                same = torch.equal(actions["pid"], rewards["scorer_pid"])
                print(f"ranks live in processes {policy.pids}; policy and scorer colocated: {same}")
            if step == 1 or step % 5 == 0:
                print(f"step {step:3d}  mean reward {batch['reward'].mean():.3f}  "
                      f"p(best arm) {metrics[0]['p_best']:.3f} (rank 0) {metrics[1]['p_best']:.3f} (rank 1)")
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
