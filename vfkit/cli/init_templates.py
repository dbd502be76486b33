"""The files `vf-init NAME` writes: a package whose own test passes before anything is edited.

The distribution is `vfkit-NAME`, as the bundled environments' are (environments/README.md), so
that pip never replaces another project's package of the same name; the module keeps the id's
name (`-` -> `_`). The Python files are `ruff format` clean at ruff's default line length and at
vfkit's 100 (the trailing commas keep the long calls exploded at both).
"""

from __future__ import annotations

from string import Template

PYPROJECT = Template('''\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "vfkit-$name"
version = "0.1.0"
description = "$name: a vfkit environment"
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["vfkit"]

# vfkit.load_environment("$name") finds the environment through this entry point once installed
[project.entry-points."vfkit.environments"]
$name = "$module:load_environment"

[tool.setuptools]
py-modules = ["$module"]

# defaults for `vf-eval $name` (flags win)
[tool.vfkit.eval]
num_examples = 20
rollouts_per_example = 4
''')

MODULE = Template('''\
"""$name: a vfkit environment (edit me).

The model is asked to repeat a word inside <answer> tags; the reward is 1.0 for the exact word,
plus a small format reward for well-formed tags.
"""

from __future__ import annotations

import vfkit as vf
from vfkit.bridge import v1_exports

WORDS = ["apple", "river", "candle", "orbit", "maple", "violet", "harbor", "pixel"]
SYSTEM_PROMPT = "Reply with the requested word inside <answer></answer> tags."


def exact_answer(parser: vf.Parser, completion, answer: str) -> float:
    """1.0 when the parsed answer is exactly the expected word."""
    return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0


def load_environment(num_examples: int = len(WORDS)) -> vf.Environment:
    """Build the environment; keyword arguments come from `vf-eval $name -a '{...}'`."""
    words = WORDS[:num_examples]
    rows = [{"question": f"Repeat this word: {w}", "answer": w} for w in words]
    parser = vf.XMLParser(["answer"])
    rubric = vf.Rubric(
        funcs=[exact_answer, parser.get_format_reward_func()],
        weights=[1.0, 0.2],
        parser=parser,
    )
    return vf.SingleTurnEnv(
        dataset=rows,
        system_prompt=SYSTEM_PROMPT,
        parser=parser,
        rubric=rubric,
    )


# verifiers v1 / prime-rl: `vf.load_taskset("$name")` (needs vfkit[verifiers])
__all__, __getattr__ = v1_exports("$name", load_environment)
''')

README = Template('''\
# $name

A vfkit environment package (scaffolded by `vf-init $name`).

- **Task**: repeat a word inside `<answer>` tags (replace with your own task in `$module.py`).
- **Rewards**: `exact_answer` (weight 1.0), format of the tags (weight 0.2).
- **Arguments**: `num_examples` (int).

```bash
vf-install $name                                  # pip install -e environments/$name
pytest environments/$name                         # its tests, against a scripted test server
vf-eval $name -m HuggingFaceTB/SmolLM2-135M-Instruct -n 8 -r 2
```
''')

TEST = Template('''\
"""Tests of $name: rollouts against a scripted OpenAI-compatible test server."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from openai import AsyncOpenAI

import vfkit as vf
from vfkit.testing.scripted_server import TestServer

ENV_DIR = str(Path(__file__).resolve().parents[1])
if ENV_DIR not in sys.path:  # importable from a checkout, installed or not
    sys.path.insert(0, ENV_DIR)


def _rollout(reply: str) -> dict:
    """One rollout of the first example, the scripted server answering `reply`."""
    env = vf.load_environment("$name", num_examples=1)
    row = env.get_dataset()[0]
    with TestServer([reply]) as server:
        client = AsyncOpenAI(base_url=server.base_url, api_key="test")
        return asyncio.run(env.run_rollout(row, client, "test-model"))


def test_right_answer_scores_full_reward() -> None:
    state = _rollout("<answer>apple</answer>")
    assert state["error"] is None
    assert state["reward"] == pytest.approx(1.2)  # exact 1.0 * 1.0 + format 1.0 * 0.2


def test_wrong_answer_scores_format_only() -> None:
    state = _rollout("<answer>pear</answer>")
    assert state["reward"] == pytest.approx(0.2)  # format only


def test_malformed_answer_scores_zero() -> None:
    state = _rollout("apple")
    assert state["reward"] == 0.0
''')


def render(name: str, module: str) -> dict[str, str]:
    """Relative path -> content of every file of the new package."""
    values = {"name": name, "module": module}
    return {
        "pyproject.toml": PYPROJECT.substitute(values),
        f"{module}.py": MODULE.substitute(values),
        "README.md": README.substitute(values),
        f"tests/test_{module}.py": TEST.substitute(values),
    }
