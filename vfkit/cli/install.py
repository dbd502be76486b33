"""`vf-install NAME`: pip install -e environments/NAME into the interpreter running vf-install.

    vf-install reverse-text            # = python -m pip install -e environments/reverse-text
    vf-install my-env --path ../envs   # another folder of environment packages
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from vfkit.errors import EnvironmentNotFoundError, VfkitError


def available(path: Path) -> list[str]:
    """Environment packages (folders with a pyproject.toml) under `path`."""
    if not path.is_dir():
        return []
    return sorted(d.name for d in path.iterdir() if (d / "pyproject.toml").is_file())


def find_package(name: str, path: Path) -> Path:
    """The folder of environment `name` under `path` (dashes and underscores interchangeable)."""
    for candidate in dict.fromkeys((name, name.replace("_", "-"), name.replace("-", "_"))):
        folder = path / candidate
        if (folder / "pyproject.toml").is_file():
            return folder
    known = ", ".join(available(path)) or "none"
    raise EnvironmentNotFoundError(
        f"no environment package {name!r} in {path.resolve()} (a folder with a pyproject.toml); "
        f"found: {known}. Create one with `vf-init {name}`, or point --path at the folder that "
        "holds your environments."
    )


def pip_command(folder: Path, editable: bool = True, verbose: bool = False) -> list[str]:
    """The pip command that installs `folder` into this interpreter (quiet: pip then prints
    only warnings and errors)."""
    target = ["-e", str(folder)] if editable else [str(folder)]
    return [sys.executable, "-m", "pip", "install", *([] if verbose else ["-q"]), *target]


def install(
    name: str, path: Path = Path("environments"), editable: bool = True, verbose: bool = False
) -> Path:
    """Install environment `name` from `path` with pip; raise VfkitError when pip fails."""
    folder = find_package(name, path)
    cmd = pip_command(folder, editable, verbose)
    print("running:", " ".join(cmd), flush=True)
    if subprocess.run(cmd, check=False).returncode != 0:
        raise VfkitError(f"pip could not install {folder} (its output is above); fix the "
                         "package's pyproject.toml or dependencies and run vf-install again")
    return folder


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vf-install",
                                description="Install an environment package (editable).")
    p.add_argument("name", help="environment id, e.g. reverse-text")
    p.add_argument("-p", "--path", type=Path, default=Path("environments"),
                   help="folder that holds environment packages (default: environments)")
    p.add_argument("--no-editable", action="store_true", help="a regular (copied) install")
    p.add_argument("-v", "--verbose", action="store_true", help="show pip's whole output")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of `vf-install`; 0 installed, 1 not found or pip failed."""
    args = build_parser().parse_args(argv)
    try:
        folder = install(args.name, args.path, editable=not args.no_editable,
                         verbose=args.verbose)
    except VfkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"installed {folder} into {sys.prefix}; load it with "
          f"vfkit.load_environment({args.name!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
