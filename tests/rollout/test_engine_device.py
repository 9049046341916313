"""The HF engine generates on the device it is built for, not where its weights were loaded.

The ``meta`` device stands in for a GPU: a model left on the host would show ``cpu`` parameters.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hybridflow.rollout import HFRolloutEngine, RolloutConfig, build_rollout_engine
from tests.rollout import _tiny

META = torch.device("meta")


def _devices(engine: HFRolloutEngine) -> set[torch.device]:
    return {tensor.device for tensor in (*engine.model.parameters(), *engine.model.buffers())}


def test_a_loaded_model_ends_on_the_engine_device(tiny_model_dir: Path):
    engine = build_rollout_engine(RolloutConfig(engine="hf"), tiny_model_dir, device=META)
    assert isinstance(engine, HFRolloutEngine)
    assert _devices(engine) == {META}
    assert engine.model.device == META


def test_a_given_model_is_moved_to_the_engine_device(tiny_model_dir: Path):
    model = _tiny.model()
    engine = build_rollout_engine(RolloutConfig(engine="hf"), tiny_model_dir, model=model, device=META)
    assert isinstance(engine, HFRolloutEngine)
    assert engine.model is model
    assert _devices(engine) == {META}

