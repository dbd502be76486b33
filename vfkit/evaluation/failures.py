"""Failed rollouts that are not results: the model's server gave no answer.

A rollout whose model call got no answer says nothing about the model or the environment: the
server could not be reached (connection refused or reset, a timeout), could not answer (a 5xx or
429 still there after the client's retries), or refused to serve this client at all (401 key
refused, 403 permission denied, 404 no such route or model). vf-eval does not save such a
rollout: the run is marked incomplete and `--resume`, once the cause is fixed, runs exactly those
rollouts again.

Every other failure is data and is saved as a row with its `error`: an environment that raised,
or a request the server answered with another 4xx (a 400 for a bad value). Such a rollout has no
reward, so it is left out of the means and counted next to them (`results.Summary`); a reward
function that raised still scores its row (reward 0 for that function), as the design says.

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

# "the server gave no answer" -> what to check; openai's types, httpx's and the builtins'
_NOT_REACHED = "is the server up and reachable? (restart it if it died)"
_KEY = "the server refused the API key: check the variable -k/--api-key-var names"
NO_ANSWER_HINTS: dict[str, str] = {
    **{cls.__name__: _NOT_REACHED for cls in (
        openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError,
        openai.RateLimitError, ConnectionError, ConnectionRefusedError, ConnectionResetError,
        ConnectionAbortedError, BrokenPipeError, TimeoutError,
    )},
    **dict.fromkeys(("ConnectError", "ReadError", "WriteError", "RemoteProtocolError",
                     "ReadTimeout", "ConnectTimeout", "WriteTimeout", "PoolTimeout"),
                    _NOT_REACHED),  # httpx, for environments that use it
    openai.AuthenticationError.__name__: _KEY,
    openai.PermissionDeniedError.__name__: _KEY + " (and that it may use this model)",
    openai.NotFoundError.__name__: (
        "the server has no such route or model: does the base URL (-b/--api-base-url, or the "
        "registry entry's url) end in /v1, and does the server serve the model -m names?"
    ),
}
INFRA_ERROR_TYPES = frozenset(NO_ANSWER_HINTS)

# This many infrastructure failures in a row, with no rollout answered between them, stop the
# run at once: the server is down (or refuses this client), and waiting for every remaining
# rollout's retries would only delay the "fix it and --resume" message.
STOP_AFTER_FAILURES_IN_A_ROW = 8


def _type_name(error: str) -> str:
    return error.partition(":")[0].strip().rpartition(".")[2]


def infrastructure_error(state: dict[str, Any]) -> str | None:
    """The state's error when its rollout failed for lack of a server answer, else None."""
    if state.get("stop_condition") != StopCondition.ERROR.value:
        return None
    error = str(state.get("error") or "")
    return error if _type_name(error) in INFRA_ERROR_TYPES else None


def no_answer_hint(error: str) -> str:
    """What to check for a "no answer" error (see NO_ANSWER_HINTS)."""
    return NO_ANSWER_HINTS.get(_type_name(error), _NOT_REACHED)


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
            first = self.most_common()
            raise ServerStoppedAnswering(
                f"the server at {self.base_url} stopped answering: {self.in_a_row} rollouts in "
                f"a row failed ({first}); their rows were not saved; {no_answer_hint(first)}"
            )

    def most_common(self) -> str:
        return self.reasons.most_common(1)[0][0] if self.reasons else ""

    def as_metadata(self) -> dict[str, Any]:
        """metadata.json's account of the failures (reason -> count, most frequent first)."""
        return {"failed_rollouts": self.count, "failure_reasons": dict(self.reasons.most_common())}
