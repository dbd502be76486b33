"""vfkit's exception hierarchy: every user-facing error names what is wrong and what to do."""

from __future__ import annotations


class VfkitError(Exception):
    """Base class for errors vfkit raises on purpose (CLIs print them without a traceback)."""


class ConfigError(VfkitError, ValueError):
    """A config key, value or combination is wrong; the message names the key and its line."""


class EnvironmentNotFoundError(VfkitError, ImportError):
    """`load_environment(env_id)` found no module for the id."""


class ServerError(VfkitError):
    """The inference server is unreachable, refused a request, or answered something unusable."""


class ContextOverflowError(ServerError):
    """The prompt (plus max_tokens) does not fit the model's context. `room`: the completion
    tokens the context still has after the prompt, when the server's message says (0: none)."""

    def __init__(self, message: str, room: int | None = None) -> None:
        super().__init__(message)
        self.room = room


class RolloutError(VfkitError):
    """A single rollout failed; recorded on its state, never fatal to the batch."""


class AdapterSyncError(VfkitError):
    """A trained adapter could not be loaded into, or verified on, the inference server."""
