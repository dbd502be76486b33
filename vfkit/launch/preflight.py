"""`vf-rl --dry-run`: check everything a run needs before starting anything, and say what fails.

Each check returns a `Check` whose detail names the problem and the fix. Nothing is started and
nothing is written (the model's weights are never loaded: its modules are built on the meta
device to check the LoRA target names).
"""

from __future__ import annotations

import difflib
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vfkit.errors import VfkitError
from vfkit.launch.plan import Plan, device_ids, make_plan, resolve_backend
from vfkit.serve.launcher import is_healthy
from vfkit.train.config import RunConfig
from vfkit.train.rundir import RunDir


@dataclass
class Check:
    """One preflight result."""

    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'✓' if self.ok else '✗'} {self.name:<12} {self.detail}"


@dataclass
class ModelInfo:
    """What the checks learn about the model without loading its weights."""

    config: Any
    tokenizer: Any
    path: str


def check_output_dir(run: RunDir) -> Check:
    """The run folder can be created and written (probed with a temporary file, then removed)."""
    existing = run.root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return Check(
            "output dir",
            False,
            f"cannot create {run.root}: {existing} is not a folder; "
            "set trainer.args.output_dir to a writable folder",
        )
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return Check(
            "output dir",
            False,
            f"{existing} is not writable ({exc.strerror}); "
            "set trainer.args.output_dir to a writable folder",
        )
    note = ""
    if run.checkpoints.exists() and any(run.checkpoints.iterdir()):
        note = " (has checkpoints: add --resume to continue that run)"
    return Check("output dir", True, f"{run.root} is writable{note}")


def check_not_running(run: RunDir) -> Check:
    """One launcher per run folder: a second one would fight over checkpoints and ports."""
    state = run.read_state()
    pid = state.get("supervisor_pid")
    if pid and state.get("phase") != "done" and Path(f"/proc/{pid}").exists():
        return Check(
            "run",
            False,
            (
                f"run {run.name} is already running (vf-rl pid {pid}); stop it first, or "
                f"`vf-rl --clean {run.root}` if that process is not vf-rl"
            ),
        )
    return Check("run", True, f"no other vf-rl runs {run.name}")


def load_model_info(model: str) -> ModelInfo:
    """Config and tokenizer only: a folder, a few hub files, or (offline) vfkit.hub's folder."""
    from transformers import AutoConfig, AutoTokenizer

    from vfkit.hub import hub_unreachable_reason, resolve_model

    path = model
    if not Path(model).is_dir():
        # online: fetch config + tokenizer files only; offline: the cache or the bundled GGUF
        path = model if hub_unreachable_reason() is None else str(resolve_model(model))
    return ModelInfo(AutoConfig.from_pretrained(path), AutoTokenizer.from_pretrained(path), path)


def module_names(config: Any) -> tuple[list[str], set[str]]:
    """(all module names, names of Linear modules) of the model, built without weights."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    names = [n for n, _ in model.named_modules() if n]
    linear = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    return names, linear


def _matches(target: str, names: list[str]) -> bool:
    """PEFT's rule: a module matches when its name is the target or ends with '.' + target."""
    return any(n == target or n.endswith("." + target) for n in names)


