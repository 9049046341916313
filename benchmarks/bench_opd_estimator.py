"""Why OPD's reverse KL stays flat on the distillation-gap student: the per-token estimator against the
exact per-position reverse KL, by learning rate, in one process.

The student and teacher are recipes/opd/gap.py's (``python -m recipes.opd.gap teacher`` and ``student``
first). Each step samples ``--prompts`` training prompts x 4 responses from the student at temperature 1
(HF ``generate``, at most 6 tokens), scores them with both models and takes one AdamW step (betas 0.9,
0.999, no weight decay, ``--grad-clip``) on a loss whose gradient is OPD's update at ratio 1 (one
on-policy step per batch, where PPO-clip's gradient is the plain policy gradient):

    raw        -mean_t A_t log pi_S(y_t),  A_t = log pi_T(y_t) - log pi_S(y_t)          (recipes/opd, baseline none)
    position   the same with A_t less the other rows' mean A at position t      (recipes/opd, baseline position)
    exact      mean_t KL(pi_S(. | x, y_<t) || pi_T(. | x, y_<t)), summed over the vocabulary at each
               sampled prefix: the same objective without the sampled token's noise

Reported per run: the exact per-token reverse KL at the step's sampled prefixes (nats; the mean of the
first 5 and of the last 5 steps), the gradient norm before clipping, and held-out greedy accuracy (the
500 held-out problems) before and after. ``--cosine`` adds, per step, the cosine between the raw and
the exact gradient of the same batch.

Run (from the repository root):
    python -m benchmarks.bench_opd_estimator [--estimators raw position exact] [--lrs 1e-4 3e-5]
        [--seeds 0 1 2] [--steps 60] [--prompts 16] [--grad-clip 1.0] [--cosine] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from hybridflow.data import read_rows
from hybridflow.data.chat import render_prompt
from hybridflow.models import load_causal_lm, load_tokenizer_dir
from recipes.opd.gap import TEACHER, student_config, student_start
from recipes.opd.main import position_baseline
from trainer.warm_start import greedy_accuracy

ESTIMATORS = ("raw", "position", "exact")
SAMPLES = 4  # rollout.n of recipes/opd
MAX_NEW = 6  # data.max_response_length of recipes/opd


def sample(
    model: nn.Module, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[list[int]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ``input_ids``/``attention_mask [rows, prompt_len]`` and right-padded ``responses``/
    ``response_mask [rows, MAX_NEW]`` (tokens up to and including the first end-of-sequence) of one
    temperature-1 sample per prompt."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    model.eval()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            max_new_tokens=MAX_NEW, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        )
    model.train()
    responses = nn.functional.pad(out[:, width:], (0, MAX_NEW - (out.shape[1] - width)), value=tokenizer.pad_token_id)
    ended = responses == tokenizer.eos_token_id
    response_mask = ((ended.cumsum(1) - ended.long()) == 0).long()  # through the first eos
    responses = torch.where(response_mask.bool(), responses, tokenizer.pad_token_id)
    return ids, mask, responses, response_mask


def response_log_softmax(
    model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, responses: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """``[rows, MAX_NEW, vocab]``: the model's next-token log-probabilities at each response position
    (positions counted over valid tokens, so left padding does not shift them)."""
    full_mask = torch.cat([mask, response_mask], dim=1)
    positions = (full_mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=torch.cat([ids, responses], 1), attention_mask=full_mask, position_ids=positions).logits
    width = ids.shape[1]
    return torch.log_softmax(logits[:, width - 1 : width - 1 + responses.shape[1]].float(), dim=-1)


def run(estimator: str, lr: float, seed: int, args: argparse.Namespace) -> dict:
    """One training run from the student's start; its per-step trace and summary."""
    start_dir, _ = student_start()
    tokenizer = load_tokenizer_dir(start_dir)
    student = load_causal_lm(start_dir)
    teacher = load_causal_lm(TEACHER / "final" / "hf").eval().requires_grad_(False)
    config = student_config()
    train = read_rows(config.data.train_files[0])
    held_out = read_rows(config.data.val_files[0])
    encoded = [tokenizer.encode(render_prompt(tokenizer, row["prompt"]), add_special_tokens=False) for row in train]
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(student.parameters(), lr=lr, weight_decay=0.0)
    before = greedy_accuracy(student, tokenizer, held_out)
    trace = []
    started = time.monotonic()
    for step in range(1, args.steps + 1):
        picked = torch.randint(len(train), (args.prompts,), generator=generator).tolist()
        ids, mask, responses, response_mask = sample(student, tokenizer, [encoded[i] for i in picked for _ in range(SAMPLES)])
        valid = response_mask.float()
        tokens = valid.sum()
        with torch.no_grad():
            teacher_all = response_log_softmax(teacher, ids, mask, responses, response_mask)
        student_all = response_log_softmax(student, ids, mask, responses, response_mask)
        student_lp = student_all.gather(-1, responses[..., None])[..., 0]
        teacher_lp = teacher_all.gather(-1, responses[..., None])[..., 0]
        advantage = (teacher_lp - student_lp.detach()) * valid
        exact = (student_all.exp() * (student_all - teacher_all)).sum(-1)  # [rows, MAX_NEW] nats
        exact_loss = (exact * valid).sum() / tokens
        raw_loss = -(advantage * student_lp * valid).sum() / tokens
        record = {"step": step, "exact_reverse_kl": exact_loss.item(), "sampled_reverse_kl": -(advantage.sum() / tokens).item()}
        if args.cosine:
            params = list(student.parameters())
            flat = [torch.cat([g.flatten() for g in torch.autograd.grad(loss, params, retain_graph=True)])
                    for loss in (raw_loss, exact_loss)]
            record["cosine_raw_exact"] = nn.functional.cosine_similarity(flat[0], flat[1], dim=0).item()
        if estimator == "raw":
            loss = raw_loss
        elif estimator == "position":
            centred = (advantage - position_baseline(advantage, response_mask)) * valid
            loss = -(centred * student_lp * valid).sum() / tokens
        else:
            loss = exact_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        record["grad_norm"] = float(nn.utils.clip_grad_norm_(student.parameters(), args.grad_clip))
        optimizer.step()
        trace.append(record)
    seconds = time.monotonic() - started
    after = greedy_accuracy(student, tokenizer, held_out)
    first = statistics.fmean(r["exact_reverse_kl"] for r in trace[:5])
    last = statistics.fmean(r["exact_reverse_kl"] for r in trace[-5:])
    return {"estimator": estimator, "lr": lr, "seed": seed, "before": before, "after": after,
            "reverse_kl_first5": first, "reverse_kl_last5": last, "seconds": seconds,
            "grad_norm_median": statistics.median(r["grad_norm"] for r in trace), "trace": trace}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks/bench_opd_estimator.py", description=__doc__.split("\n")[0])
    parser.add_argument("--estimators", nargs="+", choices=ESTIMATORS, default=list(ESTIMATORS))
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 3e-5])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--prompts", type=int, default=16, help="prompts a step (x 4 samples)")
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument("--cosine", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    results = []
    print("| estimator | lr | seed | reverse KL first 5 -> last 5 (nats) | grad norm (median) | before | after | s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for lr in args.lrs:
        for estimator in args.estimators:
            for seed in args.seeds:
                r = run(estimator, lr, seed, args)
                results.append(r)
                print(f"| {estimator} | {lr:g} | {seed} | {r['reverse_kl_first5']:.2f} -> {r['reverse_kl_last5']:.2f} "
                      f"| {r['grad_norm_median']:.1f} | {r['before']:.1%} | {r['after']:.1%} | {r['seconds']:.0f} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
