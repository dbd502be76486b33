"""vfkit environments under verifiers v1's own eval, through `vfkit.bridge` (issue 14).

Against vfkit's scripted OpenAI/vLLM-compatible test server on loopback, or a real `vf-serve`
where said, in the verifiers venv of `bridge_v1/support.py`:

- verifiers' own `vf-eval` runs `vfkit-reverse-text` and `vfkit-calculator`; every trace's
  rewards equal what vfkit computes for the same reply;
- a harness that knows nothing of vfkit is scored from its trace (text, tool calls, images);
  a failed rollout fails its trace;
- the same against a real `vf-serve` subprocess (tiny random model), streaming: a harness that
  streams makes verifiers' eval client stream (vfkit's harness does not stream), a recording
  proxy shows vf-serve answered as SSE, and streamed and plain replies have the same token ids.

vfkit itself never imports verifiers. The venv installs vfkit with `--no-deps`: the SDK needs
nothing verifiers does not bring besides `datasets`, and the trainer's torch is not needed here.
Today's prime-rl: `test_bridge_prime_rl.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bridge_v1.recording_proxy import RecordingProxy
from bridge_v1.support import (
    EVAL_CLI,
    calculator_model,
    reverse_model,
    run,
    slow,
    vfkit_states,
    with_helpers,
)
from openai import AsyncOpenAI

import vfkit as vf
from vfkit.serve.launcher import start_server
from vfkit.testing.scripted_server import TestServer


# ----- verifiers' own eval -----
@slow
@pytest.mark.parametrize(("env_id", "model", "n"), [
    ("reverse-text", reverse_model, 8), ("calculator", calculator_model, 3),
], ids=["single-turn", "tools"])
async def test_verifiers_eval_scores_a_vfkit_environment_as_vfkit_does(
        v1_python: str, local_envs: None, tmp_path: Path, env_id: str, model, n: int) -> None:
    args = {"num_eval_examples": n}
    with TestServer(model) as server:
        run([v1_python, "-c", EVAL_CLI, f"vfkit-{env_id}", "-m", "tiny", "-n", str(n), "-r", "1",
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
        run([v1_python, "-c", EVAL_CLI, "vfkit-reverse-text", "-m", "tiny", "-n", "4", "-r", "1",
              "--no-push", "-o", str(tmp_path / "out"), "--env.taskset.split", "eval",
              "--env.taskset.args", json.dumps(args), "--env.agent.harness.id", "plain_chat",
              "--client.base-url", server.base_url],
             "verifiers' vf-eval", timeout=600, env=with_helpers())
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
    out = json.loads(run([v1_python, "-c", FOREIGN_TOOL_EPISODE], "the foreign trace"))
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
        run([v1_python, "-c", EVAL_CLI, "vfkit-reverse-text", "-m", "tiny", "-n", "1", "-r", "1",
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
        run([v1_python, "-c", EVAL_CLI, "vfkit-reverse-text", "-m", str(tiny_model_path),
              "-n", "3", "-r", "1", "--no-push", "-o", str(tmp_path / "out"),
              "--env.taskset.split", "eval", "--env.taskset.args", json.dumps(args),
              "--env.agent.harness.id", "streaming_chat", "--client.base-url", proxy.base_url,
              "--sampling.temperature", "0", "--sampling.max-tokens", "12"],
             "verifiers' vf-eval", timeout=300, env=with_helpers())
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


@slow
def test_an_env_group_s_scores_are_recorded_with_their_weights(v1_python: str) -> None:
    """record_scores asks the rubric for its weights: EnvGroup's router had none."""
    code = (
        "import vfkit as vf\n"
        "from vfkit.bridge.v1 import record_scores\n"
        "def a(completion): return 1.0\n"
        "def b(completion): return 0.5\n"
        "rows = [{'question': 'q', 'answer': 'x'}]\n"
        "one = vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric(funcs=[a], weights=[2.0]))\n"
        "two = vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric(funcs=[b], weights=[0.0]))\n"
        "group = vf.EnvGroup([one, two], env_names=['one', 'two'])\n"
        "class Trace:\n"
        "    def record_reward(self, *args): print('reward', *args)\n"
        "    def record_metric(self, *args): print('metric', *args)\n"
        "metrics = {'a': 1.0, 'b': 0.5, 'reward_errors': 0.0}\n"
        "record_scores(Trace(), group, {'metrics': metrics, 'reward': 2.0})\n"
        "print('--')\n"
        "same = vf.RubricGroup([vf.Rubric(funcs=[a], weights=[1.0]),\n"
        "                       vf.Rubric(funcs=[a], weights=[0.0])])\n"
        "record_scores(Trace(), vf.SingleTurnEnv(dataset=rows, rubric=same),\n"
        "              {'metrics': {'a': 1.0, 'reward_errors': 0.0}, 'reward': 1.0})\n"
    )
    out = run([v1_python, "-c", code], "recording an EnvGroup's scores", timeout=300)
    group_lines, same_lines = out.split("--\n")
    assert group_lines.splitlines() == ["reward a 1.0 2.0", "metric b 0.5"]  # b weighs 0
    # two functions named `a` (weights 1 and 0) share one metric: vfkit's reward is recorded
    # (it was 'metric a 1.0' alone: trace reward 0 where vfkit's was 1)
    assert same_lines.splitlines() == ["reward reward 1.0 1.0", "metric a 1.0"]
