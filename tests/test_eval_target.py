"""Where vf-eval sends requests: API key variables, the fast reachability probe (real sockets)."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from vfkit.errors import ConfigError, ServerError
from vfkit.evaluation.target import (
    Target,
    _served_base_model,
    api_key_from_env,
    check_served,
    probe,
)
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


class _NoModelsRoute(http.server.BaseHTTPRequestHandler):
    """A proxy without a /models route: every GET is a 404."""

    def do_GET(self) -> None:
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def no_models_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoModelsRoute)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_probe_of_a_url_missing_v1_says_which_url_to_pass():
    """A -b without /v1 got 404 on /models, was let through, and every rollout 404'd."""
    with TestServer("hi") as srv:
        root = srv.base_url.removesuffix("/v1")
        with pytest.raises(ConfigError) as info:
            probe(root, "k", {}, timeout=10, origin="-b/--api-base-url")
    message = str(info.value)
    assert message.startswith("-b/--api-base-url") and "end in /v1" in message
    assert f"Pass {srv.base_url}" in message


def test_probe_lets_a_server_without_a_models_route_through(no_models_server, caplog):
    assert probe(no_models_server + "/v1", "k", {}, timeout=10) == []  # a proxy: fine
    assert probe(no_models_server, "k", {}, timeout=10) == []  # /v1 would not help either
    assert "does the URL end in /v1?" in caplog.text  # but the user is told what to check


def test_cannot_reach_names_the_registry_entry_not_the_b_flag(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"  # bound, not listening: refused
        origin = f"the url of endpoint 'mine' in {tmp_path / 'reg.toml'}"
        with pytest.raises(ServerError) as info:
            probe(url, "k", {}, timeout=10, origin=origin)
    assert f"Check {origin}" in str(info.value) and "-b/" not in str(info.value)


def _target(model: str, served: list[str], **kw: str) -> Target:
    return Target("http://h/v1", model, "k", "flag", served_models=served, **kw)


def test_a_model_the_server_does_not_list_is_refused_by_name():
    check_served(_target("test-model", ["test-model"]))
    check_served(_target("anything", []))  # a server that lists nothing: the requests tell
    with pytest.raises(ConfigError) as info:
        check_served(_target("gpt-x", ["test-model", "lora-a"]))
    assert str(info.value).startswith("-m/--model") and "'test-model', 'lora-a'" in str(info.value)
    with pytest.raises(ConfigError, match=r"^-m mine: the model of endpoint 'mine' in reg\.toml"):
        check_served(_target("gpt-x", ["test-model"],
                             model_origin="-m mine: the model of endpoint 'mine' in reg.toml"))
