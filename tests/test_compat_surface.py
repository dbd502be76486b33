"""vfkit.compat.verifiers: the classic 0.1.x API list of issue 14, against the scripted server."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path

import pytest
from openai import OpenAI
from test_eval_cli import read_rows

import vfkit
import vfkit.compat.verifiers as vf
from vfkit.compat import classic_verifiers
from vfkit.errors import ConfigError
from vfkit.testing.scripted_server import Reply, TestServer


def exact(completion, answer) -> float:
    return float(completion[-1]["content"] == answer)


def qa_env(n: int = 2, **kwargs) -> vf.SingleTurnEnv:
    rows = [{"question": f"q{i}", "answer": "yes"} for i in range(n)]
    return vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric(funcs=[exact]), **kwargs)


def test_classic_names_map_onto_vfkit_classes() -> None:
    assert issubclass(vf.SingleTurnEnv, vfkit.SingleTurnEnv)
    assert issubclass(vf.SingleTurnEnv, vf.MultiTurnEnv)
    assert issubclass(vf.ToolEnv, vfkit.ToolEnv) and vf.XMLParser is vfkit.XMLParser
    assert callable(vf.extract_boxed_answer) and vf.RewardFunc is not None
    with classic_verifiers():
        from verifiers.types import Messages, State  # noqa: F401
        from verifiers.utils.data_utils import extract_boxed_answer, extract_hash_answer

        assert extract_boxed_answer(r"so \boxed{12}") == "12"
        assert extract_hash_answer("3 + 4 = 7\n#### 7") == "7"
    assert "verifiers" not in sys.modules  # the alias lives only inside the block


def test_names_vfkit_does_not_provide_say_what_to_use() -> None:
    with pytest.raises(AttributeError, match="vf-train"):
        _ = vf.RLTrainer
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = vf.Nope


def test_a_real_verifiers_is_never_shadowed(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "verifiers").mkdir()
    (tmp_path / "verifiers" / "__init__.py").write_text(
        "MARK = 'real'\nclass Env:\n    env_id = None\n")
    (tmp_path / "uses_real_vf.py").write_text(
        "import verifiers as vf\ndef load_environment():\n    return vf.Env()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with classic_verifiers():
            import verifiers

            assert verifiers.MARK == "real"
        with pytest.raises(ConfigError, match="installed verifiers package"):
            vfkit.load_environment("uses-real-vf")
    finally:
        for name in ("verifiers", "uses_real_vf"):
            sys.modules.pop(name, None)


def test_evaluate_sync_with_a_sync_client_and_dict_access() -> None:
    env = qa_env()
    with TestServer(["yes", "no", "yes", "yes"]) as srv:
        results = env.evaluate_sync(OpenAI(base_url=srv.base_url, api_key="x"), "m",
                                    {"max_tokens": 8}, num_examples=2, rollouts_per_example=2,
                                    max_concurrent=1)
    assert sorted(results["reward"]) == [0.0, 1.0, 1.0, 1.0]
    assert results["reward"] == results.reward and len(results["state"]) == 4
    assert results["metadata"]["avg_reward"] == pytest.approx(0.75)  # 3 of 4 said "yes"
    assert results["metrics"]["exact"] == results.reward
    assert "reward" in results and results.get("nope", 1) == 1


def test_async_evaluate_and_generate_sync_group_by_example_id() -> None:
    env = qa_env()
    with TestServer(["yes", "no", "no", "no"]) as srv:
        out = asyncio.run(env.evaluate(srv.client(), "m", {"max_tokens": 8}, num_examples=1,
                                       rollouts_per_example=2, max_concurrent_generation=1))
        inputs = env.get_eval_inputs(num_examples=2, rollouts_per_example=1)
        grouped = env.generate_sync(inputs + inputs, srv.client(), model="m",
                                    sampling_args={"max_tokens": 8})
    assert out.reward == [1.0, 0.0]
    assert [s["advantage"] for s in out.states] == [0.5, -0.5]  # group of 2: mean 0.5
    # classic 0.1.8: repeated rows form one group per example_id, both "no": advantage 0
    assert sorted(s["example_id"] for s in grouped.states) == [0, 0, 1, 1]
    assert [s["advantage"] for s in grouped.states] == [0.0] * 4


def test_max_concurrent_generation_bounds_the_requests_in_flight() -> None:
    env = qa_env(n=1)
    with TestServer("yes") as srv:
        srv.delay_next(0.3, n=4)
        start = time.monotonic()
        env.evaluate_sync(srv.client(), "m", {"max_tokens": 8}, rollouts_per_example=4,
                          max_concurrent=-1, max_concurrent_generation=1)
        elapsed = time.monotonic() - start
    assert elapsed >= 4 * 0.3  # one at a time (unbounded: all four within ~0.3 s)


def test_save_results_results_path_save_every_and_state_columns(tmp_path: Path) -> None:
    env = qa_env()
    with TestServer("yes") as srv:
        out = env.evaluate_sync(srv.client(), "m", {"max_tokens": 8}, num_examples=2,
                                rollouts_per_example=2, save_results=True,
                                results_path=tmp_path / "run", save_every=1,
                                state_columns=["turn"])
    rows = read_rows(tmp_path / "run")
    assert len(rows) == 4 and all(r["turn"] == 1 and r["reward"] == 1.0 for r in rows)
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert meta["avg_reward"] == 1.0 and meta["rollouts_per_example"] == 2
    dataset = env.make_dataset(out, state_columns=["turn"])
    assert dataset.column_names[:3] == ["example_id", "rollout_idx", "prompt"]
    assert dataset["reward"] == [1.0] * 4 and dataset["turn"] == [1] * 4


class Answered(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": "again"}], state

    @vf.stop
    async def answered(self, state) -> bool:
        return state["turn"] >= 2

    @vf.stop(priority=5)
    async def early(self, state) -> bool:
        return False


def test_multiturn_defaults_and_classic_stop_order() -> None:
    env = Answered(dataset=[{"question": "q", "answer": "a"}])
    assert env.max_turns == -1  # classic: no limit unless given (vfkit's own default is 10)
    # classic: higher priority first, then by name; no stop at a cut-off reply
    assert [name for name, _ in env.stop_conditions] == [
        "has_final_env_response", "early", "answered", "max_turns_reached", "prompt_too_long"]
    with TestServer("x") as srv:
        state = env.evaluate_sync(srv.client(), "m", {"max_tokens": 8}).states[0]
    assert state["turn"] == 2 and state["stop_condition"] == "answered"


def tool_schema(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def test_oai_tools_are_sent_and_a_rows_info_tools_win() -> None:
    rows = [{"question": "q0", "answer": "yes", "info": {"oai_tools": None}},
            {"question": "q1", "answer": "yes", "info": {"oai_tools": [tool_schema("own")]}}]
    env = vf.SingleTurnEnv(dataset=rows, oai_tools=[tool_schema("shared")])
    with TestServer("yes") as srv:
        env.evaluate_sync(srv.client(), "m", {"max_tokens": 8}, max_concurrent=1)
        sent = {r["messages"][-1]["content"]: [t["function"]["name"] for t in r["tools"]]
                for r in srv.requests}
    assert sent == {"q0": ["shared"], "q1": ["own"]}


def test_arguments_with_no_vfkit_effect_are_named_in_a_warning(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="vfkit.compat"):
        env = qa_env(max_workers=4, map_kwargs={"num_proc": 2})
    assert "max_workers=4 has no effect" in caplog.text and "map_kwargs" in caplog.text
    assert not hasattr(env, "max_workers")


def test_tool_env_error_formatter() -> None:
    def add(a: int, b: int) -> int:
        """Add.

        Args:
            a: first.
            b: second.
        """
        return a + b

    env = vf.ToolEnv(tools=[add], dataset=[{"question": "q", "answer": "3"}],
                     error_formatter=lambda e: f"tool error: {type(e).__name__}")
    calls = [{"name": "add", "arguments": {"a": 1}}]
    with TestServer([Reply(tool_calls=calls), "done"]) as srv:
        state = env.evaluate_sync(srv.client(), "m", {"max_tokens": 200}).states[0]
    assert state["completion"][1] == {"role": "tool", "content": "tool error: TypeError",
                                      "tool_call_id": state["completion"][0]["tool_calls"][0]["id"]}


def test_load_example_dataset_errors_name_the_dataset(monkeypatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"'openai/gsm8k'.*dataset="):
        vf.load_example_dataset("gsm8k", "train", n=4)
    with pytest.raises(ConfigError, match=r"unknown dataset 'nope'; known: .*'gsm8k'"):
        vf.load_example_dataset("nope")


def test_reasoning_gym_env_scores_with_reasoning_gym() -> None:
    pytest.importorskip("reasoning_gym")
    env = vf.ReasoningGymEnv("leg_counting", num_train_examples=2, num_eval_examples=2, seed=3)
    eval_rows = env.get_eval_dataset()
    assert len(env.get_dataset()) == 2 and len(eval_rows) == 2
    truth = {row["question"]: env.rg_dataset[int(row["answer"])]["answer"] for row in eval_rows}

    def respond(body):
        right = truth[body["messages"][-1]["content"]]
        return f"<answer>{right}</answer>"

    with TestServer(respond) as srv:
        out = env.evaluate_sync(srv.client(), "m", {"max_tokens": 64})
    assert out["reward"] == [1.0, 1.0]
    assert out["metrics"]["format_reward_func"] == [1.0, 1.0]  # weight 0: reported only


def test_reasoning_gym_missing_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match="pip install reasoning-gym"):
        vf.ReasoningGymEnv("leg_counting", num_train_examples=1, num_eval_examples=1)


def test_vfkit_fixes_kept_format_reward_and_json_info_tools() -> None:
    parser = vf.XMLParser(["think", "answer"])
    reward = parser.get_format_reward_func()
    mismatched = [{"role": "assistant", "content": "<think>x</answer><answer>4</think>"}]
    good = [{"role": "assistant", "content": "<think>x</think><answer>4</answer>"}]
    assert reward(completion=mismatched) == 0.0 and reward(completion=good) == 1.0
    env = vf.SingleTurnEnv(dataset=[{"question": "q", "answer": "a"}])
    state = {"info": {"oai_tools": json.dumps([tool_schema("from_json")])}}
    assert [t["function"]["name"] for t in env.tools_for(state)] == ["from_json"]


def test_classic_arguments_vfkit_cannot_honour_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"tool_defs= is not supported.*oai_tools"):
        qa_env(tool_defs=[tool_schema("t")])
    with pytest.raises(ConfigError, match="pass_threshold="):
        qa_env(pass_threshold=0.5)


def test_score_rollouts_false_skips_the_rubric() -> None:
    env = qa_env(n=1, score_rollouts=False)
    with TestServer("yes") as srv:
        out = env.evaluate_sync(srv.client(), "m", {"max_tokens": 8})
        scored = env.evaluate_sync(srv.client(), "m", {"max_tokens": 8}, score_rollouts=True)
    assert out.states[0]["reward"] is None and out.reward == [0.0]
    assert scored.reward == [1.0]  # the call's argument wins over the constructor's


LAZY_CLASSIC = '''
import verifiers as vf

def load_environment(**kwargs):
    from verifiers.utils.data_utils import extract_hash_answer  # imported when building
    rows = [{"question": "q", "answer": extract_hash_answer("work #### 4")}]
    return vf.SingleTurnEnv(dataset=rows, **kwargs)
'''


def test_imports_inside_load_environment_see_the_classic_surface(tmp_path, monkeypatch) -> None:
    (tmp_path / "lazy_classic.py").write_text(LAZY_CLASSIC)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        for _ in range(2):  # the second load finds the module already imported
            env = vfkit.load_environment("lazy-classic")
            assert env.get_dataset()[0]["answer"] == "4" and env.env_id == "lazy-classic"
    finally:
        sys.modules.pop("lazy_classic", None)
    assert "verifiers" not in sys.modules


def lookup(key: str, table: str) -> str:
    """Look a key up.

    Args:
        key: The key.
        table: Which table (filled in by the environment).
    """
    return f"{table}:{key}"


class ClassicStateful(vf.StatefulToolEnv):
    """0.1.8 style: hidden args via update_tool_args, tool message built by call_tool."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_tool(lookup, args_to_skip=["table"])

    def update_tool_args(self, tool_name, tool_args, messages, state, **kwargs):
        return {**tool_args, "table": state["info"]["table"]}

    async def call_tool(self, tool_name, tool_args, tool_call_id, **kwargs):
        result = self.tool_map[tool_name](**tool_args)
        return {"role": "tool", "content": result.upper(), "tool_call_id": tool_call_id}


