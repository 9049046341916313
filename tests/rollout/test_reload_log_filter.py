"""vLLM's per-push "RotaryEmbedding: Failed to load weights" warning is dropped; other layers' stay."""

from __future__ import annotations

import logging

import pytest

vllm_engine = pytest.importorskip("hybridflow.rollout.vllm_engine", reason="vLLM is not installed")


def test_only_the_rotary_reload_warning_is_dropped():
    logger = logging.getLogger(vllm_engine._RELOAD_LOGGER)
    logger.addFilter(vllm_engine._RotaryReloadFilter())
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Collect()
    logger.addHandler(handler)
    try:
        for layer in ("RotaryEmbedding", "QKVParallelLinear"):
            logger.warning("%s: Failed to load weights", layer)
    finally:
        logger.removeHandler(handler)
    assert seen == ["QKVParallelLinear: Failed to load weights"]
