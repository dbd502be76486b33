"""python-sandbox: answer computational questions by running Python (StatefulToolEnv).

The model calls `run_python(code)`; the code runs in `vfkit.sandbox` (a separate process with a
wall-clock timeout, CPU / memory / process limits, no network, a private directory; see
vfkit/sandbox/README.md). Each rollout gets its own sandbox: its directory is injected into every
call from the rollout's state (the model never chooses it), files persist between the calls of a
rollout, and the directory is deleted when the rollout ends.

Rewards: `correct_answer` (weight 1.0) when the final reply's number (`<answer>` tags, else the
last number) is the answer; metrics (weight 0): `total_tool_calls`, `run_python_calls`,
`failed_runs` (runs that errored, timed out or hit a limit).

    env = vf.load_environment("python-sandbox", timeout_s=5)
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from contextvars import ContextVar

import vfkit as vf
from vfkit.bridge import v1_exports
from vfkit.parsers.utils import final_number
from vfkit.sandbox import Sandbox, SandboxLimits

SYSTEM_PROMPT = (
    "Answer the question. You can run Python with the run_python tool (print what you need to "
    "see). When you know the answer, reply with the number inside <answer></answer> tags."
)
# control characters but \t and \n (C0, DEL, C1) and bidirectional overrides: shown escaped, so
# that the program's output cannot hide text from a reader of the transcript (\r, ANSI escapes,
# right-to-left overrides) nor carry NUL into the messages
CONTROL_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_rollout_sandbox: ContextVar[Sandbox] = ContextVar("rollout_sandbox")


def _primes_below(n: int) -> list[int]:
    return [p for p in range(2, n) if all(p % d for d in range(2, math.isqrt(p) + 1))]


def _fib(k: int) -> int:
    a, b = 1, 1
    for _ in range(k - 1):
        a, b = b, a + b
    return a


def _trailing_zeros(n: int) -> int:
    return sum(n // 5**i for i in range(1, 30))


# each task: rng -> (question, answer)
TASKS: list[Callable[[random.Random], tuple[str, int]]] = [
    lambda r: (lambda n: (f"What is the sum of all prime numbers below {n}?",
                          sum(_primes_below(n))))(r.randint(100, 3000)),
    lambda r: (lambda n, a, b: (f"How many integers from 1 to {n} are divisible by {a} or {b}?",
                                sum(1 for i in range(1, n + 1) if i % a == 0 or i % b == 0)))(
        r.randint(500, 5000), r.randint(3, 9), r.randint(10, 17)),
    lambda r: (lambda k: (f"What is the Fibonacci number F({k}), where F(1) = F(2) = 1?", _fib(k)))(
        r.randint(20, 70)),
    lambda r: (lambda a, b: (f"What is the sum of the decimal digits of {a} to the power {b}?",
                             sum(map(int, str(a**b)))))(r.randint(2, 9), r.randint(20, 60)),
    lambda r: (lambda n: (f"How many trailing zeros does {n} factorial have?",
                          _trailing_zeros(n)))(r.randint(50, 5000)),
    lambda r: (lambda a, b, m: (f"What is {a} to the power {b}, modulo {m}?", pow(a, b, m)))(
        r.randint(2, 50), r.randint(50, 500), r.randint(7, 997)),
]


def make_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        question, answer = TASKS[i % len(TASKS)](rng)
        rows.append({"question": question, "answer": str(answer)})
    return rows


def escape_controls(text: str) -> str:
    """`text` with each control character (but tab and newline) written as an escape: \\x1b."""
    return CONTROL_RE.sub(lambda m: ascii(m.group())[1:-1], text)


class PythonSandboxEnv(vf.StatefulToolEnv):
    """A StatefulToolEnv whose run_python tool runs in the rollout's own Sandbox."""

    def __init__(self, limits: SandboxLimits, max_output_chars: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.limits, self.max_output_chars = limits, max_output_chars
        self.sandboxes: dict[str, Sandbox] = {}  # sandbox dir -> its Sandbox, while in use
        self.failures: dict[str, int] = {}  # sandbox dir -> runs that did not end cleanly
        self.add_tool(self.run_python, args_to_skip=["sandbox_dir"])

    async def run_python(self, code: str, sandbox_dir: str) -> str:
        """Run a Python program and return what it printed (stdout, then stderr).

        Args:
            code: A complete Python program; print the values you want to see.
            sandbox_dir: Injected by the environment (the rollout's sandbox).
        """
        result = await self.sandboxes[sandbox_dir].run(code)
        if not result.ok:
            self.failures[sandbox_dir] = self.failures.get(sandbox_dir, 0) + 1
        return escape_controls(result.format(max_chars=self.max_output_chars))

    async def setup_state(self, state: vf.State) -> vf.State:
        state["sandbox_dir"] = str(_rollout_sandbox.get().path)
        return state

    def update_tool_args(self, tool_name, tool_args, messages, state):
        return {**tool_args, "sandbox_dir": state["sandbox_dir"]}

    async def rollout(self, input, client, model, sampling_args) -> vf.State:
        """One rollout inside its own sandbox, deleted afterwards (also when cancelled)."""
        with Sandbox(self.limits) as sandbox:
            key = str(sandbox.path)
            self.sandboxes[key] = sandbox
            token = _rollout_sandbox.set(sandbox)  # each rollout runs in its own task/context
            try:
                state = await super().rollout(input, client, model, sampling_args)
            finally:
                _rollout_sandbox.reset(token)
                del self.sandboxes[key]
                failures = self.failures.pop(key, 0)
        state["failed_runs"] = failures
        return state


def load_environment(
    num_train_examples: int = 600,
    num_eval_examples: int = 60,
    seed: int = 0,
    max_turns: int = 6,
    max_tokens: int = 256,
    timeout_s: float = 10.0,
    cpu_seconds: int = 10,
    memory_mb: int = 512,
    max_processes: int = 8,
    max_output_chars: int = 2000,
    system_prompt: str = SYSTEM_PROMPT,
    allow_weak_isolation: bool = False,
) -> vf.Environment:
    """Build the environment; the sandbox limits apply to every run_python call.

    The sandbox fails closed: on a machine without namespaces or seccomp every run_python call
    is refused (the tool reply says why) unless `allow_weak_isolation=True` accepts running
    the model's code with less isolation (see vfkit/sandbox/README.md).
    """
    parser = vf.XMLParser(["answer"])

    def correct_answer(completion, answer: str) -> float:
        """1.0 when the final answer is the question's integer answer."""
        value = final_number(parser, completion)
        return 1.0 if value is not None and float(value) == float(answer) else 0.0

    def failed_runs(state: vf.State) -> float:
        """run_python calls that errored, timed out or hit a limit (a metric)."""
        return float(state.get("failed_runs", 0))

    rubric = vf.RubricGroup([
        vf.Rubric(funcs=[correct_answer, failed_runs], weights=[1.0, 0.0], parser=parser),
        vf.ToolRubric(tools=["run_python"]),
    ])
    limits = SandboxLimits(timeout_s=timeout_s, cpu_seconds=cpu_seconds, memory_mb=memory_mb,
                           max_processes=max_processes,
                           allow_weak_isolation=allow_weak_isolation)
    return PythonSandboxEnv(
        limits=limits, max_output_chars=max_output_chars, max_turns=max_turns,
        dataset=make_rows(num_train_examples, seed),
        eval_dataset=make_rows(num_eval_examples, seed + 1), system_prompt=system_prompt,
        parser=parser, rubric=rubric, sampling_args={"max_tokens": max_tokens},
        env_id="python-sandbox",
    )


# verifiers v1 / prime-rl: `vf.load_taskset("vfkit-python-sandbox")` (needs vfkit[verifiers])
__all__, __getattr__ = v1_exports("python-sandbox", load_environment)
