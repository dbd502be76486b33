"""Compatibility with classic verifiers (0.1.x): its environments run in vfkit unmodified.

- `vfkit.compat.verifiers`: the 0.1.x API (`vf.SingleTurnEnv`, `vf.XMLParser`, `vf.Rubric`,
  `load_example_dataset`, `evaluate_sync`, ...) mapped onto vfkit's classes;
- `classic_verifiers()`: exposes it as `verifiers` while an environment module is imported,
  only when the real verifiers is not installed (`vfkit.load_environment` does this for you).

What differs from classic on purpose is listed in vfkit/compat/README.md.
"""

from vfkit.compat.importer import classic_verifiers, missing_verifiers, real_verifiers_installed

__all__ = ["classic_verifiers", "missing_verifiers", "real_verifiers_installed"]
