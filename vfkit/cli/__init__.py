"""Command-line entry points: vf-eval, vf-rl, vf-train, vf-serve, vf-init, vf-install."""

import warnings

# Deprecation notices raised inside our dependencies, not by anything a vfkit user wrote or can
# change (PEFT asks transformers 5 for `is_gradient_checkpointing`): they would only bury the
# run's own lines in vf-train / vf-serve output. Warnings about the user's code are untouched.
_THIRD_PARTY_NOISE = (r"`is_gradient_checkpointing` is deprecated",)


def quiet_dependency_warnings() -> None:
    """Hide the dependency-internal deprecation notices above (called by the CLIs only)."""
    for message in _THIRD_PARTY_NOISE:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)
