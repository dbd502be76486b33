"""The settings of one `vf-eval` run, and the parsing of the flags that carry JSON or headers.

Every parse error names the flag it came from, so the CLI can print it as is.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vfkit.client.sampling import TOKEN_LIMIT_KEYS, sampling_keys
from vfkit.errors import ConfigError
from vfkit.evaluation.results import check_state_columns
from vfkit.evaluation.urls import check_base_url

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_NUM_EXAMPLES = 5
DEFAULT_ROLLOUTS_PER_EXAMPLE = 3
DEFAULT_API_KEY_VAR = "OPENAI_API_KEY"
DEFAULT_OUTPUT_DIR = Path("outputs/evals")
DEFAULT_ENDPOINTS = Path("configs/endpoints.toml")
MAX_ROLLOUTS_PER_EXAMPLE = 10_000  # beyond this, a typo rather than an experiment
MAX_TIMEOUT_S = 86_400.0  # one day per request
MAX_RETRIES = 100
ENV_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*(\.[A-Za-z0-9_][A-Za-z0-9_-]*)*$")
HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)
# sampling knob -> (lowest, highest, lowest allowed itself); the OpenAI API's ranges
_SAMPLING_RANGES = {
    "temperature": (0.0, None, True),
    "top_p": (0.0, 1.0, False),
    "presence_penalty": (-2.0, 2.0, True),
    "frequency_penalty": (-2.0, 2.0, True),
}
# sampling keys vf-eval sets itself, or cannot work with -> what to do instead
_REFUSED_SAMPLING_KEYS = {
    "stream": "vf-eval reads whole responses (with their token ids); leave it out",
    "stream_options": "vf-eval reads whole responses (with their token ids); leave it out",
    "n": "each request samples one completion; use -r/--rollouts-per-example for more",
    "model": "use -m/--model",
    "messages": "the environment writes the prompts",
    "prompt": "the environment writes the prompts",
    "tools": "the environment declares its tools",
    "functions": "the environment declares its tools",
    "function_call": "the environment declares its tools",
    "timeout": "use --timeout",
    "extra_headers": "use --header",
}


@dataclass
class EvalConfig:
    """What `vf-eval` was asked to do; None means "not given" (a default or resumed run decides)."""

    env_id: str | None = None
    env_args: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    api_base_url: str | None = None
    api_key_var: str | None = None  # None: OPENAI_API_KEY, optional for local servers
    headers: dict[str, str] = field(default_factory=dict)
    endpoints_path: Path | None = None  # None: configs/endpoints.toml when it exists
    num_examples: int | None = None
    rollouts_per_example: int | None = None
    max_concurrent: int = 32
    sampling_args: dict[str, Any] = field(default_factory=dict)
    state_columns: list[str] = field(default_factory=list)
    save_results: bool = False
    save_every: int = 1  # write results after every N finished rollouts (whole groups)
    output_dir: Path = DEFAULT_OUTPUT_DIR
    resume: Path | None = None
    timeout: float = 600.0  # seconds per model request
    max_retries: int = 3
    verbose: bool = False

    def __post_init__(self) -> None:
        self.validate()
        if self.resume is not None:
            self.save_results = True  # a resumed run appends to its own results

    def validate(self) -> None:
        """Check every value where it enters: each error names its flag and what to pass."""
        if not isinstance(self.env_args, dict) or not isinstance(self.sampling_args, dict):
            raise ConfigError("-a/--env-args and -S/--sampling-args must be JSON objects")
        if self.env_id is not None and not (
            isinstance(self.env_id, str) and ENV_ID_RE.match(self.env_id)
        ):
            raise ConfigError(
                f"ENV_ID: {self.env_id!r} is not an environment id; ids are letters, digits, "
                "'-' and '_' (e.g. reverse-text), the name of an installed environment package"
            )
        if self.num_examples is not None:
            check_int(self.num_examples, "-n/--num-examples", minimum=1, also=(-1,))
        if self.rollouts_per_example is not None:
            check_int(self.rollouts_per_example, "-r/--rollouts-per-example", minimum=1,
                      maximum=MAX_ROLLOUTS_PER_EXAMPLE)
        check_int(self.max_concurrent, "-c/--max-concurrent", minimum=1, also=(-1,))
        check_int(self.save_every, "-f/--save-every", minimum=1)
        check_number(self.timeout, "--timeout", minimum=0, inclusive=False,
                     maximum=MAX_TIMEOUT_S, unit=" seconds")
        check_int(self.max_retries, "--max-retries", minimum=0, maximum=MAX_RETRIES)
        check_sampling_args(self.sampling_args, "-S/--sampling-args")
        check_state_columns(self.state_columns)
        if self.api_base_url is not None:
            self.api_base_url = check_base_url(self.api_base_url, "-b/--api-base-url")
        self.output_dir = Path(self.output_dir)
        if self.output_dir.exists() and not self.output_dir.is_dir():
            raise ConfigError(f"-o/--output-dir: {self.output_dir} is a file; pass a folder")


def _range_text(minimum: float, maximum: float | None, also: tuple, inclusive: bool) -> str:
    low = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
    text = low if maximum is None else f"{low} and <= {maximum:g}"
    return text + "".join(f" (or {a})" for a in also)


def check_int(
    value: Any, flag: str, *, minimum: int, maximum: int | None = None, also: tuple = ()
) -> int:
    """`value` if it is an integer in range (or one of `also`); else a ConfigError naming `flag`."""
    in_range = isinstance(value, int) and not isinstance(value, bool) and (
        value in also or (value >= minimum and (maximum is None or value <= maximum)))
    if not in_range:
        raise ConfigError(
            f"{flag} must be an integer {_range_text(minimum, maximum, also, True)}, got {value!r}"
        )
    return value


def check_number(
    value: Any,
    flag: str,
    *,
    minimum: float,
    inclusive: bool = True,
    maximum: float | None = None,
    unit: str = "",
) -> float:
    """`value` if it is a finite number in range; NaN, inf and the rest are a named ConfigError."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value >= minimum if inclusive else value > minimum) and (
            maximum is None or value <= maximum)
    if not ok:
        raise ConfigError(
            f"{flag} must be a finite number{unit} {_range_text(minimum, maximum, (), inclusive)}"
            f", got {value!r}"
        )
    return value


