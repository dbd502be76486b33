"""CPU cores follow the work: the trainer takes every core while no rollout is generating,
and a builtin server on the same CPU takes every core while the trainer waits for a batch.

On a CPU shared with the builtin server, `placement.cpu_threads` splits the cores (two processes
that each take every core thrash). But the split is only right while both work: with
async_level 1 the next batch is usually generated in the first part of a training step, and
for the rest of the step the server's cores idle. `CoreShare` is asked before each
micro-batch and gives the trainer every core while nothing is generating, its share otherwise.
The other way round, when training is the shorter half (a group's prompt runs once, update.py),
the trainer's cores idle while the server generates: `ServerThreads` lends them to the server.

    cores = CoreShare(share=1, total=2)
    cores.generating = source.generating       # the batch source knows what is in flight
    cores.fit()                                 # before each micro-batch: 1 or 2 threads
    server = ServerThreads("http://127.0.0.1:8000", share=1, total=2)
    server.training(True)                       # around each update: the server 1, then 2
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class CoreShare:
    """The trainer's torch thread count on a CPU it shares with a local inference server."""

    share: int  # threads while the server generates (placement.cpu_threads' trainer part)
    total: int  # threads while it does not: every core
    generating: Callable[[], bool] = field(default=lambda: True)
    switches: int = 0  # thread-count changes so far (metrics)

    def wanted(self) -> int:
        return self.share if self.generating() else self.total

    def fit(self) -> int:
        """Set torch's intra-op threads for the next piece of work; the count now in effect."""
        import torch

        n = self.wanted()
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
            self.switches += 1
        return n


@dataclass
class ServerThreads:
    """The CPU threads of a builtin server on this machine, set through its POST /threads:
    every core while the trainer waits for a batch, its share while the trainer trains (so
    generation, often the longer half of a step, is not left on one core).

    Best effort: a server that does not answer (restarting, or not vf-serve) keeps the threads
    it has, the run goes on, and the next change tries again; the first failure is reported.
    """

    url: str  # the server's root (no /v1)
    share: int  # its threads while the trainer trains
    total: int  # while the trainer waits: every core
    api_key: str | None = None
    current: int | None = None
    failures: int = 0

    def training(self, busy: bool) -> None:
        """The trainer starts (`busy`) or ends an update: resize the server for it."""
        self.set(self.share if busy else self.total)

    def set(self, threads: int) -> None:
        import sys

        import httpx

        if threads == self.current:
            return
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            httpx.post(f"{self.url}/threads", json={"threads": threads}, headers=headers,
                       timeout=5.0).raise_for_status()
        except httpx.HTTPError as exc:
            self.current, self.failures = None, self.failures + 1
            if self.failures == 1:
                print(f"vf-train: could not set the server's CPU threads ({self.url}/threads: "
                      f"{exc!r}); it keeps its own, the run goes on", file=sys.stderr, flush=True)
            return
        self.current = threads
