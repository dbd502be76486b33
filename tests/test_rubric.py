"""Rubric: weights, argument filtering, sync/async/group functions, errors never kill a batch."""

from __future__ import annotations

import asyncio
import doctest
import functools
import subprocess
import sys
import threading
import time

import pytest

import vfkit.rubrics.call as call_module
import vfkit.rubrics.rubric as rubric_module
from vfkit.parsers.xml_parser import XMLParser
from vfkit.rubrics.call import run_with_timeout, select_kwargs
from vfkit.rubrics.rubric import ERRORS_METRIC, Rubric


def make_state(content: str = "4", answer: str = "4", **extra) -> dict:
    state = {
        "example_id": 3,
        "task": "arith",
        "prompt": [{"role": "user", "content": "2+2?"}],
        "completion": [{"role": "assistant", "content": content}],
        "answer": answer,
        "info": {"level": 1},
        "error": None,
    }
    state.update(extra)
    return state


def exact(completion, answer) -> float:
    return float(completion[-1]["content"] == answer)


def half() -> float:
    return 0.5


async def test_reward_is_the_weighted_sum_and_each_score_a_metric():
    rubric = Rubric(funcs=[exact, half], weights=[2.0, -1.0])
    state = make_state()
    await rubric.score_rollout(state)
    assert state["reward"] == 1.5  # 2.0 * 1.0 + (-1.0) * 0.5
    assert state["metrics"] == {"exact": 1.0, "half": 0.5, ERRORS_METRIC: 0.0}
    assert state["error"] is None


async def test_weights_default_to_one_and_add_reward_func_appends():
    rubric = Rubric(funcs=[exact])
    rubric.add_reward_func(half, weight=4.0)
    assert rubric.get_reward_func_names() == ["exact", "half"]
    assert rubric.get_reward_weights() == [1.0, 4.0]
    state = make_state(content="5")
    await rubric.score_rollout(state)
    assert state["reward"] == 2.0  # 1.0 * 0.0 + 4.0 * 0.5


def test_configuration_mistakes_raise_clear_errors():
    with pytest.raises(ValueError, match="2 reward functions but 1 weights"):
        Rubric(funcs=[exact, half], weights=[1.0])
    with pytest.raises(ValueError, match="named 'exact'"):
        Rubric(funcs=[exact, exact])
    with pytest.raises(TypeError, match="not callable"):
        Rubric(funcs=["exact"])


async def test_functions_receive_only_the_arguments_they_declare():
    seen = {}

    def narrow(answer, info):
        seen["narrow"] = (answer, info)
        return 1.0

    def wide(**kwargs):
        seen["wide"] = set(kwargs)
        return 1.0

    def with_objects(parser, tokenizer, state, task, prompt):
        seen["objects"] = (parser, tokenizer, state["example_id"], task, prompt[0]["content"])
        return 1.0

    parser = XMLParser(["answer"])
    rubric = Rubric(funcs=[narrow, wide, with_objects], parser=parser, tokenizer="tok")
    await rubric.score_rollout(make_state())
    assert seen["narrow"] == ("4", {"level": 1})
    assert seen["wide"] >= {"prompt", "completion", "answer", "state", "task", "info", "parser"}
    assert "tokenizer" in seen["wide"]
    assert seen["objects"] == (parser, "tok", 3, "arith", "2+2?")
    assert rubric.tokenizer == "tok"  # extra keywords are attributes too


async def test_async_functions_and_async_callable_objects():
    async def slow_exact(completion, answer) -> float:
        await asyncio.sleep(0)
        return float(completion[-1]["content"] == answer)

    class Scorer:
        __name__ = "scorer"

        async def __call__(self, answer) -> float:
            return float(answer) / 8

    rubric = Rubric(funcs=[slow_exact, Scorer(), functools.partial(exact)])
    state = make_state()
    await rubric.score_rollout(state)
    assert state["metrics"]["slow_exact"] == 1.0
    assert state["metrics"]["scorer"] == 0.5  # 4 / 8
    assert state["metrics"]["exact"] == 1.0  # a partial is reported under its function's name
    assert state["reward"] == 2.5  # 1.0 + 0.5 + 1.0


async def test_sync_functions_run_off_the_event_loop():
    # If the blocking function ran on the loop thread, `release` could never run: wait -> False.
    event = threading.Event()

    def blocking() -> float:
        return 1.0 if event.wait(timeout=5) else 0.0

    async def release():
        await asyncio.sleep(0.01)
        event.set()

    state = make_state()
    await asyncio.gather(Rubric(funcs=[blocking]).score_rollout(state), release())
    assert state["metrics"]["blocking"] == 1.0


