from __future__ import annotations

from pathlib import Path

import pytest

from tests.rollout import _tiny


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An HF directory holding the rollout tests' tiny model and its tokenizer."""
    return _tiny.write_model_dir(tmp_path_factory.mktemp("agents_tiny_qwen2"))
