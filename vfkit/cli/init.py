"""`vf-init NAME`: scaffold a new environment package under environments/NAME.

    vf-init word-count            # environments/word-count/{pyproject.toml, word_count.py,
                                  #   README.md, tests/test_word_count.py}
    vf-install word-count && pytest environments/word-count

The package is the distribution `vfkit-word-count` with the module `word_count`. An id whose
module is already importable (`datasets`, `numpy`: installing the package would shadow it) or
that names the same module as a sibling folder (`my_env` beside `my-env`) is refused.
"""

from __future__ import annotations

import argparse
import importlib.util
import keyword
import re
import sys
from pathlib import Path

from vfkit.cli.init_templates import render
from vfkit.errors import ConfigError, VfkitError

NAME_RE = re.compile(r"^[a-z][a-z0-9]*([-_][a-z0-9]+)*$")


def module_name(name: str) -> str:
    """The importable module of an environment id: dashes become underscores."""
    return name.replace("-", "_")


def check_name(name: str) -> str:
    """Validate an environment id (lowercase, digits, single dashes/underscores) and return it."""
    if not NAME_RE.match(name):
        raise ConfigError(
            f"environment name {name!r} is not valid: use lowercase letters, digits and single "
            "dashes, starting with a letter (e.g. 'word-count')"
        )
    module = module_name(name)
    if keyword.iskeyword(module) or module in sys.stdlib_module_names or module == "vfkit":
        raise ConfigError(f"environment name {name!r} would shadow the module {module!r}; "
                          "pick another name")
    return name


def check_free(name: str, path: Path) -> None:
    """Refuse `name` when its module is taken: importable from elsewhere, or a sibling folder
    under `path` that normalises to the same module (`my_env` beside `my-env`)."""
    module = module_name(name)
    for sibling in sorted(path.iterdir()) if path.is_dir() else []:
        if sibling.name != name and module_name(sibling.name) == module:
            raise ConfigError(f"environment name {name!r} names the same module {module!r} as "
                              f"the existing {sibling}; use {sibling.name!r} or another name")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a broken installed package of that name: taken too
        spec = None
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if spec is not None and origin != (path / name / f"{module}.py").resolve():
        where = origin or "a namespace package"
        raise ConfigError(f"environment name {name!r} would shadow the installed module "
                          f"{module!r} ({where}); pick another name, e.g. {name}-env")


def init_environment(name: str, path: Path = Path("environments"), force: bool = False) -> Path:
    """Write the package for `name` under `path`; return its folder."""
    check_name(name)
    check_free(name, path)
    folder = path / name
    if folder.exists() and any(folder.iterdir()) and not force:
        raise VfkitError(f"{folder} already exists and is not empty; pick another name or pass "
                         "--force to overwrite its scaffold files")
    for rel, content in render(name, module_name(name)).items():
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    return folder


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vf-init", description="Scaffold a new environment package.")
    p.add_argument("name", help="environment id, e.g. word-count (module word_count)")
    p.add_argument("-p", "--path", type=Path, default=Path("environments"),
                   help="folder that holds environment packages (default: environments)")
    p.add_argument("--force", action="store_true", help="overwrite files of an existing folder")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of `vf-init`; prints the next steps; 1 on a user error."""
    args = build_parser().parse_args(argv)
    try:
        folder = init_environment(args.name, args.path, args.force)
    except VfkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    files = sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file())
    print(f"created {folder}/: {', '.join(files)}\n"
          f"next: vf-install {args.name} --path {args.path}  &&  pytest {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
