"""EnvGroup: concatenated datasets tagged by task, routed rollouts, zero-filled metrics."""

from __future__ import annotations

import pytest

from vfkit.envs.env_group import EnvGroup
from vfkit.envs.singleturn_env import SingleTurnEnv
from vfkit.envs.tool_env import ToolEnv
from vfkit.errors import ConfigError
from vfkit.rubrics.rubric import Rubric
from vfkit.testing.scripted_server import TestServer


def exact(completion, answer) -> float:
    return float(completion[-1]["content"] == answer)


def short(completion) -> float:
    return float(len(completion[-1]["content"] or "") < 5)


def double(x: int) -> int:
    """Double a number."""
    return 2 * x


def make_group() -> EnvGroup:
    math = SingleTurnEnv(
        dataset=[{"question": "1+1", "answer": "2"}, {"question": "2+2", "answer": "4"}],
        system_prompt="math", rubric=Rubric(funcs=[exact]), sampling_args={"temperature": 0.1},
    )
    tools = ToolEnv(
        tools=[double], dataset=[{"question": "double 3", "answer": "6", "info": {"k": 1}}],
        system_prompt="tools", rubric=Rubric(funcs=[short]), max_turns=3,
    )
    return EnvGroup([math, tools], env_names=["math", "tools"])


def reply(body: dict) -> str:
    """Answer by the system prompt of the request: it tells which environment sent it."""
    system = body["messages"][0]["content"]
    if system.startswith("math"):
        return str(eval(body["messages"][-1]["content"]))  # "1+1" -> "2"
    if body["messages"][-1]["role"] == "tool":
        return "six"
    return '<tool_call>{"name": "double", "arguments": {"x": 3}}</tool_call>'


def test_dataset_is_concatenated_with_task_names():
    group = make_group()
    rows = group.get_dataset().to_list()
    assert [r["task"] for r in rows] == ["math", "math", "tools"]
    assert [r["example_id"] for r in rows] == [0, 1, 2]
    assert rows[2]["prompt"][0] == {"role": "system", "content": "tools"}
    assert len(group.get_eval_dataset()) == 3


async def test_rollouts_are_routed_and_metrics_zero_filled():
    group = make_group()
    with TestServer(reply) as srv:
        out = await group.generate(group.get_dataset(), srv.client(), "m", rollouts_per_example=2)
    assert out.task == ["math"] * 4 + ["tools"] * 2
    assert out.reward == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    for state in out.states:
        assert {"exact", "short"} <= set(state["metrics"])
    assert out.metrics["short"][:4] == [0.0] * 4 and out.metrics["exact"][4:] == [0.0, 0.0]
    tool_state = out.states[4]
    assert [m["role"] for m in tool_state["completion"]] == ["assistant", "tool", "assistant"]
    assert tool_state["completion"][1]["content"] == "6" and tool_state["info"]["k"] == 1
    # each sub-environment's own defaults apply: only math sends its temperature, tools send tools
    math_reqs = [r for r in srv.requests if r["messages"][0]["content"] == "math"]
    tool_reqs = [r for r in srv.requests if r["messages"][0]["content"] != "math"]
    assert all(r["temperature"] == 0.1 and "tools" not in r for r in math_reqs)
    assert all("temperature" not in r and r["tools"] for r in tool_reqs)


def test_set_max_seq_len_reaches_every_environment():
    group = make_group()
    group.set_max_seq_len(123)
    assert [e.max_seq_len for e in group.envs] == [123, 123]


async def test_unknown_task_is_a_rollout_error():
    group = make_group()
    with TestServer("x") as srv:
        state = await group.run_rollout({"prompt": [{"role": "user", "content": "?"}],
                                         "task": "chess"}, srv.client(), "m")
    assert "no environment named 'chess'" in state["error"]


def test_bad_groups_are_rejected():
    env = SingleTurnEnv(dataset=[{"question": "q"}])
    with pytest.raises(ConfigError, match="unique name"):
        EnvGroup([env, env], env_names=["a", "a"])
    completion = SingleTurnEnv(dataset=[{"question": "q"}], message_type="completion")
    with pytest.raises(ConfigError, match="mix message types"):
        EnvGroup([env, completion], env_names=["a", "b"])


@pytest.mark.parametrize(("column", "first", "second", "shown"), [
    ("answer", "A", 3, "row 0 (environment 'a') has 'A' (str), row 2 (environment 'b') has 3 "
                       "(int)"),
    ("info", {"k": "s"}, {"k": [1]}, "row 0 (environment 'a') has {'k': 's'} (dict), row 2 "
                                     "(environment 'b') has {'k': [1]} (dict)"),
])
def test_columns_of_different_types_name_the_column_and_the_environments(
    column, first, second, shown
):
    a = SingleTurnEnv(dataset=[{"question": "qa", column: first}, {"question": "qa2"}])
    b = SingleTurnEnv(dataset=[{"question": "qb", column: second}])
    with pytest.raises(ConfigError) as caught:
        EnvGroup([a, b], env_names=["a", "b"])
    assert str(caught.value) == (
        f"dataset column {column!r} mixes types that Arrow cannot store in one column: {shown}; "
        "give the column one type in every row (e.g. str(...) each value; for dicts such as "
        "info, the same value type under each key)"
    )


def test_the_group_rubric_lists_one_function_and_weight_per_name():
    def a(completion) -> float:
        return 1.0

    one = SingleTurnEnv(dataset=[{"question": "q"}], rubric=Rubric(funcs=[a, exact],
                                                                   weights=[2.0, 1.0]))
    two = SingleTurnEnv(dataset=[{"question": "q"}], rubric=Rubric(funcs=[short, exact],
                                                                   weights=[0.0, 3.0]))
    rubric = EnvGroup([one, two], env_names=["one", "two"]).rubric
    assert rubric.get_reward_func_names() == ["a", "exact", "short"]
    assert rubric.get_reward_funcs() == [a, exact, short]
    assert rubric.get_reward_weights() == [2.0, 1.0, 0.0]  # 'exact': the first environment's
