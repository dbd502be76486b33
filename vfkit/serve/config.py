"""Server settings: what `vf-serve` accepts, validated where it enters (model.py loads it)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from vfkit.serve.limits import DEFAULT_MAX_REQUEST_BYTES

# Images one prompt may carry when --limit-mm-per-prompt does not say (vf-serve and, for a VLM,
# the vLLM backend): enough for a multi-turn tool episode (the picture plus a few zoomed crops),
# small enough that one request cannot make the server decode hundreds of images.
DEFAULT_IMAGES_PER_PROMPT = 8


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
    # decode steps replayed as CUDA graphs (graphs.py): off | auto (on CUDA, text models) | on.
    # Off by default until a live GPU server run verifies it (benchmarks/RESULTS.md, GPU).
    cuda_graphs: str = "off"
    trust_request_chat_template: bool = False  # run a request's own chat_template (sandboxed)
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # larger bodies get 413
    log_level: str = "info"
    # image-text-to-text models: local image files only from below this folder (vLLM's flag;
    # None: data URLs only), and at most this many items per modality in one prompt
    allowed_local_media_path: str | None = None
    limit_mm_per_prompt: dict[str, int] = field(
        default_factory=lambda: {"image": DEFAULT_IMAGES_PER_PROMPT}
    )

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
        self._validate_mm_limits()
        if not _DEVICE.fullmatch(str(self.device)):
            raise ValueError(f"unknown --device {self.device!r}: use auto, cpu, cuda or cuda:N")

    @property
    def max_images(self) -> int:
        """Images allowed in one prompt (--limit-mm-per-prompt's "image")."""
        return self.limit_mm_per_prompt.get("image", DEFAULT_IMAGES_PER_PROMPT)

    def _validate_mm_limits(self) -> None:
        limits = self.limit_mm_per_prompt
        if not isinstance(limits, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in limits.items()
        ):
            raise ValueError(
                f"--limit-mm-per-prompt must map modalities to counts >= 0, e.g. "
                f"'{{\"image\": 4}}', got {limits!r}"
            )


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
CUDA_GRAPHS = ("auto", "on", "off")
_CHOICES = {"dtype": DTYPES, "log_level": LOG_LEVELS, "cuda_graphs": CUDA_GRAPHS}
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?|mps")


def parse_mm_limits(text: str) -> dict[str, int]:
    """--limit-mm-per-prompt as vLLM reads it: JSON ('{"image": 4}') or the older 'image=4'."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            key, sep, count = item.partition("=")
            if not sep or not count.strip().isdigit():
                raise ValueError(
                    f"--limit-mm-per-prompt {text!r}: give JSON such as '{{\"image\": 4}}'"
                ) from None
            value[key.strip()] = int(count)
    if not isinstance(value, dict):
        raise ValueError(f"--limit-mm-per-prompt {text!r}: give JSON such as '{{\"image\": 4}}'")
    return value
