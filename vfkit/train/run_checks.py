"""Checks of a run config against what it names, before any weight is loaded or server started.

One set of checks with two users: `vf-train` stops with one ConfigError listing every failure
(`require_static_checks`), `vf-rl --dry-run` prints each result (`static_checks`). Each `Check`
names the config key at fault and what to do. The model is read as config + tokenizer only; its
modules are built on the meta device to check LoRA target names.
"""

from __future__ import annotations

import difflib
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vfkit.client.limits import SequenceLimits
from vfkit.errors import ConfigError, VfkitError
from vfkit.images import ImageError
from vfkit.train.config import RunConfig
from vfkit.train.config_fields import module_matches
from vfkit.train.data import prompt_length
from vfkit.train.placement import choose_backend, describe_devices, device_ids, flag_args
from vfkit.train.vision import allowed_media_dirs, is_vlm, load_processor, text_tokenizer


@dataclass
class Check:
    """One check's result: `detail` says what was found, or what is wrong and how to fix it."""

    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'✓' if self.ok else '✗'} {self.name:<12} {self.detail}"


@dataclass
class ModelInfo:
    """What the checks learn about the model without loading its weights."""

    config: Any
    tokenizer: Any  # a vision-language model's processor (it measures image prompts)
    path: str


def load_model_info(model: str) -> ModelInfo:
    """Config and tokenizer (a VLM's processor) only: a folder, a few hub files, or (offline)
    vfkit.hub's folder."""
    from transformers import AutoConfig, AutoTokenizer

    from vfkit.hub import hub_unreachable_reason, resolve_model

    path = model
    if not Path(model).is_dir():
        # online: fetch config + tokenizer files only; offline: the cache or the bundled GGUF
        path = model if hub_unreachable_reason() is None else str(resolve_model(model))
    try:
        processor = load_processor(path)
    except OSError:  # a VLM folder without its processor: check_processor names the fix
        processor = AutoTokenizer.from_pretrained(path)
    return ModelInfo(AutoConfig.from_pretrained(path), processor, path)


def check_model(cfg: RunConfig) -> tuple[Check, ModelInfo | None]:
    try:
        info = load_model_info(cfg.model)
    except Exception as exc:
        return Check("model", False, (
            f"model = {cfg.model!r}: cannot read its config/tokenizer ({type(exc).__name__}: "
            f"{exc}); give a local HF folder or a hub id"
        )), None
    kind, vocab = type(info.config).__name__, len(text_tokenizer(info.tokenizer))
    return Check("model", True, f"{cfg.model} ({kind}, vocab {vocab})"), info


def check_output_dir(root: Path) -> Check:
    """The run folder can be created and written (probed with a temporary file, then removed)."""
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    fix = "set trainer.args.output_dir to a writable folder"
    if not existing.is_dir():
        return Check("output dir", False,
                     f"cannot create {root}: {existing} is not a folder; {fix}")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return Check("output dir", False, f"{existing} is not writable ({exc.strerror}); {fix}")
    return Check("output dir", True, f"{root} is writable")


