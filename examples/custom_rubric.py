"""Write a custom rubric: reward functions that declare what they need, weights, async and
group-level functions, and metrics that are logged but not rewarded.

    python examples/custom_rubric.py          # scores scripted answers from vfkit's test server

A reward function asks for any of prompt, completion, answer, state, task, info, parser by naming
them; a group-level function asks for the plural names and returns one score per rollout.
"""

from __future__ import annotations

import asyncio
import itertools

from openai import AsyncOpenAI

import vfkit as vf
from vfkit.testing.scripted_server import TestServer

parser = vf.XMLParser(["think", "answer"])


def correct(completion, answer: str) -> float:
    """1.0 when the <answer> is the capital."""
    return 1.0 if (parser.parse_answer(completion) or "").strip().lower() == answer else 0.0


async def concise(completion) -> float:
    """Async works too: shorter replies score higher (1.0 at <= 20 characters)."""
    text = completion[-1]["content"] if completion else ""
    return min(1.0, 20 / max(len(text), 1))


def distinct_in_group(completions) -> list[float]:
    """Group-level: 1.0 for a reply no other rollout of the same prompt gave."""
    texts = [c[-1]["content"] if c else "" for c in completions]
    return [1.0 if texts.count(t) == 1 else 0.0 for t in texts]


def reply_length(completion) -> float:
    """A metric only (weight 0): logged per rollout, never rewarded."""
    return float(len(completion[-1]["content"])) if completion else 0.0


rubric = vf.Rubric(
    funcs=[correct, parser.get_format_reward_func(), concise, distinct_in_group, reply_length],
    weights=[1.0, 0.2, 0.1, 0.1, 0.0],
    parser=parser,
)
env = vf.SingleTurnEnv(
    dataset=[{"question": "What is the capital of France?", "answer": "paris"}],
    system_prompt=f"Answer in this format:\n{parser.get_format_str()}",
    parser=parser, rubric=rubric,
)

# a stand-in model: four different answers, in turn
REPLIES = [
    "<think>France's capital.</think><answer>Paris</answer>",
    "<answer>Paris</answer>",
    "The capital of France is Paris, a city on the Seine.",
    "<answer>Lyon</answer>",
]


async def main() -> None:
    replies = itertools.cycle(REPLIES)
    with TestServer(lambda request: next(replies)) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client:
            states = await env.run_group([env.get_dataset()[0]] * 4, client, "any-model")
    for state in states:
        metrics = ", ".join(f"{k}={v:.2f}" for k, v in state["metrics"].items())
        print(f"reward {state['reward']:.3f}  advantage {state['advantage']:+.3f}  {metrics}")
        print(f"   {state['completion'][-1]['content']!r}")


if __name__ == "__main__":
    asyncio.run(main())
