"""What a run will start, where, and how much work each step is: printed by `vf-rl --dry-run`.

Devices: `gpus` may be "auto" (the default: the first GPU when there is one, else the CPU), a
count or explicit ids; counts are laid out server first, then trainer (inference.gpus = 2,
trainer.gpus = 2 -> server on 0,1 and trainer on 2,3); 0 = the CPU.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from vfkit.precision import SLOW_BF16, bf16_emulated, bf16_native, resolve_bf16
from vfkit.train.config import RunConfig, gpu_count
from vfkit.train.config_fields import REDACTED, SECRET_KEYS
from vfkit.train.placement import (
    choose_backend,
    describe_devices,
    device_ids,
    server_on_cpu,
    trainer_on_cpu,
)
from vfkit.train.rundir import RunDir


@dataclass
class ProcessPlan:
    """One process vf-rl starts."""

    name: str
    argv: list[str]
    devices: list[int] | None = field(default_factory=list)  # [] = CPU, None = auto
    env: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return describe_devices(self.devices)


@dataclass
class Plan:
    """The launch plan of one run."""

    run: RunDir
    backend: str  # "builtin" | "vllm" | "external"
    server_devices: list[int] | None
    trainer: ProcessPlan
    steps: int
    rollouts_per_step: int
    prompts_per_step: int
    micro_batches_per_step: int
    world_size: int
    eval_steps: int
    max_tokens: int = 0
    prompt_tokens: int | None = None  # measured on one formatted example, when known

    @property
    def tokens_per_step(self) -> int | None:
        """Upper estimate: every rollout = one prompt + max_tokens (more for multi-turn envs)."""
        if self.prompt_tokens is None:
            return None
        return self.rollouts_per_step * (self.prompt_tokens + self.max_tokens)


def resolve_backend(cfg: RunConfig) -> str:
    """The server that will run: external (base_url), or the configured/auto-chosen backend."""
    return "external" if cfg.inference.base_url else choose_backend(cfg)


def trainer_process(
    cfg: RunConfig, config_path: str | Path, overrides: list[str], *, resume: str | None = None
) -> ProcessPlan:
    """The trainer command. On several GPUs vf-train re-executes itself under `accelerate
    launch` with CUDA_VISIBLE_DEVICES set to trainer.gpus, so the command is the same."""
    _, devices = device_ids(cfg)
    argv = [sys.executable, "-m", "vfkit.cli.train", str(config_path), *overrides]
    if resume is not None:
        argv += ["--resume"] if resume == "latest" else ["--resume", resume]
    return ProcessPlan("trainer", argv, devices)


def make_plan(
    cfg: RunConfig,
    config_path: str | Path,
    overrides: list[str],
    *,
    resume: str | None = None,
    prompt_tokens: int | None = None,
) -> Plan:
    a = cfg.trainer.args
    server_devices, _ = device_ids(cfg)
    world = max(1, gpu_count(cfg.trainer.gpus))
    return Plan(
        run=RunDir(Path(a.output_dir) / cfg.run_name),
        backend=resolve_backend(cfg),
        server_devices=server_devices,
        trainer=trainer_process(cfg, config_path, overrides, resume=resume),
        steps=a.max_steps,
        rollouts_per_step=a.batch_size,
        prompts_per_step=a.prompts_per_batch,
        micro_batches_per_step=a.batch_size // (a.micro_batch_size * world),
        world_size=world,
        eval_steps=a.eval_steps,
        prompt_tokens=prompt_tokens,
        max_tokens=a.max_tokens,
    )


def redact(argv: list[str]) -> list[str]:
    """argv with the values of secret overrides (`inference.api_key=...`) hidden."""
    out = []
    for arg in argv:
        key, sep, _ = arg.partition("=")
        secret = sep and key.strip().rsplit(".", 1)[-1] in SECRET_KEYS
        out.append(f"{key}={REDACTED}" if secret else arg)
    return out


def trainer_display(plan: Plan) -> str:
    """The trainer command as a user would type it (secrets hidden)."""
    argv = redact(plan.trainer.argv)
    args = argv[argv.index("vfkit.cli.train") + 1 :]
    launcher = (
        f"accelerate launch --num_processes {plan.world_size} " if plan.world_size > 1 else ""
    )
    return f"{launcher}vf-train {' '.join(args)}"


def precision(cfg: RunConfig, backend: str) -> str:
    """The trainer's autocast and a builtin CPU server's dtype, as "auto" resolves them here."""
    a = cfg.trainer.args
    device = "cpu" if trainer_on_cpu(cfg) else "cuda"
    used = resolve_bf16(a.bf16, device)
    line = f"trainer {'bf16 autocast' if used else 'fp32'}"
    if a.bf16 == "auto":
        has = "has" if used else "has no"
        line += f' (bf16 "auto": this {"CPU" if device == "cpu" else "GPU"} {has} bf16 units)'
    elif used and bf16_emulated(device):
        line += f" (trainer.args.bf16 = true, but {SLOW_BF16})"
    dtype = str(cfg.inference.args.get("dtype", "auto"))
    if backend == "builtin" and server_on_cpu(cfg) and dtype == "auto":
        return f"{line}; server {'bf16' if bf16_native('cpu') else 'fp32'} (dtype auto)"
    return f"{line}; server dtype {dtype}" if backend == "builtin" else line


def format_plan(plan: Plan, cfg: RunConfig, mode: str) -> str:
    """The human-readable plan."""
    a = cfg.trainer.args
    inf = cfg.inference
    if plan.backend == "external":
        server = f"use the running server at {inf.base_url} (none started)"
    else:
        port = f"{inf.host}:{inf.port}" if inf.port else f"{inf.host}, free port"
        auto = " (backend auto)" if inf.backend == "auto" else ""
        where = describe_devices(plan.server_devices)
        server = f"{plan.backend}{auto} serving {cfg.model} ({port}, {where})"
    procs = f"{plan.world_size} process" + ("es" if plan.world_size > 1 else "")
    lines = [
        f"run        {plan.run.root}",
        f"mode       {mode}",
        f"server     {server}",
        f"trainer    {trainer_display(plan)} ({plan.trainer.where}, {procs})",
        f"env        {cfg.env.id} {cfg.env.args or ''}".rstrip(),
        f"steps      {plan.steps} optimizer steps, async_level {a.async_level}"
        + (f", eval every {plan.eval_steps} steps" if plan.eval_steps else ", no eval"),
        f"per step   {plan.rollouts_per_step} rollouts = {plan.prompts_per_step} prompts × "
        f"{a.rollouts_per_example}; {plan.micro_batches_per_step} micro-batch(es) of "
        f"{a.micro_batch_size} per process"
        + (f"; flat groups resampled up to {a.dynamic_sampling_rounds} more round(s)"
           if a.dynamic_sampling_rounds else ""),
    ]
    lines.append(f"precision  {precision(cfg, plan.backend)}")
    if plan.tokens_per_step is not None:
        lines.append(
            f"tokens     ≤ {plan.tokens_per_step:,} per step (≈{plan.prompt_tokens} prompt + "
            f"≤{a.max_tokens} completion tokens per rollout)"
        )
    return "\n".join(lines)
