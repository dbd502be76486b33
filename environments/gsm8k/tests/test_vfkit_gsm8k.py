"""gsm8k: the hub loading path, the offline fallback, and MathRubric scoring via the test server."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import datasets
import pytest
from openai import AsyncOpenAI

import vfkit as vf
from vfkit.errors import VfkitError
from vfkit.testing.scripted_server import TestServer

ENV_DIR = str(Path(__file__).resolve().parents[1])
if ENV_DIR not in sys.path:  # importable from a checkout, installed or not
    sys.path.insert(0, ENV_DIR)

import vfkit_gsm8k as gsm8k  # noqa: E402  # after the path line above


def test_offline_falls_back_to_the_shipped_sample_and_says_so(monkeypatch, caplog) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # load_dataset fails at once without a cache
    with caplog.at_level(logging.WARNING, logger="vfkit_gsm8k"):
        env = vf.load_environment("gsm8k")
    assert "using the offline sample" in caplog.text
    assert len(env.get_dataset()) == 40 and len(env.get_eval_dataset()) == 20
    row = env.get_eval_dataset()[0]
    assert row["info"]["source"] == "sample"
    assert row["answer"] == gsm8k.final_answer(row["info"]["solution"])
    assert not set(env.get_dataset()["question"]) & set(env.get_eval_dataset()["question"])


def test_sample_answers_match_their_worked_solutions() -> None:
    for split in ("train", "test"):
        for r in gsm8k.load_sample(split):
            worked = r["answer"].split("####")[0]
            assert gsm8k.extract_final_answer(worked) == gsm8k.final_answer(r["answer"])


def test_hub_path_uses_datasets_load_dataset(monkeypatch) -> None:
    calls = []

    def fake_load_dataset(path, name, split):  # stands in for the network only
        calls.append((path, name, split))
        return [{"question": f"{split} q", "answer": "Work.\n#### 1,234"}]

    monkeypatch.setattr(gsm8k, "hub_reachable", lambda timeout=3.0: True)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    env = vf.load_environment("gsm8k", source="hub")
    assert calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]
    row = env.get_eval_dataset()[0]
    assert (row["question"], row["answer"], row["info"]["source"]) == ("test q", "1234", "hub")


def test_source_hub_without_network_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(VfkitError, match="source='sample'"):
        vf.load_environment("gsm8k", source="hub")
    with pytest.raises(VfkitError, match="source must be"):
        vf.load_environment("gsm8k", source="web")


@pytest.mark.parametrize(("text", "expected"), [
    ("so the answer is \\boxed{28}.", "28"), ("It costs 1,250 dollars", "1250"),
    ("first 3 then 7", "7"), ("no idea", ""), ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
])
def test_final_answer_extraction(text: str, expected: str) -> None:
    assert gsm8k.extract_final_answer(text) == expected


async def _score(reply: str) -> dict:
    env = vf.load_environment("gsm8k", source="sample", num_eval_examples=1)
    row = env.get_eval_dataset()[0]
    assert row["answer"] == "28"  # Omar: 5 notebooks at $5 + 3 pens at $1
    with TestServer([reply]) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client:
            state = await env.run_rollout(row, client, "m")
    assert server.requests[0]["max_tokens"] == 256
    return state


@pytest.mark.parametrize("reply", ["5 * 5 = 25, 25 + 3 = 28. \\boxed{28}", "The total is 28.0",
                                   "\\boxed{28.0}"])
async def test_right_answers(reply: str) -> None:
    state = await _score(reply)
    assert state["error"] is None
    assert state["reward"] == 1.0


@pytest.mark.parametrize("reply", ["\\boxed{25}", "The answer is 30", "I am not sure.", "",
                                   "\\boxed{28"])
async def test_wrong_and_malformed_answers(reply: str) -> None:
    state = await _score(reply)
    assert state["error"] is None
    assert state["reward"] == 0.0
