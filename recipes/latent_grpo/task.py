"""The task's reasoning formats: 2-digit addition with a column-by-column chain before the answer.

A chain has one step per digit column, ones first: the column's result digit and a carry flag (``c``
carry, ``n`` none). ``47+68=`` -> chain ``5c 1c``, answer ``115``: 7+8 = 15 (5, carry), 4+6+1 = 11 (1,
carry). Every response ends its reasoning with the end-of-thinking token ``>``, then gives the answer and
the end-of-sequence token.

- **Explicit** response: the chain's characters, ``5c1c>115</s>`` (reasoning: 4 tokens + ``>``).
- **Latent** response: one latent step per column, the superposition of its two characters with equal
  weights, then ``>115</s>`` (reasoning: 2 latent steps + ``>``).

A response is a list of steps; a step is a distribution over token ids (``{id: weight}``): a token is a
one-hot step. The same list gives the supervised stage its inputs (``sum_v w_v E[v]``) and its targets.
"""

from __future__ import annotations

import re

from transformers import PreTrainedTokenizerBase

__all__ = [
    "END_OF_THINKING",
    "Step",
    "answer_after_thinking",
    "chain_columns",
    "explicit_steps",
    "latent_steps",
    "operands",
]

END_OF_THINKING = ">"
Step = dict[int, float]
_PROMPT = re.compile(r"^(\d+)\+(\d+)=$")


def operands(prompt_text: str) -> tuple[int, int]:
    """``(a, b)`` of a bare addition prompt ``"a+b="``; a ``ValueError`` names any other text."""
    match = _PROMPT.match(prompt_text.strip())
    if match is None:
        raise ValueError(f"not an addition prompt of the form 'a+b=': {prompt_text!r}")
    return int(match.group(1)), int(match.group(2))


def chain_columns(a: int, b: int) -> list[str]:
    """One two-character step per digit column, ones first: result digit and carry flag (``c``/``n``)."""
    columns, carry = [], 0
    for i in range(max(len(str(a)), len(str(b)))):
        total = (a // 10**i) % 10 + (b // 10**i) % 10 + carry
        carry = int(total >= 10)
        columns.append(f"{total % 10}{'c' if carry else 'n'}")
    return columns


def _tokens(tokenizer: PreTrainedTokenizerBase, text: str) -> list[Step]:
    return [{i: 1.0} for i in tokenizer.encode(text, add_special_tokens=False)]


def explicit_steps(tokenizer: PreTrainedTokenizerBase, a: int, b: int) -> list[Step]:
    """The explicit response: chain characters, ``>``, answer, end-of-sequence; all one-hot."""
    text = "".join(chain_columns(a, b)) + END_OF_THINKING + str(a + b)
    return [*_tokens(tokenizer, text), {tokenizer.eos_token_id: 1.0}]


def latent_steps(tokenizer: PreTrainedTokenizerBase, a: int, b: int) -> list[Step]:
    """The latent response: per column the equal-weight superposition of its two characters, then
    ``>``, answer, end-of-sequence."""
    latent = []
    for column in chain_columns(a, b):
        ids = tokenizer.encode(column, add_special_tokens=False)
        latent.append({i: 1.0 / len(ids) for i in ids})
    return [*latent, *_tokens(tokenizer, END_OF_THINKING + str(a + b)), {tokenizer.eos_token_id: 1.0}]


def answer_after_thinking(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 when the text after the last end-of-thinking token is the ground truth, else 0.0 (also when
    the response never ended its reasoning)."""
    if END_OF_THINKING not in solution_str:
        return 0.0
    return float(solution_str.rsplit(END_OF_THINKING, 1)[1].strip() == str(ground_truth).strip())
