"""A classic verifiers 0.1.8 ToolEnv (fixture: runs unmodified in vfkit).

The model may call `add` (a plain Python function with a docstring) before answering in
<answer> tags; the reward checks the answer, and a ToolRubric-style count rewards using the tool.
"""

import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum a + b.
    """
    return a + b


def load_environment(max_turns: int = 3, **kwargs):
    rows = [{"question": f"What is {a} + {b}? Use the add tool.", "answer": str(a + b)}
            for a, b in ((2, 3), (10, 7), (4, 4), (6, 1))]
    parser = vf.XMLParser(fields=["answer"])

    def correct_answer(completion, answer, **kwargs) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    def used_tool(completion, **kwargs) -> float:
        return 1.0 if any(m["role"] == "tool" for m in completion) else 0.0

    return vf.ToolEnv(
        dataset=Dataset.from_list(rows),
        tools=[add],
        max_turns=max_turns,
        parser=parser,
        rubric=vf.Rubric(funcs=[correct_answer, used_tool], weights=[1.0, 0.5], parser=parser),
        system_prompt="Use tools when they help. Answer inside <answer></answer> tags.",
        error_formatter=lambda e: f"tool error: {e}",
        **kwargs,
    )
