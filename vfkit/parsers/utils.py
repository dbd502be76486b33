"""Small extract functions: to plug into parsers (`Parser(extract_fn=...)`), or to read the
number a reply ends on."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from vfkit.parsers.parser import message_text

if TYPE_CHECKING:
    from vfkit.parsers.xml_parser import XMLParser
    from vfkit.types import Messages

BOXED = "\\boxed{"
NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


def extract_boxed_answer(text: str) -> str:
    """The content of the last `\\boxed{...}` (braces balanced), or the text itself when none.

    >>> extract_boxed_answer(r"so \\boxed{\\frac{1}{2}}.")
    '\\\\frac{1}{2}'
    >>> extract_boxed_answer("42")
    '42'
    """
    if not isinstance(text, str):
        return ""
    start = text.rfind(BOXED)
    while start != -1:
        depth, i = 1, start + len(BOXED)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len(BOXED) : i - 1].strip()
        start = text.rfind(BOXED, 0, start)  # unbalanced (cut off): try an earlier box
    return text


def extract_last_number(text: str | None) -> str | None:
    """The last number in `text` as written ('-3', '2.5'), or None when it has none.

    >>> extract_last_number("3 then -4.5.")
    '-4.5'
    """
    numbers = NUMBER_RE.findall(text or "")
    return numbers[-1] if numbers else None


def final_number(parser: XMLParser, completion: Messages) -> str | None:
    """The number a tool-using reply ends on: in the last assistant turn that has text (turns
    that only call tools have none), the parser's answer field if tagged, else the whole text;
    then the last number there. A completion-mode `completion` (a string) is one turn."""
    if isinstance(completion, str):
        texts = [completion]
    else:
        texts = [t for t in map(message_text, parser.get_assistant_messages(completion)) if t]
    if not texts:
        return None
    tagged = getattr(parser.parse(texts[-1], last=True), parser.answer_field, None)
    return extract_last_number(tagged if tagged is not None else texts[-1])