def test_classic_call_tool_and_update_tool_args_overrides() -> None:
    env = ClassicStateful(dataset=[{"question": "q", "answer": "a", "info": {"table": "t1"}}])
    schema = env.oai_tools[0]["function"]["parameters"]["properties"]
    assert list(schema) == ["key"]  # the hidden argument is not shown to the model
    calls = [{"name": "lookup", "arguments": {"key": "k", "table": "spoofed"}}]
    with TestServer([Reply(tool_calls=calls), "done"]) as srv:
        state = env.evaluate_sync(srv.client(), "m", {"max_tokens": 200}).states[0]
    assert state["completion"][1]["content"] == "T1:K"  # the model's "table" was replaced


def test_load_example_dataset_makes_the_real_hub_call_and_maps_rows(monkeypatch) -> None:
    import datasets

    asked = []

    def hub(path, config=None):  # stands in for the hub only: what load_dataset would return
        asked.append((path, config))
        rows = [{"question": f"q{i}", "answer": f"work\n#### {i},000"} for i in range(5)]
        return datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)})

    monkeypatch.setattr(datasets, "load_dataset", hub)
    rows = vf.load_example_dataset("gsm8k", n=3, seed=1)
    assert asked == [("openai/gsm8k", "main")]
    assert len(rows) == 3 and rows.column_names == ["question", "answer"]
    # answers keep what follows '####' (gsm8k's marker): q3 -> "3,000"
    assert {r["question"]: r["answer"] for r in rows}.items() <= {
        f"q{i}": f"{i},000" for i in range(5)}.items()
    with pytest.raises(ConfigError, match="no split 'test'; available: \\['train'\\]"):
        vf.load_example_dataset("gsm8k", split="test")
