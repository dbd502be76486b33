"""python-sandbox: tools run in the rollout's sandbox; bad code fails there, rollouts go on."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
from openai import AsyncOpenAI

import vfkit as vf
from vfkit.testing.scripted_server import Reply, TestServer

ENV_DIR = str(Path(__file__).resolve().parents[1])
if ENV_DIR not in sys.path:  # importable from a checkout, installed or not
    sys.path.insert(0, ENV_DIR)

import vfkit_python_sandbox as python_sandbox  # noqa: E402  # after the path line above

ROW = {"question": "What is 6 * 7?", "answer": "42"}


def run(code: str, **extra) -> Reply:
    return Reply(tool_calls=[{"name": "run_python", "arguments": {"code": code, **extra}}])


async def _rollout(script, row=ROW, **env_args) -> tuple[dict, list[str]]:
    env = vf.load_environment("python-sandbox", num_train_examples=6, num_eval_examples=6,
                              timeout_s=2, cpu_seconds=2, **env_args)
    with TestServer(script) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client:
            state = await env.run_rollout(dict(row), client, "m")
    assert env.sandboxes == {}  # released after the rollout
    return state, [m["content"] for m in state["completion"] if m["role"] == "tool"]


def test_tasks_have_correct_answers() -> None:
    rows = python_sandbox.make_rows(12, seed=5)
    assert rows == python_sandbox.make_rows(12, seed=5)
    assert len({r["question"].split()[2] for r in rows}) > 3  # several task kinds
    assert python_sandbox._fib(10) == 55 and sum(python_sandbox._primes_below(10)) == 17
    assert python_sandbox._trailing_zeros(100) == 24


def test_the_sandbox_fails_closed_unless_weak_isolation_is_asked_for() -> None:
    """Without namespaces or seccomp the tool refuses to run the model's code by default."""
    strict = vf.load_environment("python-sandbox", num_train_examples=6, num_eval_examples=6)
    assert strict.limits.allow_weak_isolation is False
    weak = vf.load_environment("python-sandbox", num_train_examples=6, num_eval_examples=6,
                               allow_weak_isolation=True)
    assert weak.limits.allow_weak_isolation is True


async def test_right_answer_computed_in_the_sandbox() -> None:
    state, outputs = await _rollout([run("print(6 * 7)"), "<answer>42</answer>"])
    assert state["error"] is None and outputs == ["42"]
    assert state["reward"] == 1.0
    assert state["metrics"]["run_python_calls"] == 1.0 and state["metrics"]["failed_runs"] == 0
    assert not os.path.exists(state["sandbox_dir"])  # the directory is gone


async def test_wrong_and_malformed_answers_score_zero() -> None:
    state, _ = await _rollout(["<answer>41</answer>"])
    assert state["reward"] == 0.0
    state, outputs = await _rollout([Reply(tool_calls=[{"name": "run_python",
                                                        "arguments": "{bad json"}]), "no idea"])
    assert outputs[0].startswith("Error:") and state["reward"] == 0.0


async def test_files_persist_within_a_rollout_and_the_dir_is_injected() -> None:
    state, outputs = await _rollout([
        run("import os; open('x.txt', 'w').write('6 * 7'); print(os.getcwd())",
            sandbox_dir="/etc"),  # the model cannot choose the directory
        run("print(eval(open('x.txt').read()))"), "<answer>42</answer>",
    ])
    assert outputs == [state["sandbox_dir"], "42"]
    assert state["reward"] == 1.0


@pytest.fixture
def listener():
    server = socket.create_server(("127.0.0.1", 0))
    yield server.getsockname()[1]
    server.close()


async def test_misbehaving_code_fails_inside_the_sandbox_and_the_rollout_goes_on(
    tmp_path: Path, listener: int
) -> None:
    outside = tmp_path / "escape.txt"
    bombs = [
        "while True:\n    pass\n",  # infinite loop
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "x = bytearray(10 * 1024**3)\n",  # 10 GB
        f"import socket\nsocket.create_connection(('127.0.0.1', {listener}), timeout=1)\n",
        f"open({str(outside)!r}, 'w').write('x')\n",
    ]
    state, outputs = await _rollout([*(run(code) for code in bombs), "<answer>42</answer>"],
                                    max_turns=7)
    assert state["error"] is None
    # stopped by the wall clock or the CPU limit, whichever a loaded machine reaches first
    assert outputs[0].endswith(("[killed: wall-clock timeout]", "[killed: CPU time limit]"))
    assert "[killed: wall-clock timeout]" in outputs[1] or "Error" in outputs[1]
    assert "MemoryError" in outputs[2]
    assert "network access is not allowed" in outputs[3]
    assert "PermissionError" in outputs[4] and not outside.exists()
    assert state["metrics"]["failed_runs"] == 5.0
    assert state["reward"] == 1.0  # the model still answered, and was scored


async def test_a_deep_directory_tree_is_deleted_and_the_rollout_is_scored() -> None:
    """1100 nested directories: Python 3.11's recursive rmtree raised in cleanup and the
    rollout was lost; it is deleted without recursion now."""
    deep = "import os\nfor _ in range(1100):\n    os.mkdir('d')\n    os.chdir('d')\nprint(42)\n"
    state, outputs = await _rollout([run(deep), "<answer>42</answer>"])
    assert outputs == ["42"] and state["error"] is None
    assert state["reward"] == 1.0
    assert not os.path.exists(state["sandbox_dir"])


async def test_control_characters_in_the_output_are_shown_escaped() -> None:
    """ANSI escapes, carriage returns, NUL and bidi overrides reached the tool reply raw."""
    code = ("import sys\nsys.stdout.buffer.write("
            "b'\\x1b[31mRED\\x1b[0m\\rok\\x00\\tend\\n\\xe2\\x80\\xaeevil')")
    _, outputs = await _rollout([run(code), "<answer>42</answer>"])
    assert outputs == ["\\x1b[31mRED\\x1b[0m\\rok\\x00\tend\n\\u202eevil"]
