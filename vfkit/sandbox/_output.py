"""The run's stdout and stderr as the parent reads them: capped, and cut off when flooded.

Each stream keeps its first `cap` bytes. Past the cap the rest is read and counted (so that a
program that prints somewhat too much still finishes, with an exact count) up to `DRAIN_BYTES`
more; then reading stops and the reader tells the parent to kill the run. Without that, a
program writing in a loop made the parent read gigabytes (3.8 GB in 5 s in a review) and spend
its CPU on them until the wall clock ran out.
"""

from __future__ import annotations

import asyncio

DRAIN_BYTES = 1 << 20  # read and dropped past the cap before the run is stopped


async def read_capped(stream: asyncio.StreamReader, cap: int, flooded: asyncio.Event,
                      ended: asyncio.Event) -> tuple[bytes, int, bool]:
    """Read a stream, keeping the first `cap` bytes; return (kept, total read, stopped early).
    Stops, and sets `flooded`, once more than `cap + DRAIN_BYTES` bytes came; then, once the
    run has `ended`, empties the pipe (at most its buffer: the writers are dead) so that its
    transport closes."""
    kept = bytearray()
    total = 0
    while chunk := await stream.read(65_536):
        total += len(chunk)
        if len(kept) < cap:
            kept += chunk[: cap - len(kept)]
        if total > cap + DRAIN_BYTES:
            flooded.set()
            await ended.wait()
            while await stream.read(65_536):
                pass
            return bytes(kept), total, True
    return bytes(kept), total, False


def decode(data: bytes, total: int, stopped: bool) -> str:
    """The kept bytes as text, with a note of what was dropped."""
    text = data.decode("utf-8", errors="replace")
    if stopped:
        text += f"\n... [output truncated: the run was stopped after {total} bytes]"
    elif total > len(data):
        text += f"\n... [output truncated: {total - len(data)} more bytes]"
    return text
