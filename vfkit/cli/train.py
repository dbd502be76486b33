"""vf-train: RL-train a LoRA adapter from one TOML config.

    vf-train configs/exp.toml
    vf-train configs/exp.toml trainer.args.max_steps=5 trainer.args.learning_rate=2e-5
    vf-train configs/exp.toml --resume                     # latest checkpoint of the run
    vf-train configs/exp.toml --phase rollout | update     # split sampling and training

Before any weight loads, the config is checked against what it names (vfkit/train/run_checks.py,
the same checks as `vf-rl --dry-run`): a mistake is one named error, exit 2. A run whose steps
had nothing to train (every rollout failed or cut before its first token) ends with exit 1.
SIGINT/SIGTERM once: finish the current step, checkpoint, exit 0. Twice: stop now (exit 130).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from vfkit.cli import quiet_dependency_warnings
from vfkit.errors import ConfigError, VfkitError

EXIT_INTERRUPTED = 130
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vf-train", description=__doc__.split("\n")[0])
    parser.add_argument("config", help="run config TOML (e.g. configs/exp.toml)")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE, e.g. trainer.args.max_steps=5")
    parser.add_argument(
        "--resume", nargs="?", const=True, default=None, metavar="PATH",
        help="continue from the latest checkpoint of the run, or from PATH",
    )
    parser.add_argument("--phase", choices=["both", "rollout", "update"], default="both")
    args = parser.parse_intermixed_args(argv)
    if isinstance(args.resume, str) and "=" in args.resume and not Path(args.resume).exists():
        args.overrides.append(args.resume)  # `--resume k=v`: k=v is an override
        args.resume = True
    return args


def install_stop_handlers(stop) -> dict[int, object]:
    """First signal: ask for a clean stop; second: interrupt at once. Returns the old handlers."""

    def handle(signum: int, _frame: object) -> None:
        if stop.requested:
            raise KeyboardInterrupt
        stop.requested = True
        name = signal.Signals(signum).name
        print(
            f"\n{name}: finishing this step, then checkpointing and exiting"
            f" ({name} again stops at once)", file=sys.stderr, flush=True,
        )

    return {sig: signal.signal(sig, handle) for sig in STOP_SIGNALS}


def relaunch(cfg, argv: list[str]) -> tuple[list[str], dict[str, str]] | None:
    """The command and environment vf-train re-executes itself with when `trainer.gpus` names
    GPUs: CUDA then shows it only those, and several run under `accelerate launch` (None: run
    in this process: "auto", the CPU, or already re-executed)."""
    from vfkit.train.placement import device_ids, trainer_environ

    env = trainer_environ(cfg)
    if env is None:
        return None
    devices = device_ids(cfg)[1] or []
    if len(devices) < 2:
        return [sys.executable, "-m", "vfkit.cli.train", *argv], env
    launch = [sys.executable, "-m", "accelerate.commands.launch"]
    return [*launch, "--num_processes", str(len(devices)), "--multi_gpu",
            "-m", "vfkit.cli.train", *argv], env


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    quiet_dependency_warnings()
    old_handlers: dict[int, object] = {}
    try:
        from vfkit.train.config_loader import load_config

        cfg = load_config(args.config, args.overrides)  # every config error, before any model
        from vfkit.train.placement import relaunched

        if not relaunched():  # the vf-train that re-executed this one checked the config
            from vfkit.train.run_checks import require_static_checks

            require_static_checks(cfg, server=args.phase != "update")
        again = relaunch(cfg, argv)
        if again:
            os.execve(sys.executable, *again)
        from vfkit.train.loop import StopFlag
        from vfkit.train.phases import run_phase

        stop = StopFlag()
        old_handlers = install_stop_handlers(stop)
        run_dir, seconds = run_phase(args.phase, cfg, resume=args.resume, stop=stop)
    except ConfigError as exc:
        print(f"vf-train: config error: {exc}", file=sys.stderr)
        return 2
    except VfkitError as exc:
        print(f"vf-train: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("vf-train: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:  # a caller that runs main in-process (a test, a script) gets its handlers back
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
    state = "stopped early" if stop.requested else "done"
    print(f"vf-train: {state} in {seconds / 60:.1f} min; outputs in {run_dir}", file=sys.stderr)
    return 0


def entry() -> int:
    """The `vf-train` command: main, then exit with signals ignored.

    The run is over when main returns; a late Ctrl-C (tmux, a second kill) must not interrupt
    the interpreter's exit with a traceback from torch's shutdown.
    """
    code = main()
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    sys.exit(entry())
