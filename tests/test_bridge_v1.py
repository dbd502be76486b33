"""vfkit environments in verifiers v1 and today's prime-rl, through `vfkit.bridge` (issue 14).

The tests run in a throwaway venv with the newest verifiers from PyPI (built once under
`.cache/bridge-v1-venv/`, gitignored; delete it to rebuild) holding this checkout's vfkit and
environments, against vfkit's scripted OpenAI/vLLM-compatible test server on loopback (or a real
`vf-serve` where said):

- verifiers' own `vf-eval` runs `vfkit-reverse-text`; every trace's rewards equal what vfkit
  computes for the same reply;
- the same against a real `vf-serve` subprocess (tiny random model), streaming: a harness that
  streams makes verifiers' eval client stream (vfkit's harness does not stream), a recording
  proxy shows vf-serve answered as SSE, and streamed and plain replies have the same token ids;
- prime-rl's orchestrator role (`bridge_v1/orchestrator.py`): load the taskset by id, run
  episodes through the v1 env server with the train client (token-in generate endpoint), build
  training samples from the traces; the loss mask covers exactly the model's tokens, on a
  single-turn and a multi-turn environment; and the same role against a real `vf-serve`, whose
  own token route serves the train client (logprobs checked against a forward pass).

vfkit itself never imports verifiers. The venv installs vfkit with `--no-deps`: the SDK needs
nothing verifiers does not bring besides `datasets`, and the trainer's torch is not needed here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
from bridge_v1.recording_proxy import RecordingProxy
from openai import AsyncOpenAI

import vfkit as vf
from vfkit.serve.launcher import start_server
from vfkit.testing.scripted_server import Reply, TestServer
from vfkit.testing.tiny_model import make_tokenizer

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".cache" / "bridge-v1-venv"
ENVIRONMENTS = ("reverse-text", "guess-number", "calculator")
HELPERS = Path(__file__).parent / "bridge_v1"
ORCHESTRATOR = HELPERS / "orchestrator.py"
# verifiers' vf-eval by module: vfkit's own `vf-eval` script shares the name in this venv
EVAL_CLI = "import sys; from verifiers.v1.cli.eval.main import main; sys.argv[0]='vf-eval'; main()"


def slow(test):
    """Marks a test that needs the venv: minutes to build once, then cached."""
    return pytest.mark.slow(pytest.mark.timeout(1800)(test))


# ----- the throwaway venv -----
def _run(cmd: list[str], what: str, timeout: float = 1200, env: dict | None = None) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env)
    if done.returncode:
        raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n"
                           f"{done.stderr[-4000:]}")
    return done.stdout


def _base_python() -> str:
    """python3.12 (prime-rl's) when it runs here, else this interpreter (verifiers: >=3.11)."""
    for candidate in (shutil.which("python3.12"), sys.executable):
        if candidate and subprocess.run([candidate, "--version"],
                                        capture_output=True).returncode == 0:
            return candidate
    return sys.executable


def _install_verifiers(pip: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        probe = subprocess.run([pip, "download", "-q", "--no-deps", "-d", tmp, "verifiers"],
                               capture_output=True, text=True, timeout=300)
    if probe.returncode:
        pytest.skip(f"PyPI unreachable, cannot get verifiers: {probe.stderr[-300:]}")
    _run([pip, "install", "-q", "verifiers", "datasets"], "installing verifiers")


@pytest.fixture(scope="module")
def v1_python() -> str:
    """The venv's python: verifiers installed once, this checkout's packages when the list
    changes (both editable, so code edits need no reinstall)."""
    pip, base, stamp = str(VENV / "bin" / "pip"), VENV / ".verifiers", VENV / ".environments"
    if not base.exists():
        shutil.rmtree(VENV, ignore_errors=True)
        _run([_base_python(), "-m", "venv", str(VENV)], "creating the venv")
        _install_verifiers(pip)
        base.touch()
    if not (stamp.exists() and stamp.read_text() == " ".join(ENVIRONMENTS)):
        editable = [a for env in ENVIRONMENTS for a in ("-e", str(ROOT / "environments" / env))]
        _run([pip, "install", "-q", "--no-deps", "-e", str(ROOT), *editable], "installing vfkit")
        stamp.write_text(" ".join(ENVIRONMENTS))
    return str(VENV / "bin" / "python")


def _with_helpers() -> dict[str, str]:
    """This environment, with the test harnesses in `bridge_v1/` importable by id."""
    path = os.pathsep.join([str(HELPERS), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


@pytest.fixture
def local_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    """This checkout's environment modules, not whatever the shared venv has installed."""
    for env in ENVIRONMENTS:
        monkeypatch.syspath_prepend(str(ROOT / "environments" / env))


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


# ----- scripted models (they see chat messages, or the decoded prompt on the token route) -----
def _prompt_text(request: dict) -> str:
    if "messages" in request:
        return "\n".join(str(m.get("content") or "") for m in request["messages"])
    return request["prompt"]


def reverse_model(request: dict) -> str:
    """Exact, echoed, half and untagged reversals, chosen by the text (so replies are fixed)."""
    found = re.findall(r"Reverse this text: (.*?)(?:<\|im_end\|>|\n|$)", _prompt_text(request))
    text = found[-1]
    kind = len(text) % 4
    answer = [text[::-1], text, text[::-1][: len(text) // 2], text[::-1]][kind]
    return answer if kind == 3 else f"<answer>{answer}</answer>"


def calculator_model(request: dict) -> str | Reply:
    """Two right tool calls for `(a op b) op c`, then the last result as the answer."""
    messages = request["messages"]
    question = next(m["content"] for m in messages if m["role"] == "user")
    a, op1, b, op2, c = re.search(r"\((\d+) (\S) (\d+)\) (\S) (\d+)", question).groups()
    names = {"+": "add", "-": "subtract", "*": "multiply"}
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if len(results) == 2:
        return f"<answer>{results[-1]}</answer>"
    name, args = ((names[op1], {"a": int(a), "b": int(b)}) if not results
                  else (names[op2], {"a": float(results[0]), "b": int(c)}))
    return Reply(tool_calls=[{"name": name, "arguments": args}])


def bisect_model(request: dict) -> str:
    """Binary search from the hints so far (1..20): a multi-turn conversation of a few turns."""
    low, high = 1, 20
    for guess, hint in re.findall(r"<guess>(\d+)</guess>.*?(Higher|Lower)", _prompt_text(request),
                                  re.S):
        low, high = (int(guess) + 1, high) if hint == "Higher" else (low, int(guess) - 1)
    return f"<guess>{(low + high) // 2}</guess>"


async def vfkit_states(env_id: str, model, rows: list[dict], **env_args) -> dict[int, dict]:
    """vfkit's own rollouts of `rows` against the same scripted model, by example_id."""
    env = vf.load_environment(env_id, **env_args)
    with TestServer(model) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client:
            states = [await env.run_rollout(row, client, "m") for row in rows]
    return {s["example_id"]: s for s in states}


# ----- verifiers' own eval -----
@slow
@pytest.mark.parametrize(("env_id", "model", "n"), [
    ("reverse-text", reverse_model, 8), ("calculator", calculator_model, 3),
], ids=["single-turn", "tools"])
async def test_verifiers_eval_scores_a_vfkit_environment_as_vfkit_does(
        v1_python: str, local_envs: None, tmp_path: Path, env_id: str, model, n: int) -> None:
    args = {"num_eval_examples": n}
    with TestServer(model) as server:
        _run([v1_python, "-c", EVAL_CLI, f"vfkit-{env_id}", "-m", "tiny", "-n", str(n), "-r", "1",
              "--no-push", "-o", str(tmp_path), "--env.taskset.split", "eval",
              "--env.taskset.args", json.dumps(args), "--client.base-url", server.base_url],
             "verifiers' vf-eval", timeout=600)
    episodes = [json.loads(line) for line in next(tmp_path.rglob("traces.jsonl")).open()]
    traces = [t for e in episodes for t in e["traces"]]
    assert len(traces) == n and all(t["ok"] for t in traces)
    env = vf.load_environment(env_id, **args)
    expected = await vfkit_states(env_id, model, list(env.get_eval_dataset()), **args)
    weights = dict(zip(env.rubric.get_reward_func_names(), env.rubric.get_reward_weights(),
                       strict=True))
    for trace in traces:
        state = expected[trace["task"]["data"]["row"]["example_id"]]
        assert {k: (r["score"], r["weight"]) for k, r in trace["rewards"].items()} == {
            k: (state["metrics"][k], w) for k, w in weights.items() if w}
        assert trace["metrics"] == {k: state["metrics"][k] for k, w in weights.items() if not w}
        total = sum(r["score"] * r["weight"] for r in trace["rewards"].values())
        assert total == pytest.approx(state["reward"])
    rewards = {round(s["reward"], 2) for s in expected.values()}
    if env_id == "reverse-text":  # exact 1.2, untagged 1.0, echo 0 (no format credit), half
        assert rewards >= {0.0, 1.0, 1.2}
    else:  # two tool calls per rollout, run by vfkit inside the v1 harness
        assert rewards == {1.0}
        assert all(t["metrics"]["total_tool_calls"] == 2.0 for t in traces)


@slow
async def test_a_harness_that_knows_nothing_of_vfkit_is_scored_from_the_trace(
        v1_python: str, local_envs: None, tmp_path: Path) -> None:
    """prime-rl's own examples pin `harness.id = "null"`: the vfkit rubric then reads the trace."""
    args = {"num_eval_examples": 4}
    with TestServer(reverse_model) as server:
        _run([v1_python, "-c", EVAL_CLI, "vfkit-reverse-text", "-m", "tiny", "-n", "4", "-r", "1",
              "--no-push", "-o", str(tmp_path / "out"), "--env.taskset.split", "eval",
              "--env.taskset.args", json.dumps(args), "--env.agent.harness.id", "plain_chat",
              "--client.base-url", server.base_url],
             "verifiers' vf-eval", timeout=600, env=_with_helpers())
    traces = [t for line in next(tmp_path.rglob("traces.jsonl")).open()
              for t in json.loads(line)["traces"]]
    env = vf.load_environment("reverse-text", **args)
    expected = await vfkit_states("reverse-text", reverse_model, list(env.get_eval_dataset()),
                                  **args)
    assert len(traces) == 4 and all(t["ok"] for t in traces)
    for trace in traces:
        assert trace["agent"]["config"]["harness"]["id"] == "plain_chat"
        state = expected[trace["task"]["data"]["row"]["example_id"]]
        total = sum(r["score"] * r["weight"] for r in trace["rewards"].values())
        assert total == pytest.approx(state["reward"])


# A calculator episode as a harness that knows nothing of vfkit would leave it in its trace:
# the model called `add`, read the tool's result, answered; the tool also sent an image.
FOREIGN_TOOL_EPISODE = """
import asyncio, json, sys
from types import SimpleNamespace
import pydantic
import verifiers.v1 as v1
import vfkit
from vfkit.bridge.v1 import chat_message, state_from_trace

env = vfkit.load_environment("calculator", num_eval_examples=1)
row = dict(env.get_eval_dataset()[0])
as_v1 = pydantic.TypeAdapter(v1.Message).validate_python
call = v1.ToolCall(id="c1", name="add", arguments='{"a": 2, "b": 3}')
image = [v1.TextContentPart(text="plot:"),
         v1.ImageUrlContentPart(image_url=v1.ImageUrlSource(url="data:image/png;base64,AAAA"))]
messages = [*(as_v1(m) for m in row["prompt"]),
            v1.AssistantMessage(content=None, tool_calls=[call]),
            v1.ToolMessage(tool_call_id="c1", name="add", content="5"),
            v1.AssistantMessage(content="<answer>" + row["answer"] + "</answer>")]
trace = SimpleNamespace(messages=messages, is_truncated=False, last_reply="")
state = state_from_trace(env, row, trace)
asyncio.run(env.rubric.score_rollout(state))
json.dump({"completion": state["completion"], "metrics": state["metrics"],
           "reward": state["reward"],
           "image": chat_message(v1.ToolMessage(tool_call_id="c2", content=image))}, sys.stdout)
"""


@slow
def test_a_foreign_harness_trace_keeps_tool_calls_and_images_for_the_rubric(
        v1_python: str) -> None:
    """A trace from another harness is scored with its tool calls: the calculator's ToolRubric
    counts them (it counted 0 when only the text was kept), and image parts survive."""
    out = json.loads(_run([v1_python, "-c", FOREIGN_TOOL_EPISODE], "the foreign trace"))
    call, result, answer = out["completion"]
    assert call["tool_calls"] == [{"id": "c1", "type": "function",
                                   "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]
    assert result == {"role": "tool", "content": "5", "tool_call_id": "c1", "name": "add"}
    assert answer["role"] == "assistant" and "<answer>" in answer["content"]
    assert out["metrics"]["total_tool_calls"] == 1 and out["metrics"]["add_calls"] == 1
    assert out["metrics"]["correct_answer"] == 1 and out["reward"] == 1
    assert out["image"]["content"] == [
        {"type": "text", "text": "plot:"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]


@slow
def test_a_failed_vfkit_rollout_fails_its_trace_instead_of_scoring_zero(
        v1_python: str, tmp_path: Path) -> None:
    with TestServer([]) as server:  # an empty script: every model call gets a 400
        _run([v1_python, "-c", EVAL_CLI, "vfkit-reverse-text", "-m", "tiny", "-n", "1", "-r", "1",
              "--no-push", "-o", str(tmp_path), "--client.base-url", server.base_url],
             "verifiers' vf-eval", timeout=600)
    (trace,) = [t for line in next(tmp_path.rglob("traces.jsonl")).open()
                for t in json.loads(line)["traces"]]
    assert not trace["ok"]
    message = " ".join(e["message"] for e in trace["errors"])
    assert "upstream 400" in message and "script exhausted" in message  # the server's words
    assert not any(trace["rewards"].values())  # nothing scored


# ----- verifiers' eval against a real vf-serve, streaming -----
def _messages(trace: dict) -> list[dict]:
    """A single-branch trace's messages, in order (its last one is the streamed reply)."""
    return [node["message"] for node in trace["nodes"]]


@slow
async def test_verifiers_eval_streams_from_vf_serve_and_vfkit_scores_the_replies(
        v1_python: str, tiny_model_path: Path, tmp_path: Path) -> None:
    """verifiers' eval relays a streamed harness call to a real `vf-serve` (tiny random model).

    Only a harness that streams makes verifiers' eval client stream (vfkit's does not; see
    `bridge_v1/streaming_chat.py`). The proxy shows vf-serve answered each call as SSE; each
    trace's reward is vfkit's rubric on the trace's reply, and vf-serve gives the same reply,
    token for token, to the same request not streamed (greedy).
    """
    args, sampling = {"num_eval_examples": 3}, {"temperature": 0, "max_tokens": 12}
    with start_server(str(tiny_model_path), dtype="float32", log_path=tmp_path / "serve.log"
                      ) as server, RecordingProxy(server.base_url) as proxy:
        _run([v1_python, "-c", EVAL_CLI, "vfkit-reverse-text", "-m", str(tiny_model_path),
              "-n", "3", "-r", "1", "--no-push", "-o", str(tmp_path / "out"),
              "--env.taskset.split", "eval", "--env.taskset.args", json.dumps(args),
              "--env.agent.harness.id", "streaming_chat", "--client.base-url", proxy.base_url,
              "--sampling.temperature", "0", "--sampling.max-tokens", "12"],
             "verifiers' vf-eval", timeout=300, env=_with_helpers())
        traces = [t for line in next(tmp_path.rglob("traces.jsonl")).open()
                  for t in json.loads(line)["traces"]]
        assert len(traces) == 3 and all(t["ok"] for t in traces)
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client:
            for trace in traces:
                *messages, reply = _messages(trace)
                streamed = await client.chat.completions.create(
                    model=str(tiny_model_path), messages=messages, stream=True,
                    extra_body={"return_token_ids": True}, **sampling)
                ids = [t async for chunk in streamed for c in chunk.choices
                       for t in (getattr(c, "token_ids", None) or [])]
                whole = await client.chat.completions.create(
                    model=str(tiny_model_path), messages=messages,
                    extra_body={"return_token_ids": True}, **sampling)
                assert ids == whole.choices[0].token_ids and ids  # same tokens, not none
                assert whole.choices[0].message.content == reply["content"]
    chat = [c for c in proxy.calls if c.path.endswith("/chat/completions")]
    assert len(chat) == 3  # one model call per task, each streamed and answered as SSE
    assert all(c.stream and c.content_type.startswith("text/event-stream") for c in chat)
    env = vf.load_environment("reverse-text", **args)
    for trace in traces:
        state = env.init_state(dict(trace["task"]["data"]["row"]))
        state["completion"] = _messages(trace)[-1:]
        await env.rubric.score_rollout(state)
        total = sum(r["score"] * r["weight"] for r in trace["rewards"].values())
        assert set(trace["rewards"]) == {"reversal_reward", "format_reward_func"}
        assert total == pytest.approx(state["reward"])


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


def _orchestrate(v1_python: str, tmp_path: Path, env_id: str, model, env_args: dict):
    tokenizer = make_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    with TestServer(model) as server:
        _run([v1_python, str(ORCHESTRATOR), f"vfkit-{env_id}", server.base_url,
              str(tmp_path / "tokenizer"), str(tmp_path / "samples.json"), json.dumps(env_args)],
             "the orchestrator", timeout=600)
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
        _run([v1_python, str(ORCHESTRATOR), "vfkit-reverse-text", proxy.base_url,
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
