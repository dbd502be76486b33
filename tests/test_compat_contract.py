"""The 2026-02 classic contract (prime-rl / verifiers of early 2026) on plain vfkit environments.

Those callers hand `run_group` / `generate` a `ClientConfig` instead of an AsyncOpenAI, ask for
`state_columns`, read `output["sampling_args"]`, and call `rubric._get_reward_func_names()` and
`env._get_eval_inputs(...)`. The config class below has verifiers' field names and defaults
(vfkit does not depend on verifiers); rollouts talk HTTP to the scripted TestServer.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

import vfkit as vf
from vfkit.errors import ConfigError
from vfkit.testing.scripted_server import TestServer


class ClientConfig(BaseModel):
    """verifiers.types.ClientConfig's fields (early 2026)."""

    client_idx: int = 0
    client_type: str = "openai_chat_completions"
    api_key_var: str = "PRIME_API_KEY"
    api_base_url: str = "https://api.pinference.ai/api/v1"
    endpoint_configs: list[dict] = Field(default_factory=list)
    timeout: float = 3600.0
    max_retries: int = 10
    extra_headers: dict[str, str] = Field(default_factory=dict)


def exact(completion, answer) -> float:
    return float(completion[-1]["content"] == answer)


def make_env() -> vf.Environment:
    rows = [{"question": f"q{i}", "answer": "yes"} for i in range(3)]
    return vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric(funcs=[exact]))


async def test_run_group_builds_the_client_from_a_client_config(monkeypatch) -> None:
    monkeypatch.setenv("MY_KEY", "secret")
    env = make_env()
    with TestServer(["yes", "no"], api_key="secret") as srv:
        config = ClientConfig(api_base_url=srv.base_url, api_key_var="MY_KEY", max_retries=0)
        states = await env.run_group([env.get_dataset()[0]] * 2, config, "m",
                                     {"temperature": 0.7, "max_tokens": 8},
                                     state_columns=["sampling_args", "trajectory", "custom"])
    assert [s["error"] for s in states] == [None, None]  # the key came from api_key_var
    assert sorted(s["reward"] for s in states) == [0.0, 1.0]
    for s in states:
        assert s["sampling_args"]["temperature"] == 0.7  # prime-rl reads this
        assert "custom" in s and s["custom"] is None  # every requested column is present
        assert s["trajectory"][0]["tokens"]["completion_ids"]


async def test_endpoint_configs_pick_the_endpoint_by_client_idx() -> None:
    env = make_env()
    with TestServer("yes") as first, TestServer("no") as second:
        config = ClientConfig(client_idx=1, max_retries=0, endpoint_configs=[
            {"api_base_url": first.base_url}, {"api_base_url": second.base_url}])
        out = await env.generate([env.get_dataset()[0]], config, "m", {"max_tokens": 8})
        assert len(second.requests) == 1 and not first.requests
    assert out.reward == [0.0]
    assert out.states[0]["sampling_args"]["max_tokens"] == 8  # in every output


async def test_an_unknown_client_type_is_refused_by_name() -> None:
    env = make_env()
    config = ClientConfig(api_base_url="http://127.0.0.1:9/v1", client_type="anthropic")
    with pytest.raises(ConfigError, match="client_type 'anthropic'"):
        await env.run_group([env.get_dataset()[0]], config, "m")


def test_underscore_names_of_the_2026_contract() -> None:
    env = make_env()
    assert env.rubric._get_reward_func_names() == ["exact"]
    assert env.rubric._get_reward_weights() == [1.0]
    inputs = env._get_eval_inputs(num_examples=2, rollouts_per_example=3)
    # the whole list repeated (as Dataset.repeat): q0 q1 q0 q1 q0 q1
    assert [row["question"] for row in inputs] == ["q0", "q1"] * 3
    group = vf.RubricGroup([vf.Rubric(funcs=[exact])])
    assert group._get_reward_func_names() == ["exact"]


async def test_env_server_mode_is_refused_by_name() -> None:
    env = make_env()
    with pytest.raises(ConfigError, match="env_client"):
        await env.run_group([env.get_dataset()[0]], ClientConfig(), "m", env_client=object())
