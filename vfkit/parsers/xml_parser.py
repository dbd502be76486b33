"""XMLParser: answers written as `<field>...</field>` blocks, e.g. `<think>` then `<answer>`.

A field may have alternative tag names: `("answer", "final")` reads `<answer>` or `<final>` into
the attribute `answer`. Parsing never raises; the format reward gives no credit to a message with
unclosed, mismatched, repeated or out-of-order tags, so a model cannot earn format reward for tag
soup.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from vfkit.parsers.parser import Parser, message_text
from vfkit.types import Messages

FieldSpec = str | tuple[str, ...]


def _normalize_fields(fields: Sequence[FieldSpec]) -> list[tuple[str, ...]]:
    """Each field as (canonical, *alternatives); rejects empty, non-identifier or repeated names."""
    if isinstance(fields, str) or not fields:
        raise ValueError("XMLParser needs a non-empty list of fields, e.g. ['think', 'answer']")
    normalized, seen = [], set()
    for spec in fields:
        names = (spec,) if isinstance(spec, str) else tuple(spec)
        if not names:
            raise ValueError("XMLParser: an empty tuple is not a field; give ('name', 'alt', ...)")
        for name in names:
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"XMLParser: field name {name!r} must be a Python identifier")
            if name in seen:
                raise ValueError(f"XMLParser: field name {name!r} appears twice in {fields!r}")
            seen.add(name)
        normalized.append(names)
    return normalized


class XMLParser(Parser):
    """Parses `<field>...</field>` blocks; `parse_answer` returns the `answer_field` content.

    >>> p = XMLParser(["think", ("answer", "final")])
    >>> p.parse("<think>2+2</think><final>4</final>").answer
    '4'
    >>> p.format(think="2+2", answer="4")
    '<think>\\n2+2\\n</think>\\n<answer>\\n4\\n</answer>'

    `parse` takes the first occurrence of each field (`last=True`: the last one); `parse_answer`
    takes the last occurrence in the last assistant message that has the answer field
    (`answer_field`, "answer" by default; it must name one of the fields, or one of its
    alternative names).
    """

    def __init__(self, fields: Sequence[FieldSpec], answer_field: str = "answer", **kwargs: Any):
        super().__init__(**kwargs)
        self._fields = _normalize_fields(fields)
        self._canonical = {name: names[0] for names in self._fields for name in names}
        if answer_field not in self._canonical:  # parse_answer would always be None
            raise ValueError(
                f"XMLParser: answer_field {answer_field!r} is not one of the fields "
                f"{self.get_fields()}; pass answer_field=<the field holding the answer>, e.g. "
                f"XMLParser({list(fields)!r}, answer_field={self.get_fields()[-1]!r})"
            )
        self.answer_field = self._canonical[answer_field]  # an alternative name reads its field
        alternation = "|".join(re.escape(name) for name in self._canonical)
        self._tag_re = re.compile(rf"<(/?)({alternation})>")
        self._block_res = {
            name: re.compile(rf"<{re.escape(name)}>(.*?)</{re.escape(name)}>", re.DOTALL)
            for name in self._canonical
        }

    def get_fields(self) -> list[str]:
        """The canonical field names, in order."""
        return [names[0] for names in self._fields]

    def parse(self, text: str, strip: bool = True, last: bool = False) -> SimpleNamespace:
        """An object with one attribute per canonical field: its content, or None when absent."""
        text = text if isinstance(text, str) else ""
        result = SimpleNamespace()
        for names in self._fields:
            matches = [m for name in names for m in self._block_res[name].finditer(text)]
            pick = max if last else min
            best = pick(matches, key=lambda m: m.start()) if matches else None
            value = None if best is None else best.group(1)
            if value is not None and strip:
                value = value.strip()
            setattr(result, names[0], value)
        return result

    def parse_answer(self, completion: Messages) -> str | None:
        """The answer field of the last assistant message that has one (None when none has)."""
        if isinstance(completion, str):
            return getattr(self.parse(completion, last=True), self.answer_field, None)
        for message in reversed(self.get_assistant_messages(completion)):
            value = getattr(self.parse(message_text(message), last=True), self.answer_field, None)
            if value is not None:
                return value
        return None

    def format(self, **kwargs: Any) -> str:
        """Render fields as XML blocks in declared order; omitted fields are left out.

        Any name of a field (canonical or alternative) may be used; unknown names raise ValueError.
        """
        unknown = sorted(set(kwargs) - set(self._canonical))
        if unknown:
            raise ValueError(
                f"XMLParser.format: unknown field(s) {unknown}; known fields: {self.get_fields()}"
            )
        blocks = []
        for names in self._fields:
            for name in names:
                if name in kwargs:
                    blocks.append(f"<{name}>\n{kwargs[name]}\n</{name}>")
                    break
        return "\n".join(blocks)

    def get_format_str(self) -> str:
        """A description of the expected format, for system prompts."""
        lines = []
        for names in self._fields:
            tag = names[0] if len(names) == 1 else f"[{' | '.join(names)}]"
            lines.append(f"<{tag}>\n...\n</{tag}>")
        return "\n".join(lines)

    def format_score(self, text: str) -> float:
        """k/n when k of the n fields appear once each, as matched tag pairs, in declared order.

        Any unclosed, mismatched (`<answer>x</think>`), nested, repeated or out-of-order tag of
        a known field makes the message score 0.
        """
        if not isinstance(text, str):
            return 0.0
        completed: list[str] = []
        open_name: str | None = None
        for match in self._tag_re.finditer(text):
            is_close, name = match.group(1) == "/", match.group(2)
            if open_name is None:
                if is_close:
                    return 0.0
                open_name = name
                continue
            if not is_close or name != open_name:
                return 0.0
            canonical = self._canonical[name]
            if canonical in completed:
                return 0.0
            completed.append(canonical)
            open_name = None
        if open_name is not None:
            return 0.0
        order = self.get_fields()
        positions = [order.index(name) for name in completed]
        if positions != sorted(positions):
            return 0.0
        return len(completed) / len(order)
