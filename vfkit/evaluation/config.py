"""The settings of one `vf-eval` run, and the parsing of the flags that carry JSON or headers.

Every parse error names the flag it came from, so the CLI can print it as is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vfkit.errors import ConfigError
from vfkit.evaluation.urls import check_base_url

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_NUM_EXAMPLES = 5
DEFAULT_ROLLOUTS_PER_EXAMPLE = 3
DEFAULT_API_KEY_VAR = "OPENAI_API_KEY"
DEFAULT_OUTPUT_DIR = Path("outputs/evals")
DEFAULT_ENDPOINTS = Path("configs/endpoints.toml")


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
        if self.num_examples is not None and (self.num_examples == 0 or self.num_examples < -1):
            raise ConfigError("-n/--num-examples must be a positive number (or -1 for all)")
        if self.rollouts_per_example is not None and self.rollouts_per_example < 1:
            raise ConfigError("-r/--rollouts-per-example must be at least 1")
        if self.max_concurrent == 0 or self.max_concurrent < -1:
            raise ConfigError("-c/--max-concurrent must be a positive number (or -1 for no limit)")
        if self.save_every < 1:
            raise ConfigError("-f/--save-every must be at least 1")
        if self.timeout <= 0:
            raise ConfigError("--timeout must be a positive number of seconds")
        if self.max_retries < 0:
            raise ConfigError("--max-retries must be 0 or more")
        if self.api_base_url is not None:
            self.api_base_url = check_base_url(self.api_base_url, "-b/--api-base-url")
        if self.resume is not None:
            self.save_results = True  # a resumed run appends to its own results


def parse_json_object(text: str | None, flag: str) -> dict[str, Any]:
    """Parse a flag's JSON value, which must be an object; the error names the flag."""
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{flag}: not valid JSON ({exc.msg} at column {exc.colno}) in {text!r}; "
            """pass one JSON object in single quotes, e.g. '{"key": "value"}'"""
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag}: expected a JSON object ({{...}}), got {text!r}")
    return value


def parse_headers(values: list[str] | None) -> dict[str, str]:
    """Parse repeated `--header 'Name: Value'` flags into a dict."""
    headers: dict[str, str] = {}
    for item in values or []:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise ConfigError(f"--header: expected 'Name: Value', got {item!r}")
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
    """Merge -t and -T with the -S JSON object; -S wins where both set a key."""
    args: dict[str, Any] = {}
    if max_tokens is not None:
        if max_tokens < 1:
            raise ConfigError("-t/--max-tokens must be at least 1")
        args["max_tokens"] = max_tokens
    if temperature is not None:
        if temperature < 0:
            raise ConfigError("-T/--temperature must be 0 or more")
        args["temperature"] = temperature
    args.update(parse_json_object(sampling_json, "-S/--sampling-args"))
    return args
