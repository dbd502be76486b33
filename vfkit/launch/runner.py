"""Foreground run: wire the config to the supervisor (server factory, trainer command, log echo)."""

from __future__ import annotations

import argparse
import time

from vfkit.launch.plan import Plan
from vfkit.launch.process import Printer, become_subreaper
from vfkit.launch.supervisor import RunSpec, ServerFactory, Supervisor
from vfkit.serve.launcher import ServerProcess
from vfkit.train.config import RunConfig
from vfkit.train.placement import visible_devices
from vfkit.train.rundir import RunDir


def server_factory(cfg: RunConfig, plan: Plan) -> ServerFactory:
    """start(port): the server exactly as vf-train would start it (same model folder and flags)."""
    from vfkit.hub import resolve_model
    from vfkit.train.placement import launcher_kwargs

    kwargs = launcher_kwargs(cfg, plan.run)
    kwargs.pop("health_timeout", None)  # the supervisor waits, with a countdown
    model_dir: list[str] = []

    def start(port: int | None) -> ServerProcess:
        from vfkit.serve.launcher import start_server

        if not model_dir:  # once: offline, the first call may convert the bundled GGUF
            model_dir.append(str(resolve_model(cfg.model)))
        with visible_devices(plan.server_devices):
            proc = start_server(
                model_dir[0], **{**kwargs, "port": port or kwargs["port"]}, wait=False
            )
        return proc

    return start


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
