"""A small task and config for end-to-end trainer runs on CPU."""

from __future__ import annotations

from pathlib import Path

from hybridflow.data import write_rows
from trainer.config import RunConfig, load_config

TARGET = "7"
REWARD_FILE = '''
def fraction_of_target(data_source, solution_str, ground_truth, extra_info=None):
    """Share of the response's characters that are the target character."""
    return solution_str.count(ground_truth) / max(1, len(solution_str))


def one_plus_fraction(data_source, solution_str, ground_truth, extra_info=None):
    """The same, offset by 1: returns far from a fresh value head's zero output."""
    return 1.0 + fraction_of_target(data_source, solution_str, ground_truth, extra_info)
'''


def fraction_of_target(solution_str: str) -> float:
    """What ``REWARD_FILE``'s function of that name returns for a response, computed here."""
    return solution_str.count(TARGET) / max(1, len(solution_str))


def write_task(root: Path, prompts: int = 64) -> Path:
    """A task a random tiny policy can learn in a few steps: write the target character."""
    rows = [
        {
            "data_source": "toy/target_char",
            "prompt": [{"role": "user", "content": f"{i % 10}{chr(97 + i % 7)}="}],
            "ability": "toy",
            "reward_model": {"style": "rule", "ground_truth": TARGET},
            "extra_info": {"index": i},
        }
        for i in range(prompts)
    ]
    write_rows(rows, root / "train.parquet")
    write_rows(rows[:16], root / "val.parquet")
    (root / "reward.py").write_text(REWARD_FILE)
    return root


def run_config(
    root: Path, engine: str, steps: int, extra: list[str] = (), reward_fn: str = "fraction_of_target"
) -> RunConfig:
    cache = Path(__file__).resolve().parents[2] / ".cache"
    return load_config(
        None,
        [
            f"data.train_files=[{root / 'train.parquet'}]",
            f"data.val_files=[{root / 'val.parquet'}]",
            "data.max_prompt_length=8",
            "data.max_response_length=8",
            "data.train_batch_size=16",
            "data.val_batch_size=16",
            "data.seed=0",
            "model.tiny.hidden_size=64",
            "model.tiny.num_layers=2",
            "model.tiny.num_heads=2",
            "model.tiny.num_kv_heads=2",
            "model.tiny.intermediate_size=128",
            "model.tiny.max_position_embeddings=64",
            f"rollout.engine={engine}",
            "rollout.n=8",
            "rollout.kv_cache_bytes=33554432",
            f"rollout.cache_dir={cache}",
            "actor.lr=0.01",
            "actor.weight_decay=0.0",
            "actor.ppo_mini_batch_size=128",
            "actor.ppo_micro_batch_size=32",
            "actor.forward_micro_batch_size=64",
            "actor.shuffle=false",
            f"reward.default_fn={root / 'reward.py'}:{reward_fn}",
            "reward.num_workers=1",
            f"trainer.total_steps={steps}",
            "trainer.val_before_train=false",
            "trainer.loggers=[jsonl]",
            f"trainer.output_dir={root / 'run'}",
            "resource.cpus_per_slot=0.5",
            *extra,
        ],
    )
