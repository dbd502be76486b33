"""SingleTurnEnv: one model call per rollout, chat and completion mode, over real HTTP."""

from __future__ import annotations

from vfkit.envs.singleturn_env import SingleTurnEnv
from vfkit.rubrics.rubric import Rubric
from vfkit.testing.scripted_server import TestServer
from vfkit.testing.tiny_model import make_tokenizer

ROWS = [{"question": "2+2", "answer": "4"}, {"question": "3+3", "answer": "6"}]


def says_answer(completion, answer) -> float:
    text = completion if isinstance(completion, str) else completion[-1]["content"]
    return float(text.strip() == answer)


def reply_sum(body: dict) -> str:
    """Answer the arithmetic question in the request (chat or completion)."""
    text = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
    a, b = text.rsplit("\n", 1)[-1].split("+")
    return str(int(a) + int(b))


async def test_chat_rollout_state_and_tokens():
    env = SingleTurnEnv(dataset=ROWS, system_prompt="Add.", rubric=Rubric(funcs=[says_answer]))
    tok = make_tokenizer()
    with TestServer(reply_sum) as srv:
        state = await env.run_rollout(env.get_dataset()[1], srv.client(), "m", {"max_tokens": 8})
    assert state["prompt"] == [{"role": "system", "content": "Add."},
                               {"role": "user", "content": "3+3"}]
    assert state["completion"] == [{"role": "assistant", "content": "6"}]
    assert state["reward"] == 1.0 and state["metrics"]["says_answer"] == 1.0
    assert state["example_id"] == 1 and state["task"] == "default" and state["answer"] == "6"
    assert state["stop_condition"] == "max_turns_reached" and state["error"] is None
    assert state["turn"] == 1 and len(state["trajectory"]) == 1 and len(state["responses"]) == 1
    tokens = state["trajectory"][0]["tokens"]
    assert tokens["completion_ids"] == [*tok.encode("6"), tok.eos_token_id]
    assert tokens["completion_logprobs"] == [-0.5, -0.5]
    rendered = tok.apply_chat_template(state["prompt"], tokenize=False, add_generation_prompt=True)
    assert tokens["prompt_ids"] == tok.encode(rendered, add_special_tokens=False)
    assert state["timing"]["total_ms"] >= state["timing"]["generation_ms"] > 0


async def test_sampling_args_reach_the_server():
    env = SingleTurnEnv(dataset=ROWS, sampling_args={"temperature": 0.3, "top_k": 7})
    with TestServer("4") as srv:
        await env.run_rollout(env.get_dataset()[0], srv.client(), "policy",
                              {"max_tokens": 5, "extra_body": {"min_p": 0.05}})
    body = srv.requests[0]
    assert body["model"] == "policy" and body["temperature"] == 0.3 and body["max_tokens"] == 5
    assert body["top_k"] == 7 and body["min_p"] == 0.05
    assert body["logprobs"] is True and body["return_token_ids"] is True


async def test_completion_mode_uses_text_prompts():
    env = SingleTurnEnv(dataset=ROWS, message_type="completion", system_prompt="Add:",
                        rubric=Rubric(funcs=[says_answer]))
    assert env.get_dataset()[0]["prompt"] == "Add:\n\n2+2"
    with TestServer(reply_sum) as srv:
        out = await env.generate(env.get_dataset(), srv.client(), "m", {"max_tokens": 4})
    assert out.completion == ["4", "6"] and out.reward == [1.0, 1.0]
    assert "prompt" in srv.requests[0] and "messages" not in srv.requests[0]
    tokens = out.states[0]["trajectory"][0]["tokens"]
    assert tokens["prompt_ids"] == make_tokenizer().encode("Add:\n\n2+2")
    assert out.states[0]["trajectory"][0]["completion"] == "4"


async def test_max_tokens_cut_marks_truncated():
    env = SingleTurnEnv(dataset=ROWS)
    with TestServer("a long answer") as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m", {"max_tokens": 3})
    assert state["is_truncated"] and state["stop_condition"] == "max_tokens_reached"
    assert state["completion"][0]["content"] == "a l"
    assert state["trajectory"][0]["tokens"]["is_truncated"]