def check_sampling_args(args: dict[str, Any], flag: str) -> None:
    """Keys the openai client takes (null: unset), token limits positive integers, the usual
    knobs finite numbers in their ranges; anything else is a ConfigError naming the key."""
    for key in args:
        if key in _REFUSED_SAMPLING_KEYS:
            raise ConfigError(f"{flag}: {key!r} is not allowed: {_REFUSED_SAMPLING_KEYS[key]}")
    known = sampling_keys() - set(_REFUSED_SAMPLING_KEYS)
    unknown = sorted(set(args) - known)
    if unknown:
        raise ConfigError(
            f"{flag}: unknown key(s) {unknown}; known: {', '.join(sorted(known))}. A key only "
            f"your server knows goes in extra_body: '{{\"extra_body\": {{\"{unknown[0]}\": ...}}}}'"
        )
    if args.get("extra_body") is not None and not isinstance(args["extra_body"], dict):
        raise ConfigError(f"{flag}: extra_body must be a JSON object, got {args['extra_body']!r}")
    for key in TOKEN_LIMIT_KEYS:
        if args.get(key) is not None:
            check_int(args[key], f"{flag}: {key}", minimum=1)
    for key, (low, high, inclusive) in _SAMPLING_RANGES.items():
        if args.get(key) is not None:
            check_number(args[key], f"{flag}: {key}", minimum=low, maximum=high,
                         inclusive=inclusive)


def parse_json_object(text: str | None, flag: str) -> dict[str, Any]:
    """Parse a flag's JSON value, which must be an object; the error names the flag."""
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except ValueError as exc:
        if not isinstance(exc, json.JSONDecodeError):  # NaN / Infinity
            raise ConfigError(f"{flag}: {exc} in {text!r}; JSON numbers must be finite") from None
        raise ConfigError(
            f"{flag}: not valid JSON ({exc.msg} at column {exc.colno}) in {text!r}; "
            """pass one JSON object in single quotes, e.g. '{"key": "value"}'"""
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag}: expected a JSON object ({{...}}), got {text!r}")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number vf-eval accepts")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows to infinity")
    return value


def parse_headers(values: list[str] | None) -> dict[str, str]:
    """Parse repeated `--header 'Name: Value'` flags into a dict."""
    headers: dict[str, str] = {}
    for item in values or []:
        name, sep, value = item.partition(":")
        if not sep or not HEADER_NAME_RE.match(name.strip()):
            raise ConfigError(f"--header: expected 'Name: Value', got {item!r}")
        if any(c in value for c in "\r\n\0"):
            raise ConfigError(f"--header {name.strip()}: the value may not hold line breaks")
        headers[name.strip()] = value.strip()
    return headers


def parse_state_columns(values: list[str] | None) -> list[str]:
    """Parse repeated and/or comma-separated `-C` values into a list of state keys."""
    columns: list[str] = []
    for item in values or []:
        columns.extend(c.strip() for c in item.split(",") if c.strip())
    return list(dict.fromkeys(columns))


def build_sampling_args(
    max_tokens: int | None, temperature: float | None, sampling_json: str | None
) -> dict[str, Any]:
    """Merge -t and -T with the -S JSON object; -S wins where both set a key (a token limit
    in -S, either spelling, replaces -t). A null in -S unsets the environment's own value."""
    args: dict[str, Any] = {}
    if max_tokens is not None:
        args["max_tokens"] = check_int(max_tokens, "-t/--max-tokens", minimum=1)
    if temperature is not None:
        args["temperature"] = check_number(temperature, "-T/--temperature", minimum=0.0)
    given = parse_json_object(sampling_json, "-S/--sampling-args")
    if set(given) & set(TOKEN_LIMIT_KEYS):
        args.pop("max_tokens", None)
    args.update(given)
    return args
