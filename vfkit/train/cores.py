"""CPU cores follow the work: the trainer takes every core while no rollout is generating.

On a CPU shared with the builtin server, `placement.cpu_threads` splits the cores (two processes
that each take every core thrash). But the split is only right while both work: with
async_level 1 the next batch is usually generated in the first part of a training step, and
for the rest of the step the server's cores idle. `CoreShare` is asked before each
micro-batch and gives the trainer every core while nothing is generating, its share otherwise.

    cores = CoreShare(share=1, total=2)
    cores.generating = source.generating       # the batch source knows what is in flight
    cores.fit()                                 # before each micro-batch: 1 or 2 threads
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