def empty_model(config: Any) -> Any:
    """The model built on the meta device (module names and shapes, no weights)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if is_vlm(config) else AutoModelForCausalLM
    with init_empty_weights():
        return auto.from_config(config)


def module_names(config: Any) -> tuple[list[str], set[str]]:
    """(all module names, names of Linear modules) of the model, built without weights."""
    import torch

    model = empty_model(config)
    names = [n for n, _ in model.named_modules() if n]
    linear = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    return names, linear


def check_lora_targets(cfg: RunConfig, info: ModelInfo) -> Check:
    a = cfg.trainer.args
    names, linear = module_names(info.config)
    leaf_linear = sorted({n.rsplit(".", 1)[-1] for n in linear} - {"lm_head"})
    vlm = None  # a VLM's targets must be in its language model (run_checks_vision.py)
    if is_vlm(info.config):
        from vfkit.train.run_checks_vision import check_vlm_lora_targets

        vlm = check_vlm_lora_targets(cfg, empty_model(info.config))
        if not vlm.ok or a.lora_target_modules == "all-linear":
            return vlm
    if a.lora_target_modules == "all-linear":
        if not leaf_linear:
            return Check("lora", False, f"{cfg.model} has no Linear layers for all-linear")
        return Check("lora", True, f"all-linear = {', '.join(leaf_linear)}")
    leaves = sorted({n.rsplit(".", 1)[-1] for n in names})
    keys = ("lora_modules_to_save",) if vlm else ("lora_target_modules", "lora_modules_to_save")
    for key in keys:
        for target in getattr(a, key):
            if not any(module_matches(n, target) for n in names):
                near = difflib.get_close_matches(target, leaves, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                return Check("lora", False, (
                    f"trainer.args.{key}: {target!r} is no module of {cfg.model}{hint}; its "
                    f"linear layers are {', '.join(leaf_linear)}"
                ))
    return vlm or Check(
        "lora", True, f"targets {', '.join(a.lora_target_modules)} found in {cfg.model}")


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
        return Check("tensor par.", False, (
            f"inference.args.tensor_parallel_size={tp} does not divide the model's {heads} "
            f"attention heads ({kv} KV heads); pick a divisor of {heads}"
        ))
    return Check("tensor par.", True, f"{heads} heads / tp {tp}")


def _load_dataset(env_id: str, args: dict[str, Any], *, eval_n: int | None = None) -> Any:
    """The env's train (or, with eval_n, eval) dataset; errors name the config keys."""
    from vfkit.envs.registry import load_environment

    prefix = "env." if eval_n is None else "env.eval_"
    id_key, args_key = prefix + "id", prefix + "args"
    try:
        env = load_environment(env_id, **args)
        return env.get_dataset() if eval_n is None else env.get_eval_dataset(n=eval_n)
    except VfkitError as exc:
        raise ConfigError(f"{id_key} = {env_id!r}: {exc}") from None
    except Exception as exc:
        raise ConfigError(
            f"load_environment({env_id!r}, **{args_key}) failed: {type(exc).__name__}: {exc}; "
            f"fix {args_key} (its keys are load_environment's keyword arguments)"
        ) from None


def model_context(cfg: RunConfig, info: ModelInfo) -> tuple[int | None, str]:
    """The server's context length and where it comes from (None when unknown)."""
    args = {k.replace("-", "_"): v for k, v in cfg.inference.args.items()}
    if args.get("max_model_len"):
        return int(args["max_model_len"]), "inference.args.max_model_len"
    value = getattr(info.config, "max_position_embeddings", None)
    return (int(value) if value else None), "the model's max_position_embeddings"


def check_sequence_limits(cfg: RunConfig, info: ModelInfo, lengths: list[int]) -> Check | None:
    """A failed Check when prompt + max_tokens cannot fit the context or max_seq_len."""
    a = cfg.trainer.args
    longest = max(lengths)
    need = longest + a.max_tokens
    context, source = model_context(cfg, info)
    if context is not None and need > context:
        return Check("environment", False, (
            f"trainer.args.max_tokens={a.max_tokens}: the longest prompt ({longest} tokens) + "
            f"max_tokens = {need} exceeds the context of {context} tokens ({source}): the server "
            f"would refuse every such request; set max_tokens <= {max(1, context - longest)}"
        ))
    if not SequenceLimits(max_seq_len=a.max_seq_len).sequence_fits(need):
        return Check("environment", False, (
            f"trainer.args.max_tokens={a.max_tokens}: the longest prompt ({longest} tokens) + "
            f"max_tokens = {need} exceeds trainer.args.max_seq_len={a.max_seq_len}: completions "
            f"that use max_tokens would be dropped untrained; raise max_seq_len to >= {need} or "
            f"lower max_tokens (or max_prompt_len)"
        ))
    return None


