"""`vf-install NAME`: pip install -e environments/NAME into the interpreter running vf-install.

    vf-install reverse-text            # = python -m pip install -e environments/reverse-text
    vf-install my-env --path ../envs   # another folder of environment packages

pip builds in isolation, fetching the package's build backend (`[build-system] requires`) from
the index. Offline (no index, PIP_NO_INDEX) that fails even where this interpreter already has
the backend; then vf-install builds once more without isolation, with the backend installed
here, and says so. Where the backend is missing too, the error names what to install.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

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


def pip_command(
    folder: Path, editable: bool = True, verbose: bool = False, build_isolation: bool = True
) -> list[str]:
    """The pip command that installs `folder` into this interpreter (quiet: pip then prints
    only warnings and errors; without build isolation: with the build backend installed here)."""
    target = ["-e", str(folder)] if editable else [str(folder)]
    return [sys.executable, "-m", "pip", "install", *([] if verbose else ["-q"]),
            *([] if build_isolation else ["--no-build-isolation"]), *target]


def missing_build_requirements(folder: Path) -> list[str]:
    """The package's build requirements that this interpreter does not satisfy (PEP 518's
    default, setuptools, where the pyproject names none)."""
    with (folder / "pyproject.toml").open("rb") as f:
        build_system = tomllib.load(f).get("build-system", {})
    missing = []
    for text in build_system.get("requires", ["setuptools>=40.8.0"]):
        try:
            req = Requirement(text)
        except InvalidRequirement:
            missing.append(text)
            continue
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            version = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(text)
            continue
        if not req.specifier.contains(version, prereleases=True):
            missing.append(f"{text} (installed: {version})")
    return missing


def install(
    name: str, path: Path = Path("environments"), editable: bool = True, verbose: bool = False
) -> Path:
    """Install environment `name` from `path` with pip; raise VfkitError when pip fails.

    When the isolated build fails and the build backend is installed here, try once more
    without build isolation (an offline machine cannot fetch the backend)."""
    folder = find_package(name, path)
    cmd = pip_command(folder, editable, verbose)
    print("running:", " ".join(cmd), flush=True)
    if subprocess.run(cmd, check=False).returncode == 0:
        return folder
    missing = missing_build_requirements(folder)
    if missing:
        raise VfkitError(
            f"pip could not install {folder} (its output is above). If it could not fetch the "
            f"build backend (offline?), install {', '.join(missing)} for {sys.executable} and "
            "run vf-install again: it then builds with the backend installed here. Otherwise "
            "fix the package's pyproject.toml or dependencies.")
    cmd = pip_command(folder, editable, verbose, build_isolation=False)
    print("the isolated build failed (offline, or no index?); the build backend is installed "
          "here, so trying again without build isolation:\nrunning:", " ".join(cmd), flush=True)
    if subprocess.run(cmd, check=False).returncode != 0:
        raise VfkitError(f"pip could not install {folder}, with or without build isolation "
                         "(its output is above); fix the package's pyproject.toml or "
                         "dependencies and run vf-install again")
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
