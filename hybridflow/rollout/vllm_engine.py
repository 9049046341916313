"""`VLLMRolloutEngine`: vLLM in SPMD mode inside the caller's torch.distributed process group.

Every rank of the world constructs one engine at the same time. Consecutive groups of
``rollout.tp_size`` ranks form one tensor-parallel engine (``distributed_executor_backend=
"external_launcher"``: each rank runs its own scheduler and model shard in-process, and vLLM reuses
the existing default process group). All ranks of a TP group must call ``generate``,
``update_weights``, ``release`` and ``resume`` together with identical arguments; the ``world / tp``
groups are data-parallel and generate independently, each with its own seed stream.

Keep the engine for the whole process: shutting vLLM down destroys the default process group.

With ``RolloutConfig.enable_prompt_embeds`` the engine also decodes from input embeddings, one position
at a time (`VLLMRolloutEngine.embedding_session`): each position is one request whose prompt is the row's
input vectors so far, answered with the full next-token distribution; vLLM's prefix cache (keyed by the
vectors' bytes) spares recomputing the earlier positions.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import get_args

import torch
import torch.distributed as dist
from vllm import LLM
from vllm import SamplingParams as VLLMSamplingParams
from vllm.config.lora import MaxLoRARanks
from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform

from hybridflow.lora import LoraConfig, save_peft_adapter
from hybridflow.protocol import Batch
from hybridflow.rollout.base import RolloutEngine
from hybridflow.rollout.config import EngineDerived, RolloutConfig
from hybridflow.rollout.packing import FINISH_LENGTH, FINISH_STOP, pack_rollouts, prompt_token_lists
from hybridflow.rollout.sampling import SamplingParams
from hybridflow.rollout.seeding import SeedStream, data_parallel_rank

__all__ = ["VLLMEmbeddingSession", "VLLMRolloutEngine"]

_CPU_WORKER = "hybridflow.rollout.vllm_cpu_worker.JobScopedShmCPUWorker"


def _is_rotary_reload_warning(record: logging.LogRecord) -> bool:
    # The rotary cache is computed from the config and never part of a checkpoint, so every weight
    # push "fails" to load it and keeps the (correct) cached tensor.
    return bool(record.args) and record.args[0] == "RotaryEmbedding"


def _is_tokenizer_warmup_warning(record: logging.LogRecord) -> bool:
    # The engine runs with skip_tokenizer_init (prompts arrive as token ids), so vLLM's chat-template
    # warm-up has no tokenizer and logs a traceback at start.
    error = record.exc_info[1] if record.exc_info else None
    return record.msg == "Chat template warmup failed" and "skip_tokenizer_init" in str(error)


class ExpectedWarningFilter(logging.Filter):
    """Drops the vLLM warnings that our way of running the engine always triggers; any other record
    of the same loggers passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_is_rotary_reload_warning(record) or _is_tokenizer_warmup_warning(record))


# The vLLM loggers whose expected warnings `ExpectedWarningFilter` drops.
FILTERED_LOGGERS = ("vllm.model_executor.model_loader.reload.layerwise", "vllm.renderers.base")


def _prepare_environment(config: RolloutConfig) -> None:
    """Set the variables vLLM reads at start: compile caches and the launcher's rank variables."""
    if config.cache_dir is not None:
        cache_dir = Path(config.cache_dir)
        os.environ["VLLM_CACHE_ROOT"] = str(cache_dir / "vllm")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
    # external_launcher takes the rank from torchrun's variables; Ray or spawn may not set them.
    os.environ.setdefault("RANK", str(dist.get_rank()))
    os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
    for name in FILTERED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ExpectedWarningFilter) for f in logger.filters):
            logger.addFilter(ExpectedWarningFilter())


def _kv_cache_storages(worker: object) -> list[torch.UntypedStorage]:
    """The distinct storages behind the worker's KV cache tensors (layers may share one)."""
    storages: dict[int, torch.UntypedStorage] = {}
    for tensor in worker.model_runner.kv_caches:  # type: ignore[attr-defined]
        storage = tensor.untyped_storage()
        storages.setdefault(storage.data_ptr(), storage)
    return list(storages.values())


