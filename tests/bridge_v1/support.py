"""What the verifiers v1 bridge tests share: the throwaway venv, scripted models, vfkit's states.

The tests run in a venv with the newest verifiers from PyPI (built once under
`.cache/bridge-v1-venv/`, gitignored; delete it to rebuild) holding this checkout's vfkit and
environments (`v1_python`). The scripted models answer vfkit's scripted test server: they see
chat messages, or the decoded prompt on the token route. Registered as a pytest plugin in
`tests/conftest.py`, so its fixtures reach every test module.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from bridge_v1.venv import ROOT, VENV, VerifiersUnreachable, build_base, locked, run
from openai import AsyncOpenAI

import vfkit as vf
from vfkit.testing.scripted_server import Reply, TestServer

ENVIRONMENTS = ("reverse-text", "guess-number", "calculator")
HELPERS = Path(__file__).parent
ORCHESTRATOR = HELPERS / "orchestrator.py"
# verifiers' vf-eval by module: vfkit's own `vf-eval` script shares the name in this venv
EVAL_CLI = "import sys; from verifiers.v1.cli.eval.main import main; sys.argv[0]='vf-eval'; main()"


def slow(test):
    """Marks a test that needs the venv: minutes to build once, then cached."""
    return pytest.mark.slow(pytest.mark.timeout(1800)(test))


# ----- the throwaway venv (its base: venv.py) -----
@pytest.fixture(scope="module")
def v1_python() -> str:
    """The venv's python: verifiers installed once, this checkout's packages when the list
    changes (both editable, so code edits need no reinstall). Under a file lock, so parallel
    test workers (and `make test`'s prebuild) build it once and never see it half-built."""
    try:
        return locked(_build_v1_venv)
    except VerifiersUnreachable as error:
        pytest.skip(str(error))


def _build_v1_venv() -> str:
    build_base()
    stamp = VENV / ".environments"
    if not (stamp.exists() and stamp.read_text() == " ".join(ENVIRONMENTS)):
        editable = [a for env in ENVIRONMENTS for a in ("-e", str(ROOT / "environments" / env))]
        run([str(VENV / "bin" / "pip"), "install", "-q", "--no-deps", "-e", str(ROOT),
             *editable], "installing vfkit")
        stamp.write_text(" ".join(ENVIRONMENTS))
    return str(VENV / "bin" / "python")


def with_helpers() -> dict[str, str]:
    """This environment, with the test harnesses in `bridge_v1/` importable by id."""
    path = os.pathsep.join([str(HELPERS), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


@pytest.fixture
def local_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    """This checkout's environment modules, not whatever the shared venv has installed."""
    for env in ENVIRONMENTS:
        monkeypatch.syspath_prepend(str(ROOT / "environments" / env))


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
