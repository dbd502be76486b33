"""The static decode path (the one CUDA graphs replay) gives what the default path gives.

On a GPU the server decodes over a fixed-address cache (static_cache.py) through graphs.py;
here the same static steps run eagerly on the CPU (capture_graphs=False), and every sequence of
a workload that makes rows join, finish, move and the cache grow and trim must come out token
for token, and logprob for logprob, as from the default dynamic path. tests/test_gpu.py checks
the captured graphs themselves on CUDA.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import torch
from test_serve_lora import make_adapter
from transformers import AutoModelForCausalLM, AutoTokenizer

from vfkit.serve import static_cache
from vfkit.serve.engine import Engine
from vfkit.serve.lora import LoraManager
from vfkit.serve.sequence import SamplingParams, Sequence

MAX_LEN = 72


def make_engine(path, adapter_dir, static: bool, device: str = "cpu",
                dtype: torch.dtype = torch.float32) -> Engine:
    """An engine on `device`; static steps are captured as graphs on CUDA only."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    lora = LoraManager(model, allowed_dirs=[adapter_dir], merge=False)
    engine = Engine(lora, AutoTokenizer.from_pretrained(path), max_model_len=MAX_LEN,
                    eos_token_ids=set(), max_batch=4, static_decode=static,
                    capture_graphs=device.startswith("cuda"))
    engine.start()
    return engine


def load(engine: Engine, name: str, path) -> None:
    lora = engine.lora
    engine.call(lambda: lora.apply_load(name, lora.check_load(name, str(path), False))).result()


def workload() -> list[tuple[list[int], int, str | None]]:
    """(prompt ids, max_tokens, adapter): more rows than slots, uneven prompts and lengths,
    some running into max_model_len, one adapter and the base mixed in one batch."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(10):
        prompt = torch.randint(3, 200, (int(torch.randint(2, 30, (1,), generator=gen)),),
                               generator=gen).tolist()
        max_tokens = [5, 40, 12, 60, 3, 25, 8, 50, 18, 33][i]
        out.append((prompt, max_tokens, "a" if i % 3 == 0 else None))
    return out


def run(engine: Engine, waves: list[list[tuple[list[int], int, str | None]]],
        temperature: float = 0.0) -> list[Sequence]:
    """Submit each wave a few decode steps after the previous one; wait for everything."""
    seqs: list[Sequence] = []
    done = threading.Semaphore(0)
    for wave in waves:
        params = SamplingParams(max_tokens=0, temperature=temperature, logprobs=0)
        batch = [Sequence(p, dataclasses.replace(params, max_tokens=m),
                          adapter=a, on_done=lambda _: done.release()) for p, m, a in wave]
        engine.submit(batch)
        seqs += batch
        steps = engine.steps
        while engine.steps < steps + 3 and engine.load()["running"]:
            time.sleep(0.005)
    for _ in seqs:
        assert done.acquire(timeout=120)
    assert all(s.error is None for s in seqs), [s.error for s in seqs]
    return seqs


@pytest.fixture(scope="module")
def adapter(tiny_model_path, tmp_path_factory):
    return make_adapter(tiny_model_path, tmp_path_factory.mktemp("static") / "a", seed=1)


def test_static_steps_match_the_dynamic_cache(tiny_model_path, adapter, monkeypatch):
    monkeypatch.setattr(static_cache, "_MIN_CAPACITY", 16)  # so the arena has to grow
    decoder = compare_with_dynamic(tiny_model_path, adapter, "cpu")
    assert decoder.eager_steps > 0 and decoder.replays == 0


def compare_with_dynamic(path, adapter, device: str, tolerance: float = 1e-4):
    """Run the workload on the dynamic and the static path; assert they agree; return the
    static engine's decoder (its counters say which steps were replayed or eager)."""
    work = workload()
    waves = [work[:3], work[3:7], work[7:]]
    results = []
    for static in (False, True):
        engine = make_engine(path, adapter.parent, static, device)
        try:
            load(engine, "a", adapter)
            results.append(run(engine, waves))
            decoder = engine.decoder
        finally:
            engine.stop()
    assert decoder.eager_steps + decoder.replays == engine.steps > 0
    assert decoder.cache.generation >= 2  # the arena grew at least once
    dynamic, static = results
    for want, got in zip(dynamic, static, strict=True):
        assert got.output_ids == want.output_ids
        assert got.finish_reason == want.finish_reason
        assert got.logprobs == pytest.approx(want.logprobs, abs=tolerance)
    assert {s.finish_reason for s in static} == {"length"}
    assert any(len(s.prompt_ids) + len(s.output_ids) == MAX_LEN for s in static)
    return decoder


def test_static_cache_row_operations_keep_rows_right_aligned() -> None:
    from vfkit.serve.kv_cache import BatchCache

    def group(rows: int, length: int, base: float) -> BatchCache:
        cache = BatchCache()
        keys = base + torch.arange(rows * length, dtype=torch.float32).reshape(rows, 1, length, 1)
        cache.update(keys, -keys, 0)
        return cache

    cache = static_cache.StaticCache(num_layers=1, max_rows=4, max_length=64)
    cache.merge(group(2, 3, 0.0))  # rows 0-1, length 3
    cache.merge(group(1, 5, 100.0))  # a longer row: the first two move right by 2
    layer = cache.layers[0]
    assert (cache.rows, cache.length) == (3, 5)
    assert layer.key_buf[0, 0, :5, 0].tolist() == [0, 0, 0, 1, 2]
    assert layer.key_buf[2, 0, :5, 0].tolist() == [100, 101, 102, 103, 104]
    assert torch.equal(layer.value_buf[:3, :, :5], -layer.key_buf[:3, :, :5])
    cache.place(0, group(1, 2, 50.0), 0)  # a short row into slot 0, left-padded
    assert layer.key_buf[0, 0, :5, 0].tolist() == [0, 0, 0, 50, 51]
    cache.select_rows(torch.tensor([2, 0]))  # compaction
    assert cache.rows == 2
    assert layer.key_buf[1, 0, :5, 0].tolist() == [0, 0, 0, 50, 51]
    cache.trim_left(3)
    assert layer.key_buf[:2, 0, :2, 0].tolist() == [[103, 104], [50, 51]]
    assert not cache.worth_trimming(1)
    cache.length = 63
    assert cache.worth_trimming(1)  # the next step would not fit


def test_cuda_graphs_setting_is_checked_against_the_device() -> None:
    from vfkit.serve.model import use_cuda_graphs

    assert not use_cuda_graphs("off", "cuda", None)
    assert not use_cuda_graphs("auto", "cpu", None)
    assert use_cuda_graphs("auto", "cuda:0", None)
    assert not use_cuda_graphs("auto", "cuda", processor=object())  # image models: eager
    with pytest.raises(ValueError, match=r"--cuda-graphs on needs a CUDA device.*--device cuda"):
        use_cuda_graphs("on", "cpu", None)
    with pytest.raises(ValueError, match="image-text models"):
        use_cuda_graphs("on", "cuda", processor=object())
