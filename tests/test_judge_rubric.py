"""JudgeRubric against a real OpenAI-compatible server on loopback (vfkit's TestServer)."""

from __future__ import annotations

import doctest
import re

import pytest
from openai import AsyncOpenAI

import vfkit.rubrics.judge_rubric as judge_module
from vfkit.parsers.xml_parser import XMLParser
from vfkit.rubrics.judge_rubric import DEFAULT_JUDGE_PROMPT, JudgeRubric
from vfkit.rubrics.rubric import ERRORS_METRIC
from vfkit.testing.scripted_server import TestServer

TEMPLATE = "Q: {question}\nREF: {answer}\nGOT: {response}\nCorrect?"


def grade(request: dict) -> str:
    """A judge that says yes when the response equals the reference answer."""
    match = re.search(r"REF: (.*)\nGOT: (.*)\n", request["messages"][-1]["content"])
    if match is None:
        return "unsure"
    return "yes" if match.group(1) == match.group(2) else "no"


async def judged_correct(judge, prompt, completion, answer, state) -> float:
    verdict = await judge(prompt, completion, answer, state)
    return 1.0 if verdict.strip().lower().startswith("yes") else 0.0


def rollout(answer_text: str, reference: str = "4") -> dict:
    return {
        "prompt": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "2+2?"},
        ],
        "completion": [{"role": "assistant", "content": f"<answer>{answer_text}</answer>"}],
        "answer": reference,
        "error": None,
    }


@pytest.fixture
def server():
    with TestServer(grade) as srv:
        yield srv


@pytest.fixture
def client(server):
    return AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)


async def test_judge_verdicts_become_rewards(server, client):
    rubric = JudgeRubric(
        judge_client=client,
        judge_model="judge-model",
        judge_prompt=TEMPLATE,
        judge_sampling_args={"max_tokens": 8, "temperature": 0.0},
        parser=XMLParser(["answer"]),
        funcs=[judged_correct],
    )
    states = [rollout("4"), rollout("5")]
    await rubric.score_group(states)
    assert [s["reward"] for s in states] == [1.0, 0.0]
    assert [s["judge_response"] for s in states] == [
        {"Q: 2+2?\nREF: 4\nGOT: 4\nCorrect?": "yes"},
        {"Q: 2+2?\nREF: 4\nGOT: 5\nCorrect?": "no"},
    ]
    bodies = sorted(server.requests, key=lambda b: b["messages"][0]["content"])
    assert [b["messages"][0]["content"] for b in bodies] == [
        "Q: 2+2?\nREF: 4\nGOT: 4\nCorrect?",  # the parser's answer, not the raw XML
        "Q: 2+2?\nREF: 4\nGOT: 5\nCorrect?",
    ]
    assert all(b["model"] == "judge-model" and b["max_tokens"] == 8 for b in bodies)


async def test_judge_is_asked_once_per_rollout(server, client):
    rubric = JudgeRubric(judge_client=client, judge_prompt=TEMPLATE, parser=XMLParser(["answer"]))
    state = rollout("4")
    args = (state["prompt"], state["completion"], state["answer"], state)
    assert await rubric.judge(*args) == "yes"
    assert await rubric.judge(*args) == "yes"
    assert len(server.requests) == 1
    assert await rubric.judge(*args[:3]) == "yes"  # no state: no cache
    assert len(server.requests) == 2


async def test_completion_mode_and_default_prompt(server, client):
    rubric = JudgeRubric(judge_client=client)  # default template and parser
    assert await rubric.judge("What is 2+2?", "four", "4") == "unsure"
    sent = server.requests[-1]["messages"][0]["content"]
    assert sent == DEFAULT_JUDGE_PROMPT.format(question="What is 2+2?", answer="4", response="four")
    assert server.requests[-1]["model"] == "gpt-4.1-nano"


async def test_a_failing_judge_scores_zero_and_is_recorded(server, client):
    server.fail_next(500)
    rubric = JudgeRubric(judge_client=client, judge_prompt=TEMPLATE, funcs=[judged_correct])
    state = rollout("4")
    await rubric.score_rollout(state)
    assert state["reward"] == 0.0
    assert state["metrics"][ERRORS_METRIC] == 1.0
    assert state["error"].startswith("reward function judged_correct raised InternalServerError")


async def test_missing_openai_key_is_recorded_not_raised(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    rubric = JudgeRubric(funcs=[judged_correct])
    state = rollout("4")
    await rubric.score_rollout(state)
    assert "OpenAIError" in state["error"] and "api_key" in state["error"]


def test_bad_template_raises_at_construction():
    with pytest.raises(ValueError, match="judge_prompt is not a valid template"):
        JudgeRubric(judge_client=None, judge_prompt='Return JSON {"ok": true} for {response}')


def test_docstring_examples_run():
    assert doctest.testmod(judge_module).failed == 0


async def test_a_sync_openai_judge_client_is_asked_off_the_event_loop(server):
    """Classic environments (verifiers' simpleqa) pass a sync OpenAI client; awaiting its
    create() failed every judged reward with "object ChatCompletion can't be used in 'await'"."""
    from openai import OpenAI

    rubric = JudgeRubric(judge_client=OpenAI(base_url=server.base_url, api_key="x"),
                         judge_prompt=TEMPLATE, parser=XMLParser(["answer"]),
                         funcs=[judged_correct])
    states = [rollout("4"), rollout("5")]
    await rubric.score_group(states)
    assert [s["reward"] for s in states] == [1.0, 0.0] and not any(s["error"] for s in states)
