"""Where vf-eval sends requests: API key variables, the fast reachability probe (real sockets)."""

from __future__ import annotations

import socket
import time

import pytest

from vfkit.errors import ConfigError, ServerError
from vfkit.evaluation.target import _served_base_model, api_key_from_env, probe
from vfkit.testing.scripted_server import TestServer


def test_api_key_variables(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("SOME_KEY", "v")
    assert api_key_from_env("SOME_KEY", "http://h/v1", where="-k") == "v"
    assert api_key_from_env(None, "http://127.0.0.1:8000/v1", where="-k") == "EMPTY"  # local
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):  # OpenAI itself needs one
        api_key_from_env(None, "https://api.openai.com/v1", where="-k")
    with pytest.raises(ConfigError, match="UNSET_KEY_VAR"):  # a named variable must exist
        api_key_from_env("UNSET_KEY_VAR", "http://h/v1", where="-k")


def test_probe_lists_models_and_reports_a_refused_key():
    with TestServer("hi", model="served", api_key="right") as srv:
        assert probe(srv.base_url, "right", {}, timeout=10) == ["served"]
        with pytest.raises(ServerError, match="401"):
            probe(srv.base_url, "wrong", {}, timeout=10)


def test_probe_gives_up_on_a_silent_server_within_half_the_timeout():
    with socket.socket() as sock:  # accepts TCP connections (backlog) but never answers
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        start = time.monotonic()
        with pytest.raises(ServerError, match="cannot reach"):
            probe(url, "k", {}, timeout=2.0)
        assert time.monotonic() - start < 2.0


def test_served_base_model_prefers_the_asked_name_then_a_base_model():
    served = [{"id": "lora-a", "parent": "base"}, {"id": "base", "parent": None}]
    assert _served_base_model(served, "lora-a") == "lora-a"
    assert _served_base_model(served, "/path/to/model") == "base"
    assert _served_base_model([], "x") == "x"