def check_environment(cfg: RunConfig, info: ModelInfo | None) -> tuple[Check, int | None]:
    """Load the env and measure its prompts; (check, longest kept prompt in tokens)."""
    a = cfg.trainer.args
    try:
        dataset = _load_dataset(cfg.env.id, cfg.env.args)
    except ConfigError as exc:
        return Check("environment", False, str(exc)), None
    if len(dataset) == 0:
        return Check("environment", False, f"env.id = {cfg.env.id!r}: the dataset is empty"), None
    if info is None:  # the model check already failed: no tokenizer to measure with
        return Check("environment", True, f"{cfg.env.id}: {len(dataset)} examples"), None
    from vfkit.train.run_checks_vision import image_note, image_prompts_need_vlm

    if why := image_prompts_need_vlm(cfg, info.config, dataset["prompt"]):
        return Check("environment", False, why), None
    lengths = []
    for row, prompt in enumerate(dataset["prompt"]):
        try:  # a VLM's processor counts each image's expanded placeholder tokens
            lengths.append(prompt_length(info.tokenizer, prompt, allowed_media_dirs(cfg)))
        except ImageError as exc:
            return Check("environment", False,
                         f"env.id = {cfg.env.id!r}: row {row}'s prompt image: {exc}"), None
        except (ValueError, TypeError, KeyError) as exc:  # e.g. [] or a message without content
            return Check("environment", False, (
                f"env.id = {cfg.env.id!r}: row {row}'s prompt {str(prompt)[:80]} cannot be "
                f"rendered by the chat template ({type(exc).__name__}: {exc}); fix the "
                "environment's dataset"
            )), None
    images = image_note(info.tokenizer, dataset["prompt"])
    limits = SequenceLimits(max_prompt_len=a.max_prompt_len)
    kept = [n for n in lengths if limits.prompt_fits(n)]
    if not kept:
        return Check("environment", False, (
            f"every prompt of {cfg.env.id} is longer than trainer.args.max_prompt_len="
            f"{a.max_prompt_len} (shortest {min(lengths)} tokens{images}); raise max_prompt_len"
        )), None
    dropped = len(lengths) - len(kept)
    skipped = f" ({dropped} over max_prompt_len skipped)" if dropped else ""
    if len(kept) < a.prompts_per_batch:
        return Check("environment", False, (
            f"trainer.args.batch_size={a.batch_size} needs {a.prompts_per_batch} prompts a step "
            f"(batch_size / rollouts_per_example) but {cfg.env.id} has {len(kept)}{skipped}; "
            f"lower batch_size to <= {len(kept) * a.rollouts_per_example}"
        )), max(kept)
    limits = check_sequence_limits(cfg, info, kept)
    if limits is not None:
        return limits, max(kept)
    span = f"prompts {min(kept)}-{max(kept)} tokens{images}"
    detail = f"{cfg.env.id}: {len(dataset)} examples{skipped}; {span}"
    return Check("environment", True, detail), max(kept)


def check_eval_environment(cfg: RunConfig) -> Check | None:
    """The eval env, when the config names one (env.eval_id / env.eval_args)."""
    env = cfg.env
    if env.eval_id is None and env.eval_args is None:
        return None
    eval_id = env.eval_id or env.id
    args = env.args if env.eval_args is None else env.eval_args
    try:
        dataset = _load_dataset(eval_id, args, eval_n=cfg.args.eval_num_examples)
    except ConfigError as exc:
        return Check("eval env", False, str(exc))
    if len(dataset) == 0:
        return Check("eval env", False, f"env.eval_id = {eval_id!r}: the eval dataset is empty")
    return Check("eval env", True, f"{eval_id}: {len(dataset)} eval examples")


def check_server(cfg: RunConfig) -> Check:
    """The external server answers /health, or the port of the one we start is free."""
    inf = cfg.inference
    if inf.base_url:
        from vfkit.serve.launcher import is_healthy  # the one owner of "is a server up"

        if is_healthy(inf.base_url, timeout=10.0, api_key=inf.api_key or None):
            return Check("server", True, f"{inf.base_url} answers /health")
        return Check("server", False, (
            f"inference.base_url={inf.base_url} does not answer /health: start that server, "
            "or leave base_url empty to let vfkit start one"
        ))
    if not inf.port:
        return Check("port", True, f"a free port on {inf.host} will be picked")
    from vfkit.serve.launcher import bind_error

    if (why := bind_error(inf.host, inf.port)) is not None:
        return Check("port", False, (
            f"inference.port={inf.port} on {inf.host} is in use ({why}){_owner(inf.port)}; "
            "stop that process or set inference.port = 0 (a free port)"
        ))
    return Check("port", True, f"{inf.host}:{inf.port} is free")