async def test_a_raising_function_scores_zero_and_the_batch_survives():
    def boom(answer) -> float:
        if answer == "bad":
            raise ValueError("cannot grade this")
        return 1.0

    rubric = Rubric(funcs=[boom, half])
    states = [make_state(answer="4"), make_state(answer="bad")]
    await rubric.score_group(states)
    assert states[0]["reward"] == 1.5  # 1.0 + 0.5
    assert states[0]["error"] is None
    assert states[1]["reward"] == 0.5  # 0 for boom + 0.5
    assert states[1]["metrics"]["boom"] == 0.0
    assert states[1]["metrics"][ERRORS_METRIC] == 1.0
    assert states[1]["error"] == "reward function boom raised ValueError: cannot grade this"


@pytest.mark.parametrize("value", [None, "1.0", float("nan"), float("inf")])
async def test_non_numbers_and_non_finite_rewards_are_errors(value):
    def odd() -> object:
        return value

    state = make_state()
    await Rubric(funcs=[odd]).score_rollout(state)
    assert state["reward"] == 0.0
    assert state["metrics"][ERRORS_METRIC] == 1.0
    assert "reward function odd raised" in state["error"]


async def test_missing_argument_error_names_it():
    def needs_judge(judge) -> float:
        return 1.0

    state = make_state()
    await Rubric(funcs=[needs_judge]).score_rollout(state)
    assert "needs_judge requires ['judge']" in state["error"]


async def test_failed_rollout_is_not_scored_but_gets_zero_metrics():
    calls = []

    def counted(answer) -> float:
        calls.append(answer)
        return 1.0

    def group_counted(answers) -> list[float]:
        calls.append(tuple(answers))
        return [2.0] * len(answers)

    rubric = Rubric(funcs=[counted, group_counted])
    failed = make_state(answer="x", error="ServerError: 500")
    ok = make_state(answer="y")
    await rubric.score_group([failed, ok])
    assert sorted(map(str, calls)) == ["('y',)", "y"]  # the failed rollout was never scored
    assert failed["reward"] == 0.0
    assert failed["metrics"] == {"counted": 0.0, "group_counted": 0.0, ERRORS_METRIC: 0.0}
    assert failed["error"] == "ServerError: 500"
    assert ok["reward"] == 3.0  # 1.0 + 2.0


async def test_errors_of_several_functions_are_appended_and_other_metrics_kept():
    def boom() -> float:
        raise RuntimeError("x")

    def bang() -> float:
        raise KeyError("y")

    state = make_state(metrics={"kept": 1.0})
    await Rubric(funcs=[boom, bang, half]).score_rollout(state)
    assert state["error"] in (
        "reward function boom raised RuntimeError: x; reward function bang raised KeyError: 'y'",
        "reward function bang raised KeyError: 'y'; reward function boom raised RuntimeError: x",
    )
    assert state["metrics"][ERRORS_METRIC] == 2.0
    assert state["metrics"]["kept"] == 1.0  # keys set by others are preserved
    assert state["reward"] == 0.5
    await Rubric(funcs=[half]).score_rollout(state)  # now an errored rollout: not re-scored
    assert state["reward"] == 0.0
    assert state["error"].count("reward function") == 2  # the earlier error is kept as is


async def test_group_functions_get_lists_and_return_one_score_each():
    def rank(completions, answers, states, prompts, tasks, infos) -> list[float]:
        assert len(prompts) == len(tasks) == len(infos) == len(states) == 3
        lengths = [len(c[-1]["content"]) for c in completions]
        return [float(n == min(lengths)) for n in lengths]

    rubric = Rubric(funcs=[rank, exact], weights=[0.5, 1.0])
    states = [make_state("4"), make_state("four"), make_state("4.0")]
    await rubric.score_group(states)
    assert [s["metrics"]["rank"] for s in states] == [1.0, 0.0, 0.0]
    assert [s["reward"] for s in states] == [1.5, 0.0, 0.0]  # 0.5 * 1 + 1 * 1 for the first


@pytest.mark.parametrize("result", [[1.0], 1.0, "ab", None])
async def test_a_group_function_with_a_wrong_result_fails_the_group(result):
    def bad(completions):
        return result

    states = [make_state(), make_state()]
    await Rubric(funcs=[bad, half]).score_group(states)
    for state in states:
        assert state["reward"] == 0.5  # bad scores 0, half still counts
        assert state["metrics"][ERRORS_METRIC] == 1.0
        assert "reward function bad raised" in state["error"]


async def test_sync_functions_run_on_a_bounded_number_of_threads(monkeypatch):
    # read when this test's event loop first calls a sync function
    monkeypatch.setattr(call_module, "MAX_THREADS", 2, raising=False)
    lock, running, peak = threading.Lock(), [0], [0]

    def slow(completion) -> float:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return 1.0

    states = [make_state() for _ in range(12)]
    await Rubric(funcs=[slow]).score_group(states)
    assert [s["reward"] for s in states] == [1.0] * 12
    assert peak[0] <= 2  # unbounded, each of the 12 calls had a thread of its own at once


