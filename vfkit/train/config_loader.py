"""Read a run config: TOML + command-line overrides -> validated `RunConfig`, or a ConfigError.

Every check here runs before any model or server is touched, so a typo costs seconds:

    cfg = load_config("configs/exp.toml", ["trainer.args.max_steps=5"])
"""

from __future__ import annotations

import importlib.util
import os
import tomllib
from pathlib import Path

from pydantic import ValidationError

from vfkit.errors import ConfigError
from vfkit.train.config import RunConfig, gpu_count
from vfkit.train.config_errors import ConfigSource, validation_error
from vfkit.train.config_fields import check_folder_name
from vfkit.train.overrides import apply_overrides

DEFAULT_MAX_LORA_RANK = 64  # the server launcher's default for --max-lora-rank


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read, override and validate the TOML at `path`."""
    path = Path(path)
    if not path.is_file():
        problem = "is a folder, not a TOML file" if path.is_dir() else "does not exist"
        raise ConfigError(f"config file {path} {problem} (e.g. vf-train configs/exp.toml)")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte {raw[exc.start]:#x} at offset {exc.start}); "
            "TOML files must be UTF-8: re-save it as UTF-8"
        ) from None
    return parse_config(text, name=str(path), overrides=overrides)


def parse_config(
    text: str, *, name: str = "<config>", overrides: list[str] | tuple[str, ...] = ()
) -> RunConfig:
    """Validate TOML text plus overrides; errors name the key, the line and the nearest key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{name}: not valid TOML: {exc}") from None
    source = ConfigSource(text, name)
    source.overridden.update(apply_overrides(data, list(overrides)))
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, data, source, RunConfig) from None
    check_combinations(cfg, source)
    return cfg


def world_size(cfg: RunConfig) -> int:
    """Trainer processes: accelerate's WORLD_SIZE when launched by it, else trainer.gpus."""
    if "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    return max(1, gpu_count(cfg.trainer.gpus))


def server_max_lora_rank(cfg: RunConfig) -> int | None:
    """The server's max LoRA rank, when known (given in [inference.args] or our default)."""
    value = cfg.inference.args.get("max_lora_rank")
    if value is not None:
        return int(value)
    return None if cfg.inference.base_url else DEFAULT_MAX_LORA_RANK


def check_combinations(cfg: RunConfig, source: ConfigSource | None = None) -> None:
    """Reject settings that cannot work together, naming the keys involved."""
    source = source or ConfigSource()
    a = cfg.trainer.args
    key = ("trainer", "args")
    if not a.run_name:
        try:
            check_folder_name(cfg.run_name)
        except ValueError as exc:
            raise source.error(("env", "id"), f"the run name derived from it: {exc}; "
                               "set trainer.args.run_name") from None
    if not a.use_lora:
        raise source.error((*key, "use_lora"), "only LoRA training is supported; set it to true")
    if a.batch_size % a.rollouts_per_example:
        raise source.error(
            (*key, "batch_size"),
            f"{a.batch_size} is not a multiple of rollouts_per_example={a.rollouts_per_example}"
            f" (try {a.rollouts_per_example * max(1, a.prompts_per_batch)})",
        )
    per_step = a.micro_batch_size * world_size(cfg)
    if a.batch_size % per_step:
        raise source.error(
            (*key, "batch_size"),
            f"{a.batch_size} is not a multiple of micro_batch_size × world size"
            f" = {a.micro_batch_size} × {world_size(cfg)}; change batch_size or micro_batch_size",
        )
    max_rank = server_max_lora_rank(cfg)
    if max_rank is not None and a.lora_rank > max_rank:
        raise source.error(
            (*key, "lora_rank"),
            f"{a.lora_rank} is above the server's max_lora_rank={max_rank}; lower it or set"
            " inference.args.max_lora_rank",
        )
    if a.max_prompt_len >= a.max_seq_len:
        raise source.error(
            (*key, "max_prompt_len"),
            f"{a.max_prompt_len} leaves no room for a completion in max_seq_len={a.max_seq_len}",
        )
    if a.warmup_steps and a.lr_scheduler_type == "constant":  # transformers' never warms up
        raise source.error(
            (*key, "warmup_steps"),
            f'{a.warmup_steps} has no effect with lr_scheduler_type = "constant"; use '
            '"constant_with_warmup" (or another schedule), or set warmup_steps = 0',
        )
    if a.warmup_steps >= a.max_steps:
        raise source.error(
            (*key, "warmup_steps"),
            f"{a.warmup_steps} is not below max_steps={a.max_steps}: the learning rate would "
            "never reach learning_rate; lower warmup_steps",
        )
    if a.dynamic_sampling_rounds and not a.filter_zero_advantage:
        raise source.error(
            (*key, "dynamic_sampling_rounds"),
            f"{a.dynamic_sampling_rounds} needs filter_zero_advantage = true: the flat groups"
            " it replaces would still be trained on; set one of them back",
        )
    if a.mask_ratio_low >= a.mask_ratio_high:
        raise source.error(
            (*key, "mask_ratio_low"),
            f"{a.mask_ratio_low} must be below mask_ratio_high={a.mask_ratio_high}",
        )
    for target in ("wandb", "tensorboard"):
        if target in a.report_to and importlib.util.find_spec(target) is None:
            raise source.error(
                (*key, "report_to"), f'"{target}" is not installed: pip install {target}'
            )
    vllm_missing = importlib.util.find_spec("vllm") is None
    if cfg.inference.backend == "vllm" and not cfg.inference.base_url and vllm_missing:
        raise source.error(
            ("inference", "backend"),
            '"vllm" is not installed: pip install "vfkit[vllm]", or use backend = "builtin"',
        )
