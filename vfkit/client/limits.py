"""Sequence limits: how many tokens a prompt, one model call and one trained sequence may hold.

The one owner of that arithmetic. The rollout engine caps each call's `max_tokens`, the token
parser cuts what a server returned past the limit, the dataset filter drops long prompts, the
trainer drops sequences that do not fit, and the preflight checks compare config values, all
through `SequenceLimits`:

    limits = SequenceLimits(max_seq_len=256, max_prompt_len=128)
    limits.completion_budget(200)     # 56: the most max_tokens a call with a 200-token prompt gets
    limits.prompt_fits(129)           # False: dropped from the dataset (counted)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SequenceLimits:
    """`max_seq_len`: prompt + completion tokens; `max_prompt_len`: dataset prompts. None = none."""

    max_seq_len: int | None = None
    max_prompt_len: int | None = None

    def prompt_fits(self, prompt_tokens: int) -> bool:
        """A dataset prompt short enough to train on."""
        return self.max_prompt_len is None or prompt_tokens <= self.max_prompt_len

    def sequence_fits(self, tokens: int) -> bool:
        """A whole sequence (prompt + completions) short enough to train on."""
        return self.max_seq_len is None or tokens <= self.max_seq_len

    def completion_budget(self, prompt_tokens: int) -> int | None:
        """Tokens a call may still generate after `prompt_tokens` (<= 0: the prompt is too long;
        None: no limit)."""
        return None if self.max_seq_len is None else self.max_seq_len - prompt_tokens

    def clip(
        self, prompt_ids: list[int], completion_ids: list[int]
    ) -> tuple[int, int, bool]:
        """(prompt tokens kept, completion tokens kept, prompt overlong) for one model call.

        A prompt over the limit keeps `max_seq_len` tokens and no completion; a completion that
        runs past the limit is cut there.
        """
        budget = self.completion_budget(len(prompt_ids))
        if budget is None:
            return len(prompt_ids), len(completion_ids), False
        if budget < 0:
            return len(prompt_ids) + budget, 0, True
        return len(prompt_ids), min(len(completion_ids), budget), False
