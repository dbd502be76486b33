"""Where vf-eval sends its requests: `-b URL`, a registry entry, or an embedded server it starts.

Order: `-b` wins; else `-m` is looked up in the endpoint registry; else a model that resolves to
local weights (an HF id or a folder) gets vfkit's embedded server, started here and stopped on
exit (also on Ctrl-C or an error); else the OpenAI API when its key is set.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from rich.console import Console

from vfkit.errors import ConfigError, ServerError, VfkitError
from vfkit.evaluation.config import (
    DEFAULT_API_KEY_VAR,
    DEFAULT_ENDPOINTS,
    DEFAULT_MODEL,
    EvalConfig,
)
from vfkit.evaluation.endpoints import find_endpoint
from vfkit.evaluation.urls import is_openai_api, redact_url

log = logging.getLogger(__name__)

OPENAI_URL = "https://api.openai.com/v1"
PROBE_TIMEOUT_S = 10.0  # the reachability probe never waits longer than this (or --timeout)


@dataclass
class Target:
    """A reachable OpenAI-compatible endpoint and the model name to ask it for."""

    base_url: str
    model: str
    api_key: str
    source: str  # "flag" | "registry" | "embedded" | "openai"
    headers: dict[str, str] = field(default_factory=dict)
    served_models: list[str] = field(default_factory=list)
    origin: str = "-b/--api-base-url"  # where the URL was given, named in errors
    registry_path: Path | None = None  # the endpoint registry it came from (source "registry")
    model_origin: str = "-m/--model"  # where the model name was given, named in errors


def api_key_from_env(var: str | None, url: str, *, where: str) -> str:
    """The API key for `url`: from env var `var` when one is named, else only for OpenAI's API.

    OPENAI_API_KEY goes to the OpenAI API unasked, and to any other server only when `-k` or a
    registry entry's `key` names it: a stray `-b` URL never receives it. A named variable that
    is unset is an error; an unnamed one for another server means no key ("EMPTY").
    """
    if var is None:
        if not is_openai_api(url):
            return "EMPTY"  # local servers (vLLM, vf-serve) run without a key by default
        var = DEFAULT_API_KEY_VAR
    value = os.environ.get(var)
    if value:
        return value
    raise ConfigError(
        f"{where}: the API key variable {var} is not set. "
        f"Export it (export {var}=...) or name another variable with -k/--api-key-var"
    )


def probe(base_url: str, api_key: str, headers: dict[str, str], timeout: float,
          origin: str = "-b/--api-base-url") -> list[str]:
    """GET {base_url}/models fast; returns the model ids it lists ([] when it lists none).

    Unreachable or key refused -> ServerError; a 404 where {base_url}/v1 would answer ->
    ConfigError naming `origin` (where the URL was given) and the URL to pass instead.
    """
    shown = redact_url(base_url)  # a password in the URL is never echoed
    auth = {"Authorization": f"Bearer {api_key}", **headers}
    wait = min(timeout / 2, PROBE_TIMEOUT_S)  # an unreachable server is reported well in time
    try:
        resp = httpx.get(base_url.rstrip("/") + "/models", headers=auth, timeout=wait)
    except httpx.TransportError as exc:
        reason = f"no answer within {wait:g} s" if isinstance(exc, httpx.TimeoutException) else exc
        reason = redact_url(str(reason))
        raise ServerError(
            f"cannot reach {shown} ({type(exc).__name__}: {reason}). Is a server running "
            f"at that address? Check {origin} (it usually ends in /v1)"
        ) from None
    if resp.status_code in (401, 403):
        raise ServerError(
            f"{shown} refused the API key (HTTP {resp.status_code}); check the variable "
            "named by -k/--api-key-var (or the registry entry's `key`)"
        )
    if resp.status_code == 404:
        _check_v1_suffix(base_url, auth, wait, origin)
    if resp.status_code != 200:
        return []  # some servers have no /models route: the requests themselves will tell
    with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
        return [m["id"] for m in resp.json()["data"]]
    return []


def _check_v1_suffix(base_url: str, auth: dict[str, str], wait: float, origin: str) -> None:
    """After a 404 on {base_url}/models: a ConfigError when {base_url}/v1 is the API's root.

    Only a URL without /v1 is questioned, and it is refused only when /v1 answers: some
    proxies have no /models route at all, and their URLs must keep working.
    """
    if urlsplit(base_url).path.rstrip("/").endswith("/v1"):
        return
    fixed = base_url.rstrip("/") + "/v1"
    shown = redact_url(base_url)
    try:
        answers = httpx.get(fixed + "/models", headers=auth, timeout=wait).status_code == 200
    except httpx.TransportError:
        answers = False
    if answers:
        raise ConfigError(
            f"{origin}: {shown} has no /models route (HTTP 404), but {redact_url(fixed)} "
            f"answers: does the URL end in /v1? Pass {redact_url(fixed)}"
        )
    log.warning("%s/models answered 404: does the URL end in /v1? (%s; requests that get 404 "
                "too are not saved, and the run stops)", shown, origin)


def check_served(target: Target) -> None:
    """ConfigError when the server lists its models and `target.model` is not one of them."""
    served = target.served_models
    if not served or target.model in served:
        return
    listed = ", ".join(repr(m) for m in served[:20]) + (" ..." if len(served) > 20 else "")
    raise ConfigError(
        f"{target.model_origin}: {redact_url(target.base_url)} does not serve model "
        f"{target.model!r}; it serves {listed}. Pass one of those (with -b and no -m, vf-eval "
        "uses the first)"
    )


def _served_base_model(ids_and_parents: list[dict[str, Any]], wanted: str) -> str:
    """The base model id an embedded server serves (not a LoRA adapter's name)."""
    ids = [m.get("id") for m in ids_and_parents]
    if wanted in ids:
        return wanted
    bases = [m.get("id") for m in ids_and_parents if not m.get("parent")]
    return (bases or ids or [wanted])[0]


@contextlib.contextmanager
def embedded_server(model: str, log_path: Path | None, console: Console) -> Iterator[Target]:
    """Start vfkit's server for local weights `model`; always stopped when the block exits."""
    from vfkit.serve.launcher import start_server

    server = None
    try:
        with console.status(f"Starting the embedded server for {model} ..."):
            server = start_server(model, log_path=log_path)  # returns once /health answers
        resp = httpx.get(server.base_url.rstrip("/") + "/models", timeout=PROBE_TIMEOUT_S)
        served = resp.json().get("data", []) if resp.status_code == 200 else []
        name = _served_base_model(served, model)
        console.print(f"Embedded server ready at {server.base_url} (log: {server.log_path})",
                      markup=False)
        yield Target(server.base_url, name, "EMPTY", "embedded", served_models=[name])
    finally:
        if server is not None:
            server.stop()


def _resolve_local(model: str, console: Console) -> tuple[Path | None, str]:
    """Local weights for `model` (a folder or an HF id), or None and the reason there are none."""
    from vfkit.hub import resolve_model

    if Path(model).expanduser().exists() or model.startswith(("/", ".", "~")):
        return resolve_model(Path(model).expanduser()), ""  # a path: its errors are the answer
    try:
        with console.status(f"Resolving {model} ..."):
            return resolve_model(model), ""
    except (VfkitError, OSError, ValueError) as exc:
        log.info("%s does not resolve to local weights: %s", model, exc)
        return None, str(exc)


@contextlib.contextmanager
def open_target(cfg: EvalConfig, console: Console, log_path: Path | None) -> Iterator[Target]:
    """Decide where requests go (see the module docstring), check it answers, yield it."""
    model = cfg.model or DEFAULT_MODEL
    if cfg.api_base_url:
        key = api_key_from_env(cfg.api_key_var, cfg.api_base_url, where="-k/--api-key-var")
        target = Target(cfg.api_base_url, cfg.model or "", key, "flag", dict(cfg.headers))
    elif endpoint := find_endpoint(model, cfg.endpoints_path, default_path=DEFAULT_ENDPOINTS):
        var = cfg.api_key_var or endpoint.key
        key = api_key_from_env(var, endpoint.url, where=f"endpoint {endpoint.id!r}")
        target = Target(endpoint.url, endpoint.model, key, "registry", dict(cfg.headers),
                        origin=f"the url of {endpoint.origin()}", registry_path=endpoint.path,
                        model_origin=f"-m {endpoint.id}: the model of {endpoint.origin()}")
    else:
        local, why_not = _resolve_local(model, console)
        if local is not None:
            with embedded_server(str(local), log_path, console) as target:
                target.headers = dict(cfg.headers)
                yield target
            return
        if not os.environ.get(cfg.api_key_var or DEFAULT_API_KEY_VAR):
            raise ConfigError(
                f"-m {model}: not in the endpoint registry and no local weights ({why_not}). "
                "Pass -b URL for a running OpenAI-compatible server, add the model to "
                "configs/endpoints.toml (or -e FILE), or set OPENAI_API_KEY to use the OpenAI API"
            )
        key = api_key_from_env(cfg.api_key_var, OPENAI_URL, where="-k/--api-key-var")
        target = Target(OPENAI_URL, model, key, "openai", dict(cfg.headers),
                        origin="the OpenAI API (no -b, and -m is not in the registry)")
    target.served_models = probe(target.base_url, target.api_key, target.headers, cfg.timeout,
                                 target.origin)
    if not target.model:  # -b without -m: ask for the (first) model the server lists
        target.model = target.served_models[0] if target.served_models else DEFAULT_MODEL
    check_served(target)
    yield target
