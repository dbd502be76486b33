"""Does each turn's prompt extend the previous turn's tokens? (multi-turn token consistency)

A trainer may concatenate a multi-turn rollout into one sequence only when, for every step k+1,
`prompt_ids[k+1]` starts with `prompt_ids[k] + completion_ids[k]`: then the tokens the model
sampled are exactly the tokens it later sees as context.

The comparison is a prefix test on the server's ids, never on re-tokenized text. With a ChatML
template the sampled ids end with `<|im_end|>` and the template adds "\\n" after it; that newline
(and the next turn's header) lies after the prefix, so it needs no special case. A completion cut
at max_tokens (no eos) still extends when the template closes the turn after the raw text. What
breaks extension is a template that rewrites history: stripping earlier `<think>` blocks,
trimming whitespace from content, or re-serialising tool-call arguments differently.

In completion mode the next prompt is the previous prompt + completion *text*, tokenized again:
the eos the model sampled to stop (the last id of a completion that finished with "stop") is not
in that text, so it is left out of the comparison.
"""

from __future__ import annotations

from collections.abc import Sequence

from vfkit.types import TrajectoryStep


def step_extends(previous: TrajectoryStep, current: TrajectoryStep) -> bool | None:
    """True/False when both steps have token ids; None when either lacks them."""
    prev, cur = previous.get("tokens"), current.get("tokens")
    if not prev or not cur or prev.get("overlong_prompt") or cur.get("overlong_prompt"):
        return None
    head = list(prev["prompt_ids"]) + list(prev["completion_ids"])
    if list(cur["prompt_ids"][: len(head)]) == head:
        return True
    if isinstance(previous.get("prompt"), str) and stopped(previous) and prev["completion_ids"]:
        head = head[:-1]  # the sampled eos: no text of the next prompt holds it
        return list(cur["prompt_ids"][: len(head)]) == head
    return False


def stopped(step: TrajectoryStep) -> bool:
    """Whether the step's model call ended on its own (finish_reason "stop": an eos sampled)."""
    choices = (step.get("response") or {}).get("choices") or [{}]
    return choices[0].get("finish_reason") == "stop"


def extension_breaks(trajectory: Sequence[TrajectoryStep]) -> list[int]:
    """Indices k >= 1 of the steps whose prompt ids do not extend step k-1's prompt + completion."""
    return [
        k for k in range(1, len(trajectory))
        if step_extends(trajectory[k - 1], trajectory[k]) is False
    ]


def check_extension(trajectory: Sequence[TrajectoryStep]) -> bool:
    """True when every consecutive pair of steps with token ids extends (see module doc)."""
    return not extension_breaks(trajectory)