def _owner(port: int) -> str:
    try:
        import psutil

        for conn in psutil.net_connections("inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == "LISTEN" and conn.pid:
                return f" by pid {conn.pid} ({psutil.Process(conn.pid).name()})"
    except Exception:  # best effort: the port check stands without the owner's name
        pass
    return ""


def check_server_flags(cfg: RunConfig, backend: str) -> Check | None:
    """[inference.args] flags parse with the builtin server's own command line (vf-serve)."""
    if cfg.inference.base_url or backend != "builtin" or not cfg.inference.args:
        return None
    import argparse

    from vfkit.cli.serve import build_parser

    parser = build_parser()
    parser.exit_on_error = False  # raise ArgumentError instead of exiting
    try:
        _, unknown = parser.parse_known_args([cfg.model, *flag_args(cfg.inference.args)])
    except argparse.ArgumentError as exc:
        return Check("server args", False, f"inference.args: {exc}")
    keys = [f.removeprefix("--").replace("-", "_") for f in unknown if f.startswith("--")]
    if keys:
        known = sorted(a.dest for a in parser._actions if a.option_strings and a.dest != "help")
        return Check("server args", False, (
            f"inference.args.{keys[0]} is not a flag of the builtin server; "
            f"known: {', '.join(known)}"
        ))
    return Check("server args", True, " ".join(flag_args(cfg.inference.args)) or "defaults")


def check_devices(cfg: RunConfig) -> Check:
    server, trainer = device_ids(cfg)
    wanted = sorted(set(server or []) | set(trainer or []))
    if not wanted:
        return Check("devices", True, "CPU only" if server == trainer == [] else "auto")
    import torch

    have = torch.cuda.device_count()
    if max(wanted) >= have:
        return Check("devices", False, (
            f"the config uses GPU ids {wanted} (inference.gpus, trainer.gpus) but {have} "
            f"GPU(s) are visible: use ids below {have}, or \"auto\" to share the first GPU"
        ))
    return Check("devices", True, (
        f"server {describe_devices(server)}; trainer {describe_devices(trainer)}"
    ))


def static_checks(cfg: RunConfig, *, server: bool = True) -> tuple[list[Check], int | None]:
    """Every check of the config against the world; (results, longest prompt in tokens).

    `server=False` skips the server checks (`vf-train --phase update` starts none).
    """
    backend = "external" if cfg.inference.base_url else choose_backend(cfg)
    checks = [check_output_dir(Path(cfg.args.output_dir) / cfg.run_name)]
    model, info = check_model(cfg)
    checks.append(model)
    if info is not None:
        from vfkit.train.run_checks_vision import check_processor

        checks += filter(None, [check_processor(cfg, info.config, info.tokenizer)])
        checks.append(_guard("lora", lambda: check_lora_targets(cfg, info)))
        checks += filter(None, [check_tensor_parallel(cfg, info, backend)])
    env_check, prompt_tokens = check_environment(cfg, info)
    checks += filter(None, [env_check, check_eval_environment(cfg)])
    if server:
        checks += filter(None, [check_server(cfg), check_server_flags(cfg, backend)])
    checks.append(check_devices(cfg))
    return checks, prompt_tokens


def require_static_checks(cfg: RunConfig, *, server: bool = True) -> None:
    """Raise one ConfigError naming every failed check (what `vf-train` does before training)."""
    failed = [c for c in static_checks(cfg, server=server)[0] if not c.ok]
    if failed:
        raise ConfigError("\n".join(f"{c.name}: {c.detail}" for c in failed))


def _guard(name: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except Exception as exc:
        return Check(name, False, f"{type(exc).__name__}: {exc}")
