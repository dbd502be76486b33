"""calculator: evaluate arithmetic expressions with calculator tools (ToolEnv).

The model may call `add`, `subtract`, `multiply` and `divide` (OpenAI tool calls) as often as it
likes within `max_turns`, then answers without a tool call. Rewards: `correct_answer` (weight
1.0) when the final answer (in `<answer>` tags, else the last number of the final reply) equals
the expression's value; ToolRubric metrics (weight 0): `total_tool_calls` and one count per tool.

    env = vf.load_environment("calculator", num_operations=3, max_operand=99)
"""

from __future__ import annotations

import random

import vfkit as vf
from vfkit.bridge import v1_exports
from vfkit.parsers.utils import final_number

SYSTEM_PROMPT = (
    "You have calculator tools. Call them to work out the expression step by step, then reply "
    "with the final number inside <answer></answer> tags."
)


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return _num(a + b)


def subtract(a: float, b: float) -> float:
    """Subtract b from a.

    Args:
        a: The number to subtract from.
        b: The number to subtract.
    """
    return _num(a - b)


def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return _num(a * b)


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor (not zero).
    """
    if b == 0:
        raise ZeroDivisionError("cannot divide by zero")
    return _num(a / b)


TOOLS = [add, subtract, multiply, divide]
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def make_expression(rng: random.Random, num_operations: int, max_operand: int) -> tuple[str, int]:
    """A left-to-right expression like ((12 + 7) * 3) - 5 and its value."""
    value = rng.randint(2, max_operand)
    text = str(value)
    for i in range(num_operations):
        op, operand = rng.choice(list(OPS)), rng.randint(2, max_operand)
        if op == "*":
            operand = rng.randint(2, 9)  # keep products in a readable range
        text = f"({text} {op} {operand})" if i < num_operations - 1 else f"{text} {op} {operand}"
        value = OPS[op](value, operand)
    return text, value


def make_rows(n: int, seed: int, num_operations: int, max_operand: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        text, value = make_expression(rng, num_operations, max_operand)
        rows.append({"question": f"What is {text}?", "answer": str(value)})
    return rows


def load_environment(
    num_operations: int = 2,
    max_operand: int = 50,
    num_train_examples: int = 1000,
    num_eval_examples: int = 100,
    seed: int = 0,
    max_turns: int = 6,
    max_tokens: int = 128,
    system_prompt: str = SYSTEM_PROMPT,
) -> vf.Environment:
    """Build the environment; more operations and larger operands make it harder."""
    if num_operations < 1 or max_operand < 2:
        raise ValueError("need num_operations >= 1 and max_operand >= 2")
    parser = vf.XMLParser(["answer"])

    def correct_answer(completion, answer: str) -> float:
        """1.0 when the final answer equals the expression's value."""
        value = final_number(parser, completion)
        return 1.0 if value is not None and abs(float(value) - float(answer)) < 1e-6 else 0.0

    rubric = vf.RubricGroup([vf.Rubric(funcs=[correct_answer], parser=parser),
                             vf.ToolRubric(tools=TOOLS)])
    return vf.ToolEnv(
        tools=TOOLS, max_turns=max_turns,
        dataset=make_rows(num_train_examples, seed, num_operations, max_operand),
        eval_dataset=make_rows(num_eval_examples, seed + 1, num_operations, max_operand),
        system_prompt=system_prompt, parser=parser, rubric=rubric,
        sampling_args={"max_tokens": max_tokens}, env_id="calculator",
    )


# verifiers v1 / prime-rl: `vf.load_taskset("vfkit-calculator")` (needs vfkit[verifiers])
__all__, __getattr__ = v1_exports("calculator", load_environment)
