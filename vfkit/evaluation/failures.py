"""Failed rollouts that are not results: the model's server could not be reached or answer.

A rollout whose model call got no answer (connection refused or reset, a timeout, a 5xx or 429
still there after the client's retries) says nothing about the model or the environment. vf-eval
does not save it: the run is marked incomplete and `--resume` runs exactly those rollouts again.
Everything else is data and is saved as a row with its `error`: an environment that raised, a
request the server refused (4xx), and a reward function that raised (a scored row, reward 0).

The engine records a failure on the state as "Type: message" with stop_condition "error"
(`vfkit.envs.async_utils.error_text`), so the exception's type name is what is read here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import openai

from vfkit.errors import ServerError
from vfkit.types import StopCondition

# Exception types that mean "no answer from the server" (openai's, httpx's and the builtins').
INFRA_ERROR_TYPES = frozenset(
    cls.__name__
    for cls in (
        openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError,
        openai.RateLimitError, ConnectionError, ConnectionRefusedError, ConnectionResetError,
        ConnectionAbortedError, BrokenPipeError, TimeoutError,
    )
) | {"ConnectError", "ReadError", "WriteError", "RemoteProtocolError", "ReadTimeout",
     "ConnectTimeout", "WriteTimeout", "PoolTimeout"}  # httpx, for environments that use it

# This many infrastructure failures in a row, with no rollout answered between them, stop the
# run at once: the server is down, and waiting for every remaining rollout's retries would only
# delay the "restart it and --resume" message.
STOP_AFTER_FAILURES_IN_A_ROW = 8


def infrastructure_error(state: dict[str, Any]) -> str | None:
    """The state's error when its rollout failed for lack of a server answer, else None."""
    if state.get("stop_condition") != StopCondition.ERROR.value:
        return None
    error = str(state.get("error") or "")
    type_name = error.partition(":")[0].strip().rpartition(".")[2]
    return error if type_name in INFRA_ERROR_TYPES else None


class ServerStoppedAnswering(ServerError):
    """Rollouts keep failing because the server does not answer; the run stops to be resumed."""


@dataclass
class FailureTally:
    """The rollouts of this session that failed for lack of a server answer (none are saved)."""

    base_url: str
    count: int = 0
    reasons: Counter = field(default_factory=Counter)
    in_a_row: int = 0

    def keep(self, state: dict[str, Any]) -> bool:
        """Count `state` if it failed for lack of an answer; True when it is a result to save."""
        error = infrastructure_error(state)
        if error is None:
            self.in_a_row = 0
            return True
        self.count += 1
        self.in_a_row += 1
        self.reasons[error[:200]] += 1
        return False

    def check(self) -> None:
        """Raise ServerStoppedAnswering once too many rollouts in a row got no answer."""
        if self.in_a_row >= STOP_AFTER_FAILURES_IN_A_ROW:
            raise ServerStoppedAnswering(
                f"the server at {self.base_url} stopped answering: {self.in_a_row} rollouts in "
                f"a row failed ({self.most_common()}); their rows were not saved"
            )

    def most_common(self) -> str:
        return self.reasons.most_common(1)[0][0] if self.reasons else ""

    def as_metadata(self) -> dict[str, Any]:
        """metadata.json's account of the failures (reason -> count, most frequent first)."""
        return {"failed_rollouts": self.count, "failure_reasons": dict(self.reasons.most_common())}
