"""Server settings, and building the engine from them (model, dtype, threads, adapters)."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from vfkit.serve.limits import DEFAULT_MAX_REQUEST_BYTES

log = logging.getLogger("vfkit.serve")


@dataclass
class ServeConfig:
    """Everything `vf-serve` accepts (flag names follow vLLM's where vLLM has one)."""

    model: str
    served_model_name: str | None = None  # the id clients send; default: `model` as given
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # when set, every route (/health too) needs "Bearer <key>"
    allowed_adapter_dirs: tuple[str, ...] = ()  # adapters load only from below these
    max_lora_rank: int = 64
    max_loras: int = 4  # distinct adapters in one running batch
    dtype: str = "auto"  # auto | bfloat16 | float16 | float32
    device: str = "auto"  # auto | cpu | cuda[:i]
    max_model_len: int | None = None  # default: the model config's max_position_embeddings
    max_num_seqs: int = 32  # rows decoded together
    max_queue: int = 256  # waiting sequences before 429
    max_prefill_tokens: int = 4096  # padded prompt tokens prefilled in one forward
    threads: int | None = None  # torch threads; default: all cores
    trust_request_chat_template: bool = False  # run a request's own chat_template (sandboxed)
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # larger bodies get 413
    log_level: str = "info"

    def __post_init__(self) -> None:
        self.validate()

    @property
    def model_id(self) -> str:
        return self.served_model_name or self.model

    def validate(self) -> None:
        """ValueError naming the flag (`--max-num-seqs`) of the first value that cannot work."""
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError("the model is empty: give a hub id or a local folder")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("--served-model-name is empty: leave it out or give a name")
        for name, low, high in _INT_RANGES:
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be a whole number in [{low}, {high}], got {value!r}")
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                flag = "--" + name.replace("_", "-")
                raise ValueError(
                    f"unknown {flag} {getattr(self, name)!r}: use one of {', '.join(allowed)}"
                )
        if not _DEVICE.fullmatch(str(self.device)):
            raise ValueError(f"unknown --device {self.device!r}: use auto, cpu, cuda or cuda:N")


_BIG = 2**31 - 1
_INT_RANGES = (
    ("port", 0, 65535),  # 0: any free port
    ("max_lora_rank", 1, 4096),
    ("max_loras", 1, 1024),
    ("max_model_len", 1, _BIG),
    ("max_num_seqs", 1, 65536),
    ("max_queue", 1, _BIG),
    ("max_prefill_tokens", 1, _BIG),
    ("threads", 1, 4096),
    ("max_request_bytes", 1, 2**40),
)
_OPTIONAL = {"max_model_len", "threads"}
DTYPES = ("auto", "bfloat16", "float16", "float32", "half", "float")  # vLLM's aliases too
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
_CHOICES = {"dtype": DTYPES, "log_level": LOG_LEVELS}
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?|mps")


def cpu_supports_bf16() -> bool:
    """True when the CPU has native bf16 matmuls (AVX512-BF16 or AMX), where bf16 is fast."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags for f in ("avx512_bf16", "amx_bf16"))


def choose_dtype(name: str, device: str):
    """'auto': bf16 on GPUs and on bf16-capable CPUs, else fp32; otherwise the named dtype."""
    import torch

    if name != "auto":
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown --dtype {name!r}: use auto, bfloat16, float16 or float32")
        return dtype
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_supports_bf16() else torch.float32


def choose_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def build_engine(config: ServeConfig):
    """Resolve and load the model, and start the generation worker."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vfkit.hub import resolve_model
    from vfkit.serve.engine import Engine
    from vfkit.serve.lora import LoraManager

    threads = config.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    path = resolve_model(config.model)
    device = choose_device(config.device)
    dtype = choose_dtype(config.dtype, device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_model(AutoModelForCausalLM, path, dtype, device)
    model.requires_grad_(False)
    log.info(
        "loaded %s from %s on %s as %s (%d threads)", config.model, path, device, dtype, threads
    )
    max_len = config.max_model_len or getattr(model.config, "max_position_embeddings", None) or 2048
    engine = Engine(
        LoraManager(
            model, allowed_dirs=config.allowed_adapter_dirs, max_lora_rank=config.max_lora_rank
        ),
        tokenizer,
        max_model_len=int(max_len),
        eos_token_ids=_eos_ids(model, tokenizer),
        max_batch=config.max_num_seqs,
        max_queue=config.max_queue,
        max_prefill_tokens=config.max_prefill_tokens,
        max_loras=config.max_loras,
        threads=threads,
        model_path=str(path),
    )
    engine.start()
    return engine


def load_model(auto_cls, path, dtype, device: str = "cpu"):
    """The model in eval mode on `device` (PyTorch's SDPA attention measured fastest on CPU)."""
    return auto_cls.from_pretrained(path, dtype=dtype).to(device).eval()


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    for value in (eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(v for v in value if isinstance(v, int))
    return ids
