"""Shared fixtures: a tiny random model on disk, built once per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest_plugins = ["bridge_v1.support"]  # the verifiers venv and scripted models of the bridge tests

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Each test starts with no Accelerate state. A process holds one AcceleratorState, so on a
    GPU machine a test that pins the trainer to the CPU would otherwise meet (and refuse) the
    CUDA state an earlier test on the same worker left, or leave its CPU state to the next."""
    yield
    if "accelerate" in sys.modules:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama (random weights, byte tokenizer, ChatML template) saved as an HF folder."""
    from vfkit.testing.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def tiny_server(tiny_model_path: Path):
    """vf-serve over the tiny model in fp32, served as "tiny" (one thread, 8 sequences at a
    time), one per test module that asks for it."""
    from vfkit.serve.config import ServeConfig
    from vfkit.serve.runner import BackgroundServer

    config = ServeConfig(str(tiny_model_path), served_model_name="tiny", dtype="float32",
                         threads=1, max_num_seqs=8)
    with BackgroundServer(config) as srv:
        yield srv


@pytest.fixture(scope="session")
def vlm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LLaVA (random weights, byte tokenizer + <image>, 32 px CLIP) with its processor."""
    from vfkit.testing.tiny_vlm import make_tiny_vlm

    return make_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))
