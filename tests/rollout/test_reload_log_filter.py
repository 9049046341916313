"""The vLLM warnings our way of running the engine always triggers are dropped; other records pass."""

from __future__ import annotations

import logging

import pytest

vllm_engine = pytest.importorskip("hybridflow.rollout.vllm_engine", reason="vLLM is not installed")


def kept_messages(logger_name: str, emit) -> list[str]:
    logger = logging.getLogger(logger_name)
    logger.addFilter(vllm_engine.ExpectedWarningFilter())
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Collect()
    logger.addHandler(handler)
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
    return seen


def test_only_the_rotary_reload_warning_is_dropped():
    def emit(logger):
        for layer in ("RotaryEmbedding", "QKVParallelLinear"):
            logger.warning("%s: Failed to load weights", layer)

    assert kept_messages(vllm_engine.FILTERED_LOGGERS[0], emit) == ["QKVParallelLinear: Failed to load weights"]


def test_only_the_missing_tokenizer_warmup_warning_is_dropped():
    def emit(logger):
        for error in (
            ValueError("Tokenizer not available when `skip_tokenizer_init=True`"),
            RuntimeError("template syntax error"),
        ):
            try:
                raise error
            except Exception:
                logger.warning("Chat template warmup failed", exc_info=True)

    assert kept_messages(vllm_engine.FILTERED_LOGGERS[1], emit) == ["Chat template warmup failed"]