class VLLMRolloutEngine(RolloutEngine):
    """A vLLM engine sharing this process's torch.distributed world.

    Reported log-probs use ``logprobs_mode="processed_logprobs"``: the log-softmax of the logits after
    temperature, top-k and top-p, i.e. of the distribution each token was sampled from (for greedy
    decoding, of the raw logits). ``hybridflow.rollout.logprobs.response_log_probs`` recomputes the
    same quantity from a training model.

    Args:
        model_path: an HF model directory (see ``hybridflow.models.save_model_dir``). Its tokenizer is
            not loaded: prompts arrive as token ids and responses leave as token ids.
        config: engine settings; ``config.engine`` is not checked here.
        derived: the engine's dtype and ``max_model_len``.
        eos_token_ids: tokens that end a sample. Passed to vLLM explicitly because without a
            tokenizer vLLM knows no end-of-sequence token.
        pad_token_id: fills responses past their end.
        lora: serve these LoRA adapters on the base weights of ``model_path`` (vLLM's ``enable_lora``,
            which the CPU build supports): `update_weights` then takes the adapter tensors alone, writes
            them as a PEFT adapter directory of this rank's own and serves every later request with
            them under a new adapter id, so no request can see the previous adapter's cached copy.
    """

    def __init__(
        self,
        model_path: str | Path,
        config: RolloutConfig,
        derived: EngineDerived,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        lora: LoraConfig | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "VLLMRolloutEngine runs inside an initialised torch.distributed process group "
                "(gloo on CPU); call dist.init_process_group first, also for a single process"
            )
        if not eos_token_ids:
            raise ValueError("eos_token_ids must name at least one token")
        self.config = config
        self.derived = derived
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        seed = config.seed + data_parallel_rank(config.tp_size)
        self._seeds = SeedStream(seed)
        self._on_cpu = current_platform.is_cpu()
        self._model_path = str(model_path)
        self._lora = lora
        self.takes_adapters = lora is not None
        self._lora_request: LoRARequest | None = None
        self._adapter_root = Path(tempfile.mkdtemp(prefix=f"hybridflow-lora-{dist.get_rank()}-")) if lora else None
        if self._adapter_root is not None:
            # The adapter files go with the engine (or with the process, whichever ends first).
            weakref.finalize(self, shutil.rmtree, self._adapter_root, ignore_errors=True)
        _prepare_environment(config)
        platform_args = (
            {
                "worker_cls": _CPU_WORKER,
                # Chunked prefill rewinds a seeded request's generator when it splits the prompt, which
                # CPU generators cannot do ("CPU Generator does not use offset"); every request is seeded.
                "enable_chunked_prefill": False,
            }
            # CPU vLLM refuses sleep mode; release/resume free the KV cache storages directly instead.
            if self._on_cpu
            else {"enable_sleep_mode": True}
        )
        self._llm = LLM(
            model=str(model_path),
            tensor_parallel_size=config.tp_size,
            distributed_executor_backend="external_launcher",
            dtype=derived.dtype,
            seed=seed,
            max_model_len=derived.max_model_len,
            kv_cache_memory_bytes=config.kv_cache_bytes,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            enforce_eager=config.enforce_eager,
            enable_prefix_caching=config.enable_prefix_caching,
            skip_tokenizer_init=True,
            logprobs_mode="processed_logprobs",
            enable_prompt_embeds=config.enable_prompt_embeds,
            # An embedding session asks for the whole vocabulary's log-probs (-1: no limit).
            max_logprobs=-1 if config.enable_prompt_embeds else 20,
            **platform_args,
            **_lora_args(lora),
        )
        # CPU only: (storage, allocated bytes) of the KV cache, freed and restored by release/resume.
        self._kv_storages: list[tuple[torch.UntypedStorage, int]] = (
            [(storage, storage.nbytes()) for storage in self._llm.collective_rpc(_kv_cache_storages)[0]]
            if self._on_cpu
            else []
        )
        self._released = False

    @property
    def llm(self) -> LLM:
        """The underlying ``vllm.LLM`` (for inspection; calls on it bypass the TP-group contract)."""
        return self._llm

    def _request_params(self, sampling: SamplingParams, num_prompts: int) -> list[VLLMSamplingParams]:
        seed = self._seeds.next(sampling.seed)
        stop_ids = list(dict.fromkeys(self.eos_token_ids + sampling.stop_token_ids))
        # vLLM seeds sample j of a request with seed + j, so requests step by n to keep seeds distinct.
        return [
            VLLMSamplingParams(
                n=sampling.n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=0 if sampling.top_k == -1 else sampling.top_k,
                max_tokens=sampling.max_new_tokens,
                stop_token_ids=stop_ids,
                seed=seed + i * sampling.n,
                logprobs=0,
                flat_logprobs=True,
                detokenize=False,
            )
            for i in range(num_prompts)
        ]

    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        if self._released:
            raise RuntimeError("the engine is released; call resume() before generate()")
        token_lists = prompt_token_lists(prompts)
        longest = max(len(tokens) for tokens in token_lists)
        if longest + sampling.max_new_tokens > self.derived.max_model_len:
            raise ValueError(
                f"prompt of {longest} tokens + max_new_tokens {sampling.max_new_tokens} exceeds "
                f"the engine's max_model_len {self.derived.max_model_len} "
                "(data.max_prompt_length + data.max_response_length)"
            )
        outputs = self._llm.generate(
            [{"prompt_token_ids": tokens} for tokens in token_lists],
            self._request_params(sampling, len(token_lists)),
            use_tqdm=False,
            lora_request=self._lora_request,
        )
        responses: list[list[int]] = []
        log_probs: list[list[float]] = []
        finish_reasons: list[str] = []
        for request in outputs:
            for sample in sorted(request.outputs, key=lambda s: s.index):
                if sample.finish_reason not in (FINISH_STOP, FINISH_LENGTH):
                    raise RuntimeError(f"vLLM ended a sample with finish_reason={sample.finish_reason!r}")
                responses.append(list(sample.token_ids))
                # With logprobs=0 each position holds exactly the sampled token's entry.
                log_probs.append(sample.logprobs.logprobs)
                finish_reasons.append(sample.finish_reason)
        return pack_rollouts(
            prompts,
            sampling.n,
            responses,
            log_probs,
            finish_reasons,
            sampling.max_new_tokens,
            self.pad_token_id,
        )

    def embedding_session(self, prompt_embeds: Sequence[torch.Tensor]) -> VLLMEmbeddingSession:
        """Start decoding from input embeddings: one ``[len_i, hidden]`` tensor per row. See
        `VLLMEmbeddingSession`; needs ``RolloutConfig.enable_prompt_embeds``."""
        if not self.config.enable_prompt_embeds:
            raise RuntimeError("embedding_session needs the engine built with rollout enable_prompt_embeds=True")
        if self._released:
            raise RuntimeError("the engine is released; call resume() before embedding_session()")
        return VLLMEmbeddingSession(self, prompt_embeds)

    def next_token_log_probs(self, prompt_embeds: Sequence[torch.Tensor]) -> torch.Tensor:
        """``[rows, vocab]`` float32 next-token log-probs (nats, temperature 1) after each row's input
        vectors ``[len_i, hidden]``."""
        longest = max(row.shape[0] for row in prompt_embeds)
        if longest >= self.derived.max_model_len:
            raise ValueError(
                f"{longest} input embeddings + 1 position exceed the engine's max_model_len "
                f"{self.derived.max_model_len} (data.max_prompt_length + data.max_response_length)"
            )
        dtype = getattr(torch, self.derived.dtype)
        # Greedy: processed log-probs are then those of the raw logits, and no random draw is made.
        params = VLLMSamplingParams(
            n=1, temperature=0.0, max_tokens=1, logprobs=-1, flat_logprobs=True, detokenize=False
        )
        outputs = self._llm.generate(
            [{"prompt_embeds": row.detach().to("cpu", dtype)} for row in prompt_embeds],
            params,
            use_tqdm=False,
            lora_request=self._lora_request,
        )
        vocab = self._vocab_size
        dense = torch.full((len(outputs), vocab), float("-inf"))
        for i, request in enumerate(outputs):
            flat = request.outputs[0].logprobs
            ids = torch.tensor(flat.token_ids[flat.start_indices[0] : flat.end_indices[0]])
            dense[i, ids] = torch.tensor(flat.logprobs[flat.start_indices[0] : flat.end_indices[0]])
        return dense

    @property
    def _vocab_size(self) -> int:
        return self._llm.llm_engine.model_config.get_vocab_size()

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load ``(hf_name, full_tensor)`` pairs with the model runner's in-place ``reload_weights``.

        ``reload_weights`` runs the checkpoint loaders (TP sharding, fusing q/k/v and gate/up, the CPU
        build's weight prepacking) and copies the result into the existing parameter storage. The
        plain ``model.load_weights`` skips the prepacking on CPU and leaves stale weights in use.
        Every rank of a TP group passes the same full tensors; each keeps its shard. An engine built
        with ``lora`` takes the adapter tensors alone (`_load_adapters`).
        """
        if self._lora is not None:
            self._load_adapters(weights)
            return
        if not self._on_cpu and self._released:
            self._llm.wake_up(tags=["weights"])
        # In-process executor: the iterator reaches the model runner as is, consumed tensor by tensor.
        self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        # Cached prefixes hold keys/values computed with the old weights.
        self._llm.reset_prefix_cache()

    def _load_adapters(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Write the pushed adapter tensors as a PEFT directory and serve it under the next adapter id.

        vLLM caches an adapter by its id, so a new version needs a new id; the previous directory is
        removed (its adapter is already in vLLM's memory, and is evicted when the new one loads).
        """
        assert self._lora is not None and self._adapter_root is not None
        version = 1 if self._lora_request is None else self._lora_request.lora_int_id + 1
        # Copies: the pushed tensors live in the streamer's reused buffer.
        adapters = {name: tensor.detach().clone() for name, tensor in weights}
        target = save_peft_adapter(self._adapter_root / f"v{version}", adapters, self._lora, self._model_path)
        if self._lora_request is not None:
            shutil.rmtree(self._lora_request.lora_path, ignore_errors=True)
        self._lora_request = LoRARequest(f"policy-v{version}", version, str(target))

    def release(self) -> int:
        """Free the KV cache (CPU: resize its storages to 0 bytes; GPU: vLLM sleep level 1, which also
        offloads the weights). Returns bytes freed."""
        if self._released:
            return 0
        if self._on_cpu:
            for storage, _ in self._kv_storages:
                storage.resize_(0)
            freed = sum(nbytes for _, nbytes in self._kv_storages)
        else:
            free_before = torch.cuda.mem_get_info()[0]
            self._llm.sleep(level=1)
            freed = torch.cuda.mem_get_info()[0] - free_before
        self._released = True
        return freed

    def resume(self) -> int:
        """Reallocate what ``release`` freed, zeroed, and drop the prefix cache. Returns bytes restored."""
        if not self._released:
            return 0
        if self._on_cpu:
            for storage, nbytes in self._kv_storages:
                storage.resize_(nbytes)
                # Fresh memory holds garbage; vLLM assumes unused blocks are zero.
                storage.fill_(0)
            restored = sum(nbytes for _, nbytes in self._kv_storages)
        else:
            free_before = torch.cuda.mem_get_info()[0]
            self._llm.wake_up()
            restored = free_before - torch.cuda.mem_get_info()[0]
        # The prefix cache indexes blocks whose contents are gone.
        self._llm.reset_prefix_cache()
        self._released = False
        return restored


def _lora_args(lora: LoraConfig | None) -> dict[str, object]:
    """``vllm.LLM`` arguments that make room for one adapter of ``lora``'s rank (vLLM takes a rank
    from a fixed list: the smallest one that fits)."""
    if lora is None:
        return {}
    fitting = [rank for rank in get_args(MaxLoRARanks) if rank >= lora.rank]
    if not fitting:
        raise ValueError(f"actor.lora.rank {lora.rank} exceeds vLLM's largest adapter rank {get_args(MaxLoRARanks)[-1]}")
    return {"enable_lora": True, "max_lora_rank": fitting[0], "max_loras": 1, "max_cpu_loras": 1}


class VLLMEmbeddingSession:
    """Decoding from input embeddings with vLLM, one position at a time; the same interface as
    `hybridflow.rollout.hf_engine.HFEmbeddingSession`.

    ``log_probs [rows, vocab]`` (float32, nats) is every row's next-token distribution at temperature 1
    after its inputs so far; `append` adds one input vector per row and returns the new ``log_probs``.
    Each call sends every row's whole input again as ``prompt_embeds``; the prefix cache serves the
    positions it has seen. All ranks of a TP group must call it together with the same inputs.
    """

    def __init__(self, engine: VLLMRolloutEngine, prompt_embeds: Sequence[torch.Tensor]) -> None:
        if not prompt_embeds:
            raise ValueError("prompt_embeds must hold at least one row")
        self._engine = engine
        self._rows = [row.detach().to("cpu", torch.float32) for row in prompt_embeds]
        self.log_probs = engine.next_token_log_probs(self._rows)

    def append(self, embeds: torch.Tensor) -> torch.Tensor:
        """Feed ``embeds [rows, hidden]`` as every row's next input; returns ``log_probs [rows, vocab]``."""
        if embeds.dim() != 2 or embeds.shape[0] != len(self._rows):
            raise ValueError(f"append takes [rows={len(self._rows)}, hidden] embeddings, got {tuple(embeds.shape)}")
        step = embeds.detach().to("cpu", torch.float32)
        self._rows = [torch.cat([row, step[i : i + 1]]) for i, row in enumerate(self._rows)]
        self.log_probs = self._engine.next_token_log_probs(self._rows)
        return self.log_probs
