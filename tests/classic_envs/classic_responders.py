"""Scripted model replies for the classic fixture environments (TestServer responders).

Each responder varies its reply with how many times it has seen the same conversation, so the
rollouts of a group earn different rewards (training then has a non-zero advantage).
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from typing import Any


class Counted:
    """k-th request with a given conversation -> `reply(body, k)`."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def key(self, messages: list[dict[str, Any]]) -> str:
        return json.dumps(messages)

    def __call__(self, body: dict[str, Any]) -> str:
        key = self.key(body["messages"])
        with self.lock:
            k = self.counts[key]
            self.counts[key] += 1
        return self.reply(body["messages"], k)

    def reply(self, messages: list[dict[str, Any]], k: int) -> str:
        raise NotImplementedError


class XmlQa(Counted):
    """Right answer well formatted, wrong answer, right answer without tags (alternating)."""

    def reply(self, messages: list[dict[str, Any]], k: int) -> str:
        a, b = map(int, re.findall(r"\d+", messages[-1]["content"])[:2])
        return [f"<think>\nadd\n</think>\n<answer>\n{a + b}\n</answer>",
                f"<think>\nguess\n</think>\n<answer>\n{a + b + 1}\n</answer>",
                f"{a + b}"][k % 3]


class Guess(Counted):
    """Guesses 3 first, then (after a hint) the number the hint points at: 2 or 4."""

    def reply(self, messages: list[dict[str, Any]], k: int) -> str:
        last = messages[-1]["content"]
        if "lower" in last:
            return "2"
        if "higher" in last:
            return "4" if k % 2 == 0 else "5"
        return "3"


class Tools(Counted):
    """Calls add, then answers with the tool's result (or, every other time, a wrong number)."""

    def key(self, messages: list[dict[str, Any]]) -> str:  # tool call ids differ per request
        return json.dumps([messages[1]["content"], len(messages)])

    def reply(self, messages: list[dict[str, Any]], k: int) -> str:
        last = messages[-1]
        if last["role"] == "tool":
            value = int(last["content"])
            return f"<answer>{value if k % 2 == 0 else value + 1}</answer>"
        a, b = map(int, re.findall(r"\d+", last["content"])[:2])
        return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


RESPONDERS = {"classic-xml-qa": XmlQa, "classic-guess": Guess, "classic-tools": Tools}