def check_lora_targets(cfg: RunConfig, info: ModelInfo) -> Check:
    a = cfg.trainer.args
    names, linear = module_names(info.config)
    leaf_linear = sorted({n.rsplit(".", 1)[-1] for n in linear} - {"lm_head"})
    if a.lora_target_modules == "all-linear":
        if not leaf_linear:
            return Check("lora", False, f"{cfg.model} has no Linear layers for all-linear")
        return Check("lora", True, f"all-linear = {', '.join(leaf_linear)}")
    leaves = sorted({n.rsplit(".", 1)[-1] for n in names})
    for key, targets in (
        ("lora_target_modules", a.lora_target_modules),
        ("lora_modules_to_save", a.lora_modules_to_save),
    ):
        for target in targets:
            if not _matches(target, names):
                near = difflib.get_close_matches(target, leaves, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                return Check(
                    "lora",
                    False,
                    (
                        f"trainer.args.{key}: {target!r} is no module of {cfg.model}{hint}; its "
                        f"linear layers are {', '.join(leaf_linear)}"
                    ),
                )
    return Check("lora", True, f"targets {', '.join(a.lora_target_modules)} found in {cfg.model}")


def check_tensor_parallel(cfg: RunConfig, info: ModelInfo, backend: str) -> Check | None:
    """vLLM shards attention heads: their count must divide by the tensor-parallel size."""
    args = {k.replace("-", "_"): v for k, v in cfg.inference.args.items()}
    tp = int(args.get("tensor_parallel_size", 1) or 1)
    if backend != "vllm" or tp <= 1:
        return None
    heads = getattr(info.config, "num_attention_heads", None)
    kv = getattr(info.config, "num_key_value_heads", None) or heads
    if heads is None:
        return Check("tensor par.", True, f"tp={tp} (head count unknown for this model)")
    if heads % tp or (kv % tp and tp % kv):
        return Check(
            "tensor par.",
            False,
            (
                f"inference.args.tensor_parallel_size={tp} does not divide the model's {heads} "
                f"attention heads ({kv} KV heads); pick a divisor of {heads}"
            ),
        )
    return Check("tensor par.", True, f"{heads} heads / tp {tp}")


def check_environment(cfg: RunConfig, info: ModelInfo | None) -> tuple[Check, int | None]:
    """Load the env, format one example; (check, prompt tokens of that example)."""
    from vfkit.envs.registry import load_environment

    try:
        env = load_environment(cfg.env.id, **cfg.env.args)
        dataset = env.get_dataset()
    except VfkitError as exc:
        return Check("environment", False, str(exc)), None
    except Exception as exc:
        return Check(
            "environment",
            False,
            (f"load_environment({cfg.env.id!r}, **env.args) failed: {type(exc).__name__}: {exc}"),
        ), None
    a = cfg.trainer.args
    if len(dataset) == 0:
        return Check("environment", False, f"{cfg.env.id}: the dataset is empty"), None
    prompt = dataset[0]["prompt"]
    tokens = None
    if info is not None:
        tokens = _count_prompt_tokens(info.tokenizer, prompt)
        if tokens > a.max_prompt_len:
            return Check(
                "environment",
                False,
                (
                    f"{cfg.env.id}: the first prompt has {tokens} tokens, above "
                    f"trainer.args.max_prompt_len={a.max_prompt_len}"
                ),
            ), tokens
    detail = f"{cfg.env.id}: {len(dataset)} examples; first prompt " + (
        f"{tokens} tokens" if tokens is not None else "formatted"
    )
    if len(dataset) < a.prompts_per_batch:
        return Check(
            "environment",
            False,
            (
                f"{cfg.env.id} has {len(dataset)} examples, fewer than the {a.prompts_per_batch} "
                "prompts a step needs (batch_size / rollouts_per_example)"
            ),
        ), tokens
    return Check("environment", True, detail), tokens


def _count_prompt_tokens(tokenizer: Any, prompt: Any) -> int:
    if isinstance(prompt, str):
        return len(tokenizer(prompt)["input_ids"])
    ids = tokenizer.apply_chat_template(
        prompt, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    return len(ids)


def check_port(cfg: RunConfig) -> Check:
    inf = cfg.inference
    if inf.base_url:
        if is_healthy(inf.base_url, api_key=inf.api_key or None):
            return Check("server", True, f"{inf.base_url} answers /health")
        return Check(
            "server",
            False,
            (
                f"inference.base_url={inf.base_url} does not answer /health: start that server, "
                "or leave base_url empty to let vf-rl start one"
            ),
        )
    if not inf.port:
        return Check("port", True, f"a free port on {inf.host} will be picked")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((inf.host, inf.port))
        except OSError as exc:
            return Check(
                "port",
                False,
                (
                    f"inference.port={inf.port} on {inf.host} is in use ({exc.strerror})"
                    f"{_owner(inf.port)}; stop that process or set inference.port = 0 (a free port)"
                ),
            )
    return Check("port", True, f"{inf.host}:{inf.port} is free")


def _owner(port: int) -> str:
    try:
        import psutil

        for conn in psutil.net_connections("inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == "LISTEN" and conn.pid:
                return f" by pid {conn.pid} ({psutil.Process(conn.pid).name()})"
    except Exception:
        pass
    return ""


def check_devices(cfg: RunConfig) -> Check:
    server, trainer = device_ids(cfg)
    wanted = sorted(set(server) | set(trainer))
    if not wanted:
        return Check("devices", True, "CPU only")
    import torch

    have = torch.cuda.device_count()
    if max(wanted) >= have:
        return Check(
            "devices",
            False,
            (
                f"the config uses GPU ids {wanted} (inference.gpus, trainer.gpus) but {have} "
                "GPU(s) are visible"
            ),
        )
    return Check(
        "devices", True, f"server GPUs {server or 'none'}, trainer GPUs {trainer or 'none'}"
    )


def run_preflight(
    cfg: RunConfig,
    config_path: str | Path,
    overrides: list[str],
    *,
    mode: Check,
    resume: str | None = None,
) -> tuple[list[Check], Plan]:
    """All checks after the config loaded; `mode` is the tmux/foreground decision."""
    backend = resolve_backend(cfg)
    plan = make_plan(cfg, config_path, overrides, resume=resume)
    checks = [check_output_dir(plan.run), check_not_running(plan.run)]
    info = None
    try:
        info = load_model_info(cfg.model)
        checks.append(
            Check(
                "model",
                True,
                f"{cfg.model} ({type(info.config).__name__}, vocab {len(info.tokenizer)})",
            )
        )
    except Exception as exc:
        checks.append(
            Check("model", False, f"cannot read the config/tokenizer of {cfg.model}: {exc}")
        )
    if info is not None:
        checks.append(_guard("lora", lambda: check_lora_targets(cfg, info)))
        tp = check_tensor_parallel(cfg, info, backend)
        checks += [tp] if tp else []
    env_check, plan.prompt_tokens = check_environment(cfg, info)
    checks += [env_check, check_port(cfg), mode, check_devices(cfg), _batch_check(cfg)]
    return checks, plan


def _batch_check(cfg: RunConfig) -> Check:
    a = cfg.trainer.args
    return Check(
        "batch",
        True,
        (
            f"{a.batch_size} rollouts/step = {a.prompts_per_batch} prompts × "
            f"{a.rollouts_per_example}; micro-batch {a.micro_batch_size}"
        ),
    )


def _guard(name: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except Exception as exc:
        return Check(name, False, f"{type(exc).__name__}: {exc}")
