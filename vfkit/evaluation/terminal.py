"""Text that vf-eval prints: model output and error messages made safe for a terminal.

A completion may hold escape sequences (colours, cursor moves, a cleared screen, a rewritten
title) or bidirectional overrides that make text read other than it is. What vf-eval shows has
them written out visibly instead; results.jsonl keeps the text exactly as the model wrote it.

    printable("ok \\x1b[31mRED")   # 'ok \\\\x1b[31mRED'
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

# C0 controls but tab and newline, DEL, C1 controls, and the bidi marks / embeddings /
# overrides / isolates (Trojan Source)
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with terminal control and bidi characters written as visible escapes."""
    return _UNSAFE.sub(_escape, text)


class RewriteLogs(logging.Filter):
    """A logging filter that passes every record's message through `rewrite`: `printable`
    (errors quote model outputs), `urls.redact_text` (httpx logs URLs with passwords)."""

    def __init__(self, rewrite: Callable[[str], str]) -> None:
        super().__init__()
        self.rewrite = rewrite

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        rewritten = self.rewrite(message)
        if rewritten != message:
            record.msg, record.args = rewritten, None
        return True
