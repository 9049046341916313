"""Rollout engines: generate responses for prompt Batches and take weight pushes from the trainer.

``RolloutEngine`` is the interface; ``build_rollout_engine`` builds the vLLM engine (``"vllm"``, SPMD
inside the caller's process group) or the transformers engine (``"hf"``). ``response_log_probs``
recomputes on the training side the log-probs the engines report. The vLLM engine module is not
imported here, so this package works where vLLM is not installed.
"""

from hybridflow.rollout.base import RolloutEngine
from hybridflow.rollout.concat import PROMPT_COLUMNS, concat_rollouts
from hybridflow.rollout.config import ENGINE_NAMES, EngineDerived, RolloutConfig, ValSamplingConfig
from hybridflow.rollout.factory import build_rollout_engine
from hybridflow.rollout.hf_engine import HFRolloutEngine
from hybridflow.rollout.logprobs import filter_logits, response_log_probs, sampling_log_probs
from hybridflow.rollout.packing import pack_rollouts, prompt_token_lists
from hybridflow.rollout.sampling import SamplingParams

__all__ = [
    "ENGINE_NAMES",
    "PROMPT_COLUMNS",
    "EngineDerived",
    "HFRolloutEngine",
    "RolloutConfig",
    "RolloutEngine",
    "SamplingParams",
    "ValSamplingConfig",
    "build_rollout_engine",
    "concat_rollouts",
    "filter_logits",
    "pack_rollouts",
    "prompt_token_lists",
    "response_log_probs",
    "sampling_log_probs",
]
