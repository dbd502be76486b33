"""The `vf-rl` command: parse, check, then run in tmux or in the foreground.

vf-rl configs/exp.toml [KEY=VALUE ...]   run (tmux when on a terminal, else foreground)
vf-rl --dry-run configs/exp.toml         check everything, print the plan, start nothing
vf-rl report RUN | watch RUN             the run report; a live view of a run
vf-rl --clean RUN                        remove transient state, keep results
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from vfkit.errors import ConfigError, VfkitError
from vfkit.launch import tmux
from vfkit.launch.preflight import (
    Check,
    check_fresh_or_resumed,
    check_not_running,
    run_preflight,
)
from vfkit.train.rundir import RunDir, resolve_run_dir

if TYPE_CHECKING:
    from vfkit.train.config import RunConfig


def seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0 (`--health-timeout nan` is refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number of seconds > 0")
    return value


def count(text: str) -> int:
    """argparse type: a whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vf-rl",
        description="Train with RL: inference server + trainer from one TOML config.",
        epilog="Also: `vf-rl report RUN` (report.html) and `vf-rl watch RUN` (live metrics).",
    )
    p.add_argument("config", nargs="?", help="run config TOML (e.g. configs/exp.toml)")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="config overrides, e.g. trainer.args.max_steps=5",
    )
    p.add_argument("--dry-run", action="store_true", help="check everything, print the plan, exit")
    p.add_argument("--clean", metavar="RUN", help="remove RUN's transient state (keeps results)")
    p.add_argument("-s", "--session", help="tmux session name (default: the run name)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--tmux", action="store_true", help="use tmux even without a terminal")
    mode.add_argument("--no-tmux", action="store_true", help="run in the foreground")
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        metavar="CHECKPOINT",
        help="continue from the latest (or the given) checkpoint",
    )
    p.add_argument(
        "--health-timeout",
        type=seconds,
        default=600.0,
        help="seconds to wait for the server's /health (default 600)",
    )
    p.add_argument(
        "--max-restarts",
        type=count,
        default=3,
        help="server restarts allowed if it dies mid-run (default 3)",
    )
    p.add_argument(
        "--stop-timeout",
        type=seconds,
        default=900.0,
        help="seconds the trainer may take to finish its step after Ctrl-C",
    )
    p.add_argument("--no-report", action="store_true", help="skip report.html at the end")
    p.add_argument("--tmux-pane", metavar="SESSION", help=argparse.SUPPRESS)
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Flags and KEY=VALUE overrides in any order (`vf-rl cfg.toml --no-tmux k=v` as README)."""
    args = build_parser().parse_intermixed_args(argv)
    if args.resume and "=" in args.resume and not Path(args.resume).exists():
        args.overrides.append(args.resume)  # `--resume k=v`: k=v is an override
        args.resume = "latest"
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point of `vf-rl`; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in ("report", "watch"):
            return _subcommand(argv[0], argv[1:])
        args = parse_args(argv)
        if args.clean:
            return _clean(args.clean)
        if not args.config:
            build_parser().error("give a config TOML (e.g. vf-rl configs/exp.toml)")
        if args.tmux_pane:
            return _in_pane(args)
        return _run(args)
    except VfkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1 if not isinstance(exc, ConfigError) else 2


def _in_pane(args: argparse.Namespace) -> int:
    """The supervisor inside its tmux pane: whatever happens, the session closes at the end."""
    try:
        return _run(args)
    except VfkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        tmux.wait_for_enter_if_attached(args.tmux_pane)  # the last lines stay readable
        tmux.kill_session(args.tmux_pane)  # closes the log and metrics views (and this pane)


def _subcommand(name: str, argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog=f"vf-rl {name}")
    p.add_argument("run", help="the run folder (outputs/<run>) or its name")
    if name == "report":
        p.add_argument("--out", type=Path, help="write report.html + report/*.png here instead")
    if name == "watch":
        p.add_argument("--log", choices=("server", "trainer"), help="follow a log instead")
        p.add_argument("--interval", type=seconds, default=2.0, help="refresh period in seconds")
        p.add_argument("--pane", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    run = resolve_run_dir(args.run)
    if name == "report":
        from vfkit.launch.report import write_report

        try:
            print(write_report(run, args.out))
        except FileNotFoundError as exc:
            raise VfkitError(str(exc)) from None
        return 0
    from vfkit.launch.watch import follow_log, watch_metrics

    try:
        if args.log:
            return follow_log(run, args.log, pane=args.pane)
        return watch_metrics(run, interval=args.interval, pane=args.pane)
    except KeyboardInterrupt:
        return 0


def _clean(run_arg: str) -> int:
    from vfkit.launch.clean import clean_run

    run = resolve_run_dir(run_arg)
    done = clean_run(run)
    for line in done or [f"nothing to clean in {run.root}"]:
        print(line)
    print(f"kept: config, metrics, rollouts, adapters, checkpoints, logs in {run.root}")
    return 0


def _mode(args: argparse.Namespace) -> tuple[str, Check]:
    """tmux or foreground, and why (a Check line for the dry run)."""
    if args.tmux_pane:
        return "foreground", Check("mode", True, f"inside tmux session {args.tmux_pane}")
    if args.no_tmux:
        return "foreground", Check("mode", True, "foreground (--no-tmux)")
    if tmux.tmux_path() is None:
        if args.tmux:
            return "tmux", Check(
                "mode",
                False,
                "--tmux given but tmux is not installed (apt-get install tmux, or drop --tmux)",
            )
        return "foreground", Check("mode", True, "foreground: tmux is not installed")
    if args.tmux or sys.stdout.isatty():
        return "tmux", Check("mode", True, "tmux (attach when on a terminal)")
    return "foreground", Check("mode", True, "foreground: stdout is not a terminal")


def _run(args: argparse.Namespace) -> int:
    from vfkit.train.config_loader import load_config
    from vfkit.train.run_checks import require_static_checks

    cfg = load_config(args.config, args.overrides)
    mode, mode_check = _mode(args)
    if args.dry_run:
        return _dry_run(args, cfg, mode_check)
    from vfkit.launch.plan import make_plan

    plan = make_plan(cfg, args.config, args.overrides, resume=args.resume)
    session = tmux.session_name(args.session or args.tmux_pane or plan.run.name)
    if not args.tmux_pane:  # the pane's supervisor runs after these checks passed here
        require_static_checks(cfg)
    for check in (check_not_running(plan.run), check_fresh_or_resumed(cfg, plan.run, args.resume),
                  mode_check):  # fmt: skip
        if not check.ok:
            raise VfkitError(check.detail)
    if mode == "tmux":
        return _start_tmux(args, plan.run, session)
    from vfkit.launch.runner import run_foreground

    return run_foreground(cfg, plan, args, tmux_session=args.tmux_pane)


def _dry_run(args: argparse.Namespace, cfg: RunConfig, mode_check: Check) -> int:
    from vfkit.launch.plan import format_plan

    checks, plan = run_preflight(
        cfg, args.config, args.overrides, mode=mode_check, resume=args.resume
    )
    print(f"✓ {'config':<12} {args.config} is valid")
    for check in checks:
        print(check.line())
    print()
    print(format_plan(plan, cfg, mode_check.detail))
    failed = [c for c in checks if not c.ok]
    print(
        f"\n{len(failed)} problem(s): fix them before running" if failed else "\nall checks passed"
    )
    return 1 if failed else 0


def _start_tmux(args: argparse.Namespace, run: RunDir, session: str) -> int:
    passthrough = [
        args.config,
        *args.overrides,
        "--health-timeout",
        str(args.health_timeout),
        "--max-restarts",
        str(args.max_restarts),
        "--stop-timeout",
        str(args.stop_timeout),
    ]
    if args.resume:
        passthrough += ["--resume", args.resume]
    if args.no_report:
        passthrough.append("--no-report")
    tmux.start_session(session, run, passthrough)
    return show_session(session, run, interactive=sys.stdout.isatty() and sys.stdin.isatty())


def show_session(session: str, run: RunDir, *, interactive: bool) -> int:
    """Attach to the run's session when on a terminal; otherwise, or when tmux cannot show it
    here, say where the run is. The run goes on in its session either way: exit 0."""
    problem = tmux.attach(session) if interactive else "not on a terminal"
    if problem is None:
        return 0
    print(f"the run goes on in tmux session {session!r} (not shown here: {problem})")
    print(f"  attach:     tmux attach -t {session}  (inside tmux: tmux switch-client -t {session})")
    print(f"  run folder: {run.root}")
    print(f"  live metrics: vf-rl watch {run.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
