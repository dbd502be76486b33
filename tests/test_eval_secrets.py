"""Secrets in vf-eval: OPENAI_API_KEY only where it belongs, URL passwords never echoed.

Real CLI in a subprocess, real HTTP to the scripted TestServer, which records the bearer token
each request carried.
"""

from __future__ import annotations

import json

import pytest
from test_eval_cli import _free_port, echo_responder, run_dirs, vf_eval

from vfkit.errors import ConfigError
from vfkit.evaluation.urls import check_base_url, is_openai_api, redact_text, redact_url
from vfkit.testing.scripted_server import TestServer

SECRET = "sk-test-do-not-leak-1234"
PASSWORD = "hunter2-pw"


def recording_server() -> tuple[TestServer, list[str]]:
    """A TestServer and the Authorization headers it receives."""
    seen: list[str] = []
    srv = TestServer(echo_responder)

    @srv.app.middleware("http")
    async def record(request, call_next):
        seen.append(request.headers.get("authorization", ""))
        return await call_next(request)

    return srv, seen


@pytest.mark.parametrize(
    ("url", "belongs"),
    [
        ("https://api.openai.com/v1", True),
        ("https://API.OpenAI.com/v1/", True),
        ("http://api.openai.com/v1", False),  # never in clear text
        ("https://api.openai.com.evil.example/v1", False),
        ("https://evil.example/v1?next=api.openai.com", False),
        ("http://127.0.0.1:8000/v1", False),
    ],
)
def test_only_the_openai_api_is_given_the_key_unasked(url, belongs):
    assert is_openai_api(url) is belongs


def test_passwords_are_redacted_everywhere_in_a_text():
    text = f"cannot reach http://me:{PASSWORD}@h:8/v1 and https://u:p@ss@x/v1, not http://h/a@b"
    assert redact_text(text) == (
        "cannot reach http://me:***@h:8/v1 and https://u:***@x/v1, not http://h/a@b"
    )
    assert redact_url("http://h:8000/v1") == "http://h:8000/v1"
    with pytest.raises(ConfigError) as info:
        check_base_url(f"me:{PASSWORD}@h:8000/v1", "-b/--api-base-url")  # no scheme
    assert "-b/--api-base-url" in str(info.value)


def test_openai_key_is_not_sent_to_a_b_url_unless_k_names_it(tmp_path):
    srv, seen = recording_server()
    with srv:
        args = ("eval-echo", "-b", srv.base_url, "-m", "test-model", "-n", "1", "-r", "1")
        proc = vf_eval(tmp_path, *args, OPENAI_API_KEY=SECRET)
        assert proc.returncode == 0, proc.stderr
        assert seen and all(SECRET not in auth for auth in seen)
        seen.clear()
        proc = vf_eval(tmp_path, *args, "-k", "OPENAI_API_KEY", OPENAI_API_KEY=SECRET)
        assert proc.returncode == 0, proc.stderr
        assert seen and all(auth == f"Bearer {SECRET}" for auth in seen)  # asked for: sent


def test_openai_key_is_not_sent_to_a_registry_entry_without_key(tmp_path):
    srv, seen = recording_server()
    with srv:
        (tmp_path / "configs").mkdir()
        (tmp_path / "configs" / "endpoints.toml").write_text(  # like the shipped local-smollm2
            f'[[endpoint]]\nid = "local"\nmodel = "test-model"\nurl = "{srv.base_url}"\n'
        )
        proc = vf_eval(tmp_path, "eval-echo", "-m", "local", "-n", "1", "-r", "1",
                       OPENAI_API_KEY=SECRET)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    assert seen and all(SECRET not in auth for auth in seen)


def _assert_no_password(*texts: str) -> None:
    for text in texts:
        assert PASSWORD not in text, text


@pytest.mark.parametrize("verbose", [[], ["-v"]])
def test_a_password_in_an_unreachable_b_url_is_not_echoed(tmp_path, verbose):
    url = f"http://user:{PASSWORD}@127.0.0.1:{_free_port()}/v1"
    proc = vf_eval(tmp_path, "eval-echo", "-b", url, "--timeout", "4", *verbose)
    assert proc.returncode == 1
    assert "cannot reach http://user:***@127.0.0.1" in proc.stderr
    _assert_no_password(proc.stdout, proc.stderr)


def test_a_password_in_a_b_url_stays_out_of_files_and_resume_asks_for_it(tmp_path):
    with TestServer(echo_responder) as srv:
        url = srv.base_url.replace("http://", f"http://user:{PASSWORD}@")
        proc = vf_eval(tmp_path, "eval-echo", "-b", url, "-n", "2", "-r", "1", "-s", "-v")
        assert proc.returncode == 0, proc.stderr
        _assert_no_password(proc.stdout, proc.stderr)
        (run_dir,) = run_dirs(tmp_path / "outputs" / "evals")
        for path in run_dir.iterdir():
            if path.is_file():
                _assert_no_password(path.read_text(errors="replace"))
        meta = json.loads((run_dir / "metadata.json").read_text())
        assert meta["base_url"] == srv.base_url.replace("http://", "http://user:***@")
        # resuming needs the URL again: the run folder does not have the password
        (run_dir / "results.jsonl").write_text("")
        proc = vf_eval(tmp_path, "--resume", str(run_dir))
        assert proc.returncode == 1 and "-b/--api-base-url" in proc.stderr
        _assert_no_password(proc.stderr)
        proc = vf_eval(tmp_path, "--resume", str(run_dir), "-b", url)
        assert proc.returncode == 0, proc.stderr
    _assert_no_password(proc.stdout, proc.stderr, (run_dir / "metadata.json").read_text())

