"""The `gpu` set: what must hold on a CUDA device (skipped where there is none, as in CI).

Run on a GPU machine with `pytest -m gpu tests` (../shared/gpu/README.md packs what a bare one
lacks). Each test compares a CUDA result with the same computation on the CPU, so a tensor left
on the wrong device or a dtype surprise fails here rather than in a user's run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(autouse=True)
def _train_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "train_envs"))


def test_training_steps_run_on_the_gpu_and_change_the_adapter(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    import train_testing

    from vfkit.testing.scripted_server import TestServer
    from vfkit.train.phases import train

    with TestServer(train_testing.GroupResponder()) as srv:
        cfg = train_testing.tiny_config(tiny_model_path, tmp_path, srv.base_url,
                                        "trainer.args.max_steps=2", "trainer.args.bf16=true")
        run_dir = train(cfg)
    rows = train_testing.metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["samples/trained"] > 0 and r["grad_norm"] > 0 for r in rows)
    assert torch.cuda.max_memory_allocated() > 0  # the trainer's tensors were on the GPU
    from safetensors.torch import load_file

    adapter = run_dir / "checkpoints" / "step_2" / "adapter" / "adapter_model.safetensors"
    lora_b = [t for k, t in load_file(adapter).items() if "lora_B" in k]
    assert lora_b and any(t.abs().sum() > 0 for t in lora_b)  # B starts at zero: it trained


def test_probe_logprobs_on_gpu_match_the_cpu(tiny_model_path: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from vfkit.train.policy import probe_logprobs

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear",
                                            init_lora_weights=False))
    prompt, completion = [5, 6, 7, 8], [9, 10, 11]
    on_cpu = probe_logprobs(model, prompt, completion, 1.0)
    on_gpu = probe_logprobs(model.to("cuda"), prompt, completion, 1.0)
    assert on_gpu == pytest.approx(on_cpu, abs=1e-3)


@pytest.mark.parametrize("graphs", ["off", "on"])
def test_embedded_server_on_gpu_serves_logprobs_of_the_model(
    tiny_model_path: Path, graphs: str
) -> None:
    from openai import OpenAI
    from transformers import AutoModelForCausalLM

    from vfkit.serve.launcher import start_server

    with start_server(str(tiny_model_path), dtype="float32",
                      extra_args=["--device", "cuda", "--cuda-graphs", graphs]) as server:
        client = OpenAI(base_url=server.base_url, api_key="x")
        out = client.completions.create(model=str(tiny_model_path), prompt="abc", max_tokens=4,
                                        temperature=1.0, logprobs=1, seed=0,
                                        extra_body={"return_token_ids": True})
    choice = out.model_dump()["choices"][0]
    prompt_ids, ids = choice["prompt_token_ids"], choice["token_ids"]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    logits = model(torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1 : -1]
    want = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
    got = torch.tensor(choice["logprobs"]["token_logprobs"])
    assert (got - want).abs().max() < 1e-2


def test_graph_server_keeps_sampling_through_arena_growth_and_adapter_loads(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    """What failed in the first live run (benchmarks/RESULTS.md, GPU): in bf16, unseeded
    sampling, the arena growing and an adapter loaded mid-way, every graph re-captured."""
    from openai import OpenAI
    from test_serve_lora import make_adapter

    from vfkit.serve.launcher import start_server

    adapter = make_adapter(tiny_model_path, tmp_path / "a", seed=1)
    args = ["--device", "cuda", "--cuda-graphs", "on", "--allowed-adapter-dir", str(tmp_path)]
    log = tmp_path / "server.log"
    with start_server(str(tiny_model_path), dtype="bfloat16", extra_args=args,
                      log_path=log) as server:
        client = OpenAI(base_url=server.base_url, api_key="x")

        def sample(model: str, max_tokens: int) -> None:
            out = client.completions.create(model=model, prompt=["abc", "hello there"] * 4,
                                            max_tokens=max_tokens, temperature=1.0,
                                            extra_body={"ignore_eos": True})
            assert all(c.finish_reason == "length" for c in out.choices)

        sample(str(tiny_model_path), 8)
        sample(str(tiny_model_path), 300)  # past the first arena (128 positions)
        import httpx

        root = server.base_url.removesuffix("/v1")
        r = httpx.post(server.base_url + "/load_lora_adapter",
                       json={"lora_name": "a", "lora_path": str(adapter)}, timeout=60)
        assert r.status_code == 200, r.text
        sample("a", 40)
        sample(str(tiny_model_path), 40)
        stats = httpx.get(root + "/stats").json()
    assert not stats["graph_error"], log.read_text()[-4000:]
    assert stats["graph_replays"] > 0 and stats["graph_captures"] >= 3


def test_cuda_graph_decoding_matches_the_dynamic_path(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replayed graphs (rows joining, finishing, moving; the arena growing; an adapter and the
    base, alone and mixed) give the tokens and logprobs of the eager dynamic path."""
    from test_serve_lora import make_adapter
    from test_serve_static_decode import compare_with_dynamic

    from vfkit.serve import static_cache

    monkeypatch.setattr(static_cache, "_MIN_CAPACITY", 16)
    adapter = make_adapter(tiny_model_path, tmp_path / "a", seed=1)
    decoder = compare_with_dynamic(tiny_model_path, adapter, "cuda", tolerance=2e-3)
    assert decoder.replays > 0 and decoder.captures > 0
    assert decoder.eager_steps > 0  # the mixed base + adapter batches


def test_graphs_capture_a_bf16_peft_model_and_keep_sampling(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live failure's ingredients in one process (bf16, a PEFT adapter, unseeded
    sampling, re-captures as the arena grows): no request fails and graphs stay on (a failed
    capture would turn them off and log why)."""
    from test_serve_lora import make_adapter
    from test_serve_static_decode import load, make_engine, run, workload

    from vfkit.serve import static_cache

    monkeypatch.setattr(static_cache, "_MIN_CAPACITY", 16)
    adapter = make_adapter(tiny_model_path, tmp_path / "a", seed=1)
    engine = make_engine(tiny_model_path, tmp_path, True, "cuda", torch.bfloat16)
    try:
        run(engine, [[(p, m, None) for p, m, _ in workload()[:4]]], temperature=1.0)
        load(engine, "a", adapter)
        work = workload()
        run(engine, [work[:3], work[3:7], work[7:]], temperature=1.0)
        decoder = engine.decoder
    finally:
        engine.stop()
    assert decoder.capture, decoder.error
    assert decoder.replays > 0 and decoder.captures >= 2
