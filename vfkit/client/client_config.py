"""Accept a client *config* where a client is expected (the 2026-02 classic verifiers contract).

prime-rl and verifiers of early 2026 hand `run_group` / `generate` a `ClientConfig` (pydantic:
`api_base_url`, `api_key_var`, `timeout`, `max_retries`, `extra_headers`, `endpoint_configs`,
`client_idx`, `client_type`) instead of an `AsyncOpenAI`. `resolve_client` builds the client
from such an object (duck-typed: vfkit does not import verifiers) and passes real clients
through:

    client = resolve_client(config)     # AsyncOpenAI for config.api_base_url
"""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import Any

from openai import AsyncOpenAI

from vfkit.errors import ConfigError

SUPPORTED_CLIENT_TYPES = ("openai_chat_completions", "openai_completions")
# one client per config and event loop (a client's connection pool belongs to its loop)
_clients: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], AsyncOpenAI]] = (
    weakref.WeakKeyDictionary())


def is_client_config(client: Any) -> bool:
    """True for a config object (it names a base URL but has no `.chat` API of its own)."""
    return not hasattr(client, "chat") and hasattr(client, "api_base_url")


def _field(config: Any, name: str, default: Any = None) -> Any:
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


def _endpoint(config: Any) -> Any:
    """The endpoint this config selects: endpoint_configs[client_idx] when it lists several."""
    endpoints = list(_field(config, "endpoint_configs") or [])
    if not endpoints:
        return config
    return endpoints[int(_field(config, "client_idx", 0) or 0) % len(endpoints)]


def resolve_client(client: Any) -> Any:
    """`client` itself, or an AsyncOpenAI built from a ClientConfig-shaped object (cached)."""
    if not is_client_config(client):
        return client
    kind = _field(client, "client_type", "openai_chat_completions")
    if kind not in SUPPORTED_CLIENT_TYPES:
        raise ConfigError(f"ClientConfig.client_type {kind!r} is not supported by vfkit; use one "
                          f"of {list(SUPPORTED_CLIENT_TYPES)}")
    endpoint = _endpoint(client)
    base_url = _field(endpoint, "api_base_url") or _field(client, "api_base_url")
    key_var = _field(endpoint, "api_key_var") or _field(client, "api_key_var") or ""
    headers = {**(_field(client, "extra_headers") or {}), **(_field(endpoint, "extra_headers")
                                                              or {})}
    timeout = float(_field(client, "timeout", 600.0))
    retries = int(_field(client, "max_retries", 3))
    try:
        loop: Any = asyncio.get_running_loop()
    except RuntimeError:  # built outside a loop: not cached
        loop = None
    clients = _clients.setdefault(loop, {}) if loop is not None else {}
    key = (base_url, key_var, tuple(sorted(headers.items())), timeout, retries)
    if key not in clients:
        clients[key] = AsyncOpenAI(
            base_url=base_url, api_key=os.environ.get(key_var) or "EMPTY",
            default_headers=headers or None, timeout=timeout, max_retries=retries,
        )
    return clients[key]
