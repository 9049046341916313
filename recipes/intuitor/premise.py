"""INTUITOR's premise measured on a model before any training: within the group of samples of one prompt,
does a more self-certain response tend to be right (and is it longer or shorter)?

GRPO on self-certainty only ever compares samples of the same prompt, so the quantity that decides whether
it can teach the task is the *within-group* rank correlation of self-certainty with correctness, over the
groups whose samples disagree. This module has the pure pieces (ranks with ties averaged, Spearman's rho per
group, a summary with a bootstrap interval over groups) and a script that samples G responses per prompt
from the base model and measures it.

Run (from the repository root):
    python -m recipes.intuitor.premise --prompts 64 --n 7 --temperature 0.9

The script uses the library's pieces: `PromptDataset` / `PromptCollator` (the model's chat template),
`HFRolloutEngine` (sampling), the ``self_certainty`` token statistic on the model's final hidden states
(`hybridflow.parallel.token_statistics`, at the sampling temperature, as the trainer's ``old_log_probs``
computes it) and the ``exact_match`` reward function.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor
from transformers import PreTrainedModel

from hybridflow.data.collate import PromptCollator
from hybridflow.data.dataset import PromptDataset
from hybridflow.models import load_causal_lm, load_tokenizer_dir, read_special_token_ids
from hybridflow.parallel import token_statistics
from hybridflow.protocol import Batch
from hybridflow.rewards import get_reward_function
from hybridflow.rollout.hf_engine import HFRolloutEngine
from hybridflow.rollout.packing import FINISH_LENGTH
from hybridflow.rollout.sampling import SamplingParams
from trainer.steps import decode_responses

SMOLLM2 = Path(".cache/recipes/smollm2")  # recipes/smollm2/main.py writes the model and the sums here


def average_ranks(values: Tensor) -> Tensor:
    """``[n]`` float64 ranks 1..n of ``values [n]``; tied values share the mean of the ranks they span."""
    order = torch.argsort(values, stable=True)
    ordered = values[order]
    ranks = torch.empty(len(values), dtype=torch.float64)
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and ordered[end + 1] == ordered[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2 + 1  # mean of ranks start+1 .. end+1
        start = end + 1
    return ranks


def spearman(x: Tensor, y: Tensor) -> float | None:
    """Spearman's rho of ``x [n]`` and ``y [n]`` (Pearson's r of their average ranks), in [-1, 1];
    None when either is constant (rho is undefined there)."""
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length: {len(x)} and {len(y)}")
    if len(x) < 2 or bool((x == x[0]).all()) or bool((y == y[0]).all()):
        return None
    rx = average_ranks(x)
    ry = average_ranks(y)
    rx = rx - rx.mean()
    ry = ry - ry.mean()
    return float((rx * ry).sum() / (rx.norm() * ry.norm()))


def within_group_spearman(x: Tensor, y: Tensor, group_ids: Tensor) -> Tensor:
    """``[kept groups]`` float64: Spearman's rho of ``x [rows]`` with ``y [rows]`` inside each group of
    ``group_ids [rows]``, in increasing group id, over the groups where both ``x`` and ``y`` vary."""
    rhos = []
    for group in torch.unique(group_ids):
        rows = group_ids == group
        rho = spearman(x[rows], y[rows])
        if rho is not None:
            rhos.append(rho)
    return torch.tensor(rhos, dtype=torch.float64)


@dataclass(frozen=True)
class CorrelationSummary:
    """Per-group correlations summarised over groups (each group one observation).

    ``std`` is the spread across groups (Bessel), ``standard_error`` = std / sqrt(groups);
    ``ci_low``/``ci_high`` bound the middle 95% of the mean over ``resamples`` bootstrap draws of the
    groups; ``positive``/``negative`` count groups with rho above / below 0. NaN where undefined.
    """

    groups: int
    mean: float
    std: float
    standard_error: float
    ci_low: float
    ci_high: float
    positive: int
    negative: int


def summarise(rhos: Tensor, resamples: int = 10_000, seed: int = 0) -> CorrelationSummary:
    """The `CorrelationSummary` of per-group correlations ``rhos [groups]``."""
    groups = len(rhos)
    if groups == 0:
        nan = float("nan")
        return CorrelationSummary(0, nan, nan, nan, nan, nan, 0, 0)
    std = float(rhos.std()) if groups > 1 else float("nan")
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(groups, (resamples, groups), generator=generator)
    means = rhos[draws].mean(dim=1)
    return CorrelationSummary(
        groups=groups,
        mean=float(rhos.mean()),
        std=std,
        standard_error=std / math.sqrt(groups),
        ci_low=float(torch.quantile(means, 0.025)),
        ci_high=float(torch.quantile(means, 0.975)),
        positive=int((rhos > 0).sum()),
        negative=int((rhos < 0).sum()),
    )


@torch.no_grad()
def response_self_certainty(
    model: PreTrainedModel, rollouts: Batch, temperature: float, chunk_size: int = 1024
) -> Tensor:
    """``[rows]`` float32: each response's mean per-token self-certainty (nats) at ``temperature``.

    ``rollouts`` holds ``input_ids``/``attention_mask [rows, prompt_len]`` (left-padded) and
    ``responses``/``response_mask [rows, response_len]``, as a rollout engine returns them. The statistic
    is the registered ``self_certainty`` on ``model``'s final hidden states through its output head, the
    logits divided by ``temperature`` (the trainer's ``old_log_probs`` divides by the sampling
    temperature too), ``chunk_size`` tokens of ``[tokens, vocab]`` logits at a time.
    """
    prompt_len = rollouts["input_ids"].shape[1]
    mask = rollouts["response_mask"].bool()
    input_ids = torch.cat([rollouts["input_ids"], rollouts["responses"]], dim=1)
    attention_mask = torch.cat([rollouts["attention_mask"], rollouts["response_mask"]], dim=1).long()
    # Positions count real tokens only, as the engines and the training layout do under left padding.
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    hidden = model.base_model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
    ).last_hidden_state
    # The hidden state at position t predicts token t + 1: responses are read one step to the left.
    response_hidden = hidden[:, prompt_len - 1 : prompt_len - 1 + mask.shape[1]][mask]
    values = token_statistics(
        response_hidden,
        model.get_output_embeddings(),
        rollouts["responses"][mask],
        ("self_certainty",),
        temperature=temperature,
        chunk_size=chunk_size,
    )[:, 0]
    per_token = torch.zeros(mask.shape, dtype=torch.float32)
    per_token[mask] = values
    return per_token.sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def sample_and_score(
    model_dir: Path,
    data_file: Path,
    prompts: int,
    n: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    batch_prompts: int,
) -> dict[str, Tensor]:
    """Sample ``n`` responses at ``temperature`` for ``prompts`` prompts of ``data_file`` (a seeded random
    subset) and score each. Returns per-sample ``[prompts * n]`` columns, prompt-major: ``group``,
    ``correct`` (exact_match, 0/1), ``length`` (tokens, end token included), ``truncated`` (0/1),
    ``self_certainty`` (nats, at ``temperature``) and ``self_certainty_t1`` (nats, at temperature 1)."""
    tokenizer = load_tokenizer_dir(model_dir)
    model = load_causal_lm(model_dir)
    eos_ids, pad_id = read_special_token_ids(model_dir)
    dataset = PromptDataset([str(data_file)], tokenizer, max_prompt_length=1024)
    chosen = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:prompts].tolist()
    engine = HFRolloutEngine(model, eos_ids, pad_id, seed=seed)
    sampling = SamplingParams(n=n, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    reward = get_reward_function("exact_match")
    collate = PromptCollator(pad_id)
    columns: dict[str, list[Tensor]] = {key: [] for key in _SAMPLE_COLUMNS}
    for start in range(0, len(chosen), batch_prompts):
        began = time.perf_counter()
        batch = collate([dataset[i] for i in chosen[start : start + batch_prompts]])
        rollouts = engine.generate(batch, sampling)
        texts = decode_responses(rollouts, tokenizer).non_tensors["response_text"]
        labelled = zip(
            texts, rollouts.non_tensors["ground_truth"], rollouts.non_tensors["data_source"], strict=True
        )
        columns["group"].append(torch.arange(len(rollouts)) // n + start)
        columns["correct"].append(
            torch.tensor(
                [float(reward(data_source=d, solution_str=t, ground_truth=g)) for t, g, d in labelled]
            )
        )
        columns["length"].append(rollouts["response_mask"].sum(dim=1).float())
        columns["truncated"].append(
            torch.tensor([float(r == FINISH_LENGTH) for r in rollouts.non_tensors["finish_reason"]])
        )
        columns["self_certainty"].append(response_self_certainty(model, rollouts, temperature))
        columns["self_certainty_t1"].append(response_self_certainty(model, rollouts, 1.0))
        print(
            f"prompts {start}..{start + len(batch) - 1}: {time.perf_counter() - began:.1f} s", file=sys.stderr
        )
    return {key: torch.cat(parts) for key, parts in columns.items()}


_SAMPLE_COLUMNS = ("group", "correct", "length", "truncated", "self_certainty", "self_certainty_t1")


def premise_report(samples: dict[str, Tensor], n: int) -> dict[str, object]:
    """The premise's numbers from `sample_and_score`'s columns (groups of ``n`` consecutive rows)."""
    group, correct, length = samples["group"], samples["correct"], samples["length"]
    certainty = samples["self_certainty"]
    per_group_correct = correct.view(-1, n).sum(dim=1)
    mixed = (per_group_correct > 0) & (per_group_correct < n)
    # Best-of-n by self-certainty (Kang et al.'s use of it): the most certain sample of each group.
    chosen = certainty.view(-1, n).argmax(dim=1)
    best_of_n = correct.view(-1, n).gather(1, chosen[:, None]).float().mean()
    right, wrong = correct == 1, correct == 0
    return {
        "prompts": len(per_group_correct),
        "samples": len(correct),
        "sample_accuracy": float(correct.mean()),
        "mixed_correctness_share": float(mixed.float().mean()),
        "all_right_share": float((per_group_correct == n).float().mean()),
        "all_wrong_share": float((per_group_correct == 0).float().mean()),
        "truncation_rate": float(samples["truncated"].mean()),
        "mean_length": float(length.mean()),
        "self_certainty_vs_correct": asdict(summarise(within_group_spearman(certainty, correct, group))),
        "self_certainty_vs_length": asdict(summarise(within_group_spearman(certainty, length, group))),
        "length_vs_correct": asdict(summarise(within_group_spearman(length, correct, group))),
        "self_certainty_t1_vs_correct": asdict(
            summarise(within_group_spearman(samples["self_certainty_t1"], correct, group))
        ),
        "pooled": {
            "self_certainty_right": float(certainty[right].mean()),
            "self_certainty_wrong": float(certainty[wrong].mean()),
            "length_right": float(length[right].mean()),
            "length_wrong": float(length[wrong].mean()),
            "spearman_self_certainty_correct": spearman(certainty, correct),
            "spearman_self_certainty_length": spearman(certainty, length),
        },
        "best_of_n_by_self_certainty_accuracy": float(best_of_n),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(
        prog="python -m recipes.intuitor.premise", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", type=Path, default=SMOLLM2 / "model", help="HF model directory")
    parser.add_argument("--data", type=Path, default=SMOLLM2 / "data" / "train.parquet", help="prompt file")
    parser.add_argument("--prompts", type=int, default=64, help="prompts (a seeded random subset of --data)")
    parser.add_argument("--n", type=int, default=7, help="samples per prompt (the group)")
    parser.add_argument("--temperature", type=float, default=0.9)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0, help="prompt subset and sampling seed")
    parser.add_argument("--batch-prompts", type=int, default=8, help="prompts sampled and scored at once")
    parser.add_argument(
        "--out", type=Path, help="also write the report and every sample's columns here (JSON)"
    )
    args = parser.parse_args(argv)
    began = time.perf_counter()
    samples = sample_and_score(
        args.model,
        args.data,
        args.prompts,
        args.n,
        args.temperature,
        args.max_new_tokens,
        args.seed,
        args.batch_prompts,
    )
    report = {"args": {k: str(v) for k, v in vars(args).items()}, **premise_report(samples, args.n)}
    report["seconds"] = time.perf_counter() - began
    print(json.dumps(report, indent=1))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        rows = {key: value.tolist() for key, value in samples.items()}
        args.out.write_text(json.dumps({"report": report, "samples": rows}))
    return report


if __name__ == "__main__":
    main()