def test_select_kwargs_filters_and_passes_everything_to_var_kwargs():
    available = {"a": 1, "b": 2, "c": 3}
    assert select_kwargs(lambda a, c=0: None, available) == {"a": 1, "c": 3}
    assert select_kwargs(lambda a, **kw: None, available) == available
    with pytest.raises(TypeError, match=r"requires \['d'\]"):
        select_kwargs(lambda d: None, available)


def test_run_with_timeout_returns_raises_and_stops_runaway_threads():
    assert run_with_timeout(lambda: 6 * 7, 1.0) == 42
    with pytest.raises(ZeroDivisionError):
        run_with_timeout(lambda: 1 / 0, 1.0)

    def spin():
        while True:
            pass

    before = time.monotonic()
    with pytest.raises(TimeoutError, match=r"did not finish within 0\.2 s"):
        run_with_timeout(spin, 0.2)
    assert time.monotonic() - before < 2.0
    deadline = time.monotonic() + 5
    while any(t.name == "vfkit-timeout" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the runaway thread was not stopped"
        time.sleep(0.01)


def test_docstring_examples_run():
    assert doctest.testmod(rubric_module).failed == 0


def test_parsers_and_rubrics_never_import_torch():
    code = (
        "import sys, vfkit.parsers.xml_parser, vfkit.parsers.think_parser, vfkit.rubrics.rubric, "
        "vfkit.rubrics.rubric_group, vfkit.rubrics.judge_rubric, vfkit.rubrics.tool_rubric, "
        "vfkit.rubrics.math_rubric; assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_reward_function_that_never_returns_does_not_keep_the_process_alive(tmp_path):
    """A sync reward function that hangs: the caller times out and the process still exits (it
    ran on the loop's executor, whose threads are joined at exit: vf-train hung for good), and
    what was running is named."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent("""
        import asyncio, time
        from vfkit.rubrics.call import call_with_declared_args, running_functions

        def stuck_judge(completion):
            time.sleep(3600)

        async def main():
            call = call_with_declared_args(stuck_judge, {"completion": "x"})
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(call)), 0.5)
            except TimeoutError:
                print("running:", running_functions(), flush=True)

        asyncio.run(main())
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "running: ['stuck_judge']" in out.stdout


def tagged_answer(parser, completion, answer) -> float:
    return float(parser.parse_answer(completion) == answer)


async def test_a_rubric_without_a_parser_uses_its_environments():
    from vfkit.envs.singleturn_env import SingleTurnEnv
    from vfkit.testing.scripted_server import TestServer

    parser = XMLParser(["think", "answer"])
    env = SingleTurnEnv(dataset=[{"question": "2+2?", "answer": "4"}], parser=parser,
                        rubric=Rubric(funcs=[tagged_answer]))
    with TestServer("<think>easy</think><answer>4</answer>") as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert env.rubric.parser is parser and state["reward"] == 1.0 and state["error"] is None


def test_rubric_groups_pass_the_environments_parser_to_rubrics_without_one():
    from vfkit.envs.singleturn_env import SingleTurnEnv
    from vfkit.rubrics.rubric_group import RubricGroup

    env_parser, own = XMLParser(["answer"]), XMLParser(["final"], answer_field="final")
    bare, kept = Rubric(funcs=[tagged_answer]), Rubric(funcs=[half], parser=own)
    env = SingleTurnEnv(dataset=[{"question": "q", "answer": "4"}], parser=env_parser,
                        rubric=RubricGroup([bare, kept]))
    assert bare.parser is env_parser and bare.class_objects["parser"] is env_parser
    assert kept.parser is own  # a rubric's own parser is never replaced
    assert env.rubric.parser is env_parser  # the group's: its first rubric's


def test_a_rubric_parser_that_differs_from_the_environments_is_warned_about(caplog):
    from vfkit.envs.singleturn_env import SingleTurnEnv
    from vfkit.rubrics.math_rubric import MathRubric

    rows = [{"question": "q", "answer": "4"}]
    parser = XMLParser(["answer"])
    with caplog.at_level("WARNING", logger="vfkit.rubrics.rubric"):
        SingleTurnEnv(dataset=rows, parser=parser, rubric=Rubric(funcs=[half], parser=parser))
        SingleTurnEnv(dataset=rows, parser=parser,  # an equal parser built twice: no warning
                      rubric=Rubric(funcs=[half], parser=XMLParser(["answer"])))
        assert caplog.messages == []
        SingleTurnEnv(dataset=rows, parser=parser, rubric=MathRubric(), env_id="sums")
    assert caplog.messages == [
        "sums: the rubric's parser (MaybeThinkParser) differs from the environment's "
        "(XMLParser); reward functions that declare `parser` get the rubric's. Pass the same "
        "parser to both, or build the rubric without one to use the environment's"
    ]
