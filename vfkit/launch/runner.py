"""Foreground run: wire the config to the supervisor (server factory, trainer command, log echo)."""

from __future__ import annotations

import argparse
import functools
import time

from vfkit.launch.plan import Plan
from vfkit.launch.process import Printer, become_subreaper
from vfkit.launch.supervisor import RunSpec, ServerFactory, Supervisor
from vfkit.train.config import RunConfig
from vfkit.train.placement import server_starter
from vfkit.train.rundir import RunDir


def server_factory(cfg: RunConfig, plan: Plan) -> ServerFactory:
    """start(port): the server exactly as vf-train would start it (placement.server_starter),
    without waiting for health: the supervisor waits, with a countdown."""
    from vfkit.hub import resolve_model

    # once, at the first start: offline, it may convert the bundled GGUF
    model_dir = functools.cache(lambda: str(resolve_model(cfg.model)))
    return server_starter(cfg, plan.run, model_dir, wait=False)


def resume_argv(argv: list[str]) -> list[str]:
    """The trainer command that continues from the run's latest checkpoint."""
    if "--resume" in argv:
        i = argv.index("--resume")
        has_path = i + 1 < len(argv) and not argv[i + 1].startswith("-") and "=" not in argv[i + 1]
        argv = argv[:i] + argv[i + 2 if has_path else i + 1 :]
    return [*argv, "--resume"]


def run_foreground(
    cfg: RunConfig, plan: Plan, args: argparse.Namespace, *, tmux_session: str | None = None
) -> int:
    """Run the supervisor here; in a tmux pane the server's lines stay in their own pane."""
    become_subreaper()
    run: RunDir = plan.run
    run.logs.mkdir(parents=True, exist_ok=True)
    printer = Printer(log_path=run.supervisor_log)
    external = bool(cfg.inference.base_url)
    spec = RunSpec(
        run=run,
        trainer_argv=plan.trainer.argv,
        resume_argv=resume_argv(plan.trainer.argv),
        trainer_env=plan.trainer.env,
        start_server=None if external else server_factory(cfg, plan),
        base_url=cfg.inference.base_url or None,
        api_key=cfg.inference.api_key or None,
        health_timeout=args.health_timeout,
        max_restarts=args.max_restarts,
        stop_timeout=args.stop_timeout,
        echo_server=tmux_session is None,
        tmux_session=tmux_session,
        report=not args.no_report,
    )
    printer.say(f"run {run.root} started at {time.strftime('%F %T')}")
    return Supervisor(spec, printer).run()
