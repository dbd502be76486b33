"""vfkit environments in today's prime-rl (verifiers v1 tasksets), through `vfkit.bridge`.

prime-rl's orchestrator role (`bridge_v1/orchestrator.py`, in the verifiers venv of
`bridge_v1/support.py`): load the taskset by id, run episodes through the v1 env server with the
train client, which calls vLLM's token-in `/inference/v1/generate`, and build training samples
from the traces. The loss mask covers exactly the model's tokens, on a single-turn and a
multi-turn environment (vfkit's scripted test server); against a real `vf-serve`, its own
token route serves the train client, logprobs checked against a forward pass.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from bridge_v1.recording_proxy import RecordingProxy
from bridge_v1.support import ORCHESTRATOR, bisect_model, reverse_model, run, slow, vfkit_states

from vfkit.serve.launcher import start_server
from vfkit.testing.scripted_server import TestServer
from vfkit.testing.tiny_model import make_tokenizer


# ----- vLLM's token-in route, which prime-rl's train client calls -----
def test_the_token_route_answers_as_vllm_does() -> None:
    tok = make_tokenizer()
    prompt = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    seen = []
    with TestServer(lambda req: seen.append(req["prompt"]) or "ok") as server:
        url = server.base_url.removesuffix("/v1") + "/inference/v1/generate"
        body = {"model": "m", "token_ids": prompt,
                "sampling_params": {"max_tokens": 8, "logprobs": 1}}
        full = httpx.post(url, json=body).json()
        cut = httpx.post(url, json={**body, "sampling_params": {"max_tokens": 1}}).json()
    assert server.requests[0]["token_ids"] == prompt
    assert seen[0] == tok.decode(prompt)  # the responder sees the decoded prompt
    ids = [*tok.encode("ok"), tok.eos_token_id]  # "o", "k", then eos: generation stopped
    assert full["choices"][0]["token_ids"] == ids and full["prompt_token_ids"] == prompt
    assert full["choices"][0]["finish_reason"] == "stop"
    assert [(e["token"], e["logprob"]) for e in full["choices"][0]["logprobs"]["content"]] == [
        (f"token_id:{t}", -0.5) for t in ids]
    assert cut["choices"][0]["token_ids"] == ids[:1]
    assert cut["choices"][0]["finish_reason"] == "length"


# ----- prime-rl's orchestrator role -----
def _masked_runs(mask: list[bool]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, keep in enumerate([*mask, False]):
        if keep and start is None:
            start = i
        elif not keep and start is not None:
            runs.append((start, i))
            start = None
    return runs


def _orchestrate(v1_python: str, tmp_path: Path, env_id: str, model, env_args: dict,
                 env: dict | None = None):
    tokenizer = make_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    with TestServer(model) as server:
        run([v1_python, str(ORCHESTRATOR), f"vfkit-{env_id}", server.base_url,
              str(tmp_path / "tokenizer"), str(tmp_path / "samples.json"), json.dumps(env_args)],
             "the orchestrator", timeout=600, env=env)
        prompts = {tuple(r["token_ids"]) for r in server.requests if "token_ids" in r}
    samples = json.loads((tmp_path / "samples.json").read_text())["samples"]
    return tokenizer, prompts, samples


@slow
@pytest.mark.parametrize(("env_id", "model", "env_args"), [
    ("reverse-text", reverse_model, {"num_eval_examples": 4}),
    ("guess-number", bisect_model, {"num_eval_examples": 3}),
], ids=["single-turn", "multi-turn"])
async def test_prime_rl_orchestrator_trains_on_exactly_the_model_tokens(
        v1_python: str, local_envs: None, tmp_path: Path, env_id: str, model,
        env_args: dict) -> None:
    tokenizer, prompts, samples = _orchestrate(v1_python, tmp_path, env_id, model, env_args)
    assert len(samples) == 2 * env_args["num_eval_examples"]  # groups of 2, one branch each
    rows = [s["row"] for s in samples]
    expected = await vfkit_states(env_id, model, rows, **env_args)
    turns = []
    for sample in samples:
        ids, mask, logprobs = sample["token_ids"], sample["mask"], sample["logprobs"]
        assert sample["ok"] and not sample["errors"]
        assert len(ids) == len(mask) == len(logprobs)
        runs = _masked_runs(mask)
        turns.append(len(runs))
        for start, end in runs:
            assert tuple(ids[:start]) in prompts  # everything before a reply was its prompt
            reply = model({"prompt": tokenizer.decode(ids[:start])})
            assert ids[start:end] == [*tokenizer.encode(reply), tokenizer.eos_token_id]
            assert logprobs[start:end] == [-0.5] * (end - start)  # the server's logprobs
        assert sum(lp for lp, keep in zip(logprobs, mask, strict=True) if not keep) == 0
        state = expected[sample["row"]["example_id"]]
        assert sample["reward"] == pytest.approx(state["reward"])
        assert len(runs) == len(state["trajectory"])  # one sampled run per model turn
    assert sum(s["advantage"] for s in samples) == pytest.approx(0.0)  # reward - group mean
    if env_id == "guess-number":
        assert max(turns) > 1  # env responses sit between the runs, unmasked


@slow
async def test_prime_rl_orchestrator_samples_from_vf_serve_through_the_token_route(
        v1_python: str, local_envs: None, tiny_model_path: Path, tmp_path: Path) -> None:
    """prime-rl's train client against a real `vf-serve` (tiny random model, fp32): every model
    call goes to `/inference/v1/generate`, and the logprobs a sample carries for its masked
    tokens are the model's own (a forward pass of the same weights, temperature 1)."""
    import torch
    from transformers import AutoModelForCausalLM

    args = {"num_eval_examples": 2}
    with start_server(str(tiny_model_path), dtype="float32", log_path=tmp_path / "serve.log",
                      extra_args=["--served-model-name", "tiny"]) as server, \
            RecordingProxy(server.base_url) as proxy:
        run([v1_python, str(ORCHESTRATOR), "vfkit-reverse-text", proxy.base_url,
              str(tiny_model_path), str(tmp_path / "samples.json"), json.dumps(args)],
             "the orchestrator", timeout=600)
    samples = json.loads((tmp_path / "samples.json").read_text())["samples"]
    assert len(samples) == 2 * args["num_eval_examples"]
    routes = [c.path for c in proxy.calls if c.path.endswith("/generate")]
    assert routes == ["/inference/v1/generate"] * len(samples)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    for sample in samples:
        ids, mask, logprobs = sample["token_ids"], sample["mask"], sample["logprobs"]
        assert sample["ok"] and not sample["errors"] and 0.0 <= sample["reward"] <= 1.0
        ((start, end),) = _masked_runs(mask)  # single turn: one sampled run
        with torch.inference_mode():
            logits = model(torch.tensor([ids[:end]])).logits[0, start - 1 : end - 1]
        own = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[start:end])[:, None])
        assert logprobs[start:end] == pytest.approx(own[:, 0].tolist(), abs=1e-3)
        assert not any(logprobs[:start]) and not any(logprobs[end:])
    assert sum(s["advantage"] for s in samples) == pytest.approx(0.0)


@slow
def test_a_tasksets_system_prompt_override_reaches_the_model(
        v1_python: str, local_envs: None, tmp_path: Path) -> None:
    """A v1 taskset's `system_prompt` (what GEPA optimises) was in the task data, but the model
    got the environment's own system prompt."""
    override = tmp_path / "system.txt"
    override.write_text("Answer in reverse, please.")
    env = {**os.environ, "VFKIT_SYSTEM_PROMPT": str(override)}
    tokenizer, prompts, samples = _orchestrate(
        v1_python, tmp_path, "reverse-text", reverse_model, {"num_eval_examples": 2}, env=env)
    assert samples and all(s["ok"] for s in samples)
    texts = [tokenizer.decode(list(p)) for p in prompts]
    assert texts and all("Answer in reverse, please." in t for t in texts)
