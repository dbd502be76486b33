"""vf-eval under hostile and careless use: every bad value is refused by name, nothing is lost.

Table-driven. Flag cases run the real entry point (`vfkit.cli.eval.main`) in-process and check
the exit code, that the message names the flag, that no traceback is printed and that nothing
was written; run-folder cases talk real HTTP to the scripted TestServer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_eval_cli import FIXTURE_ENV, echo_responder, read_rows, run_dirs

from vfkit.cli.eval import main
from vfkit.testing.scripted_server import TestServer

UNREACHABLE = "http://127.0.0.1:9/v1"  # never contacted: every case fails before any request


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """Run vf-eval in-process in an empty folder; returns (exit code, stderr); the last run's
    stdout (the summary) is left in `cli.stdout`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(FIXTURE_ENV))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    def run(*argv: str) -> tuple[int, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's own refusals (not a number at all)
            code = exc.code
        captured = capsys.readouterr()
        run.stdout = captured.out
        return code, captured.err

    return run


FLAG_CASES = [
    # (flags, words the error must contain)
    (["-n", "0"], ["-n/--num-examples", "got 0"]),
    (["-n", "-5"], ["-n/--num-examples"]),
    (["-n", "abc"], ["-n/--num-examples", "invalid int"]),
    (["-r", "0"], ["-r/--rollouts-per-example"]),
    (["-r", "-1"], ["-r/--rollouts-per-example"]),
    (["-r", "100001"], ["-r/--rollouts-per-example", "<= 10000"]),
    (["-c", "0"], ["-c/--max-concurrent"]),
    (["-c", "-7"], ["-c/--max-concurrent"]),
    (["-t", "0"], ["-t/--max-tokens"]),
    (["-t", "-3"], ["-t/--max-tokens"]),
    (["-t", "1.5"], ["-t/--max-tokens", "invalid int"]),
    (["-T", "nan"], ["-T/--temperature", "finite"]),
    (["-T", "inf"], ["-T/--temperature", "finite"]),
    (["-T", "-0.5"], ["-T/--temperature"]),
    (["--timeout", "nan"], ["--timeout", "finite"]),
    (["--timeout", "inf"], ["--timeout", "finite"]),
    (["--timeout", "0"], ["--timeout", "> 0"]),
    (["--timeout", "-1"], ["--timeout"]),
    (["--timeout", "1e12"], ["--timeout", "<= 86400"]),
    (["--max-retries", "-1"], ["--max-retries"]),
    (["--max-retries", "1000"], ["--max-retries", "<= 100"]),
    (["-f", "0"], ["-f/--save-every"]),
    (["-f", "-2"], ["-f/--save-every"]),
    (["-S", '{"temperature": NaN}'], ["-S/--sampling-args", "NaN"]),
    (["-S", '{"temperature": 1e999}'], ["-S/--sampling-args", "infinity"]),
    (["-S", '{"max_tokens": 0}'], ["-S/--sampling-args", "max_tokens"]),
    (["-S", '{"max_tokens": "many"}'], ["-S/--sampling-args", "max_tokens"]),
    (["-S", '{"top_p": 1.5}'], ["-S/--sampling-args", "top_p"]),
    (["-S", "{temperature: 1}"], ["-S/--sampling-args", "not valid JSON"]),
    # keys the client cannot take used to fail every rollout (TypeError, AttributeError)
    (["-S", '{"foo": 1}'], ["-S/--sampling-args", "['foo']", "temperature", "extra_body"]),
    (["-S", '{"stream": true}'], ["-S/--sampling-args", "'stream'"]),
    (["-S", '{"n": 3}'], ["-S/--sampling-args", "'n'", "-r/--rollouts-per-example"]),
    (["-S", '{"extra_body": [1]}'], ["-S/--sampling-args", "extra_body", "JSON object"]),
    (["-S", "[1]"], ["-S/--sampling-args", "JSON object"]),
    (["-a", "{bad"], ["-a/--env-args", "not valid JSON"]),
    (["-a", '"text"'], ["-a/--env-args", "JSON object"]),
    (["-a", '{"num_rows": Infinity}'], ["-a/--env-args", "Infinity"]),
    (["-a", '{"no_such_arg": 1}'], ["-a/--env-args", "no_such_arg"]),
    # the environment's own code fails on the value: the error names the argument and the env
    (["-a", '{"num_rows": "two"}'],
     ["-a/--env-args", "eval-echo", '"num_rows": "two"', "TypeError"]),
    (["-b", "localhost:8000/v1"], ["-b/--api-base-url", "http(s)"]),
    (["-b", "ftp://127.0.0.1/v1"], ["-b/--api-base-url", "http(s)"]),
    (["-b", "http://"], ["-b/--api-base-url"]),
    (["-b", "http://127.0.0.1:port/v1"], ["-b/--api-base-url", "not a valid URL"]),
    (["--header", "no-colon"], ["--header"]),
    # a -C naming a column every row has was silently ignored
    (["-C", "turn,reward"], ["-C/--state-columns", "'reward'"]),
    (["-C", "exact"], ["-C/--state-columns", "'exact'", "reward function"]),  # eval-echo's
    (["--header", "Bad Name: v"], ["--header"]),
    (["--header", "X-A: v\r\nInjected: 1"], ["--header X-A", "line breaks"]),
    (["-e", "."], ["-e/--endpoints", "cannot read"]),
    (["-o", "afile"], ["-o/--output-dir", "is a file"]),
    # these gave a raw OSError, and only after the target (maybe a local model) was opened
    (["-o", "afile/sub"], ["-o/--output-dir", "afile is a file"]),
    (["-o", "/proc/vfk"], ["-o/--output-dir", "/proc/vfk", "cannot create"]),
]


@pytest.mark.parametrize(("flags", "expected"), FLAG_CASES, ids=lambda v: " ".join(v))
def test_bad_flag_values_are_refused_by_name(cli, tmp_path, flags, expected):
    (tmp_path / "afile").write_text("not a folder")
    base = [] if {"-b", "-e"} & set(flags) else ["-b", UNREACHABLE]
    code, err = cli("eval-echo", *base, *flags, "-s")
    assert code in (1, 2), err  # 2: argparse's own usage error
    assert all(word in err for word in expected), err
    assert "Traceback" not in err
    assert not (tmp_path / "outputs").exists()  # refused before anything was written
    assert (tmp_path / "afile").read_text() == "not a folder"


@pytest.mark.parametrize(
    ("env_id", "expected"),
    [
        ("no-such-env", ["no-such-env", "vf-install"]),
        ("reverse-txt", ["reverse-txt", "Did you mean 'reverse-text'?"]),
        ("../../etc/passwd", ["ENV_ID", "not an environment id"]),
        (".hidden", ["ENV_ID"]),
        ("", ["ENV_ID"]),
    ],
)
def test_bad_environment_ids_are_named(cli, env_id, expected):
    code, err = cli(env_id, "-b", UNREACHABLE)
    assert code == 1
    assert all(word in err for word in expected), err
    assert "Traceback" not in err


def test_a_registry_entry_with_a_bad_url_is_named(cli, tmp_path):
    (tmp_path / "reg.toml").write_text('[[endpoint]]\nid = "x"\nmodel = "m"\nurl = "h:1/v1"\n')
    code, err = cli("eval-echo", "-m", "x", "-e", str(tmp_path / "reg.toml"))
    assert code == 1 and "reg.toml" in err and "'x'" in err and "url" in err, err
    assert "Traceback" not in err


def _finished_run(cli, tmp_path) -> tuple[Path, TestServer]:
    srv = TestServer(echo_responder).start()
    code, err = cli("eval-echo", "-b", srv.base_url, "-n", "3", "-r", "2", "-s")
    assert code == 0, err
    (run_dir,) = run_dirs(tmp_path / "outputs" / "evals")
    return run_dir, srv


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda lines: [lines[0], "{not json", *lines[2:]], ["line 2", "not valid JSON"]),
        (lambda lines: [lines[0], lines[1], "[1, 2]", *lines[3:]], ["line 3", "JSON object"]),
        (lambda lines: [lines[0], '{"rollout_idx": 1}', *lines[2:]], ["line 2", "example_id"]),
    ],
)
def test_resume_refuses_a_results_file_damaged_in_the_middle(cli, tmp_path, damage, expected):
    run_dir, srv = _finished_run(cli, tmp_path)
    try:
        path = run_dir / "results.jsonl"
        damaged = "\n".join(damage(path.read_text().splitlines())) + "\n"
        path.write_text(damaged)
        code, err = cli("--resume", str(run_dir))
        assert code == 1 and str(path) in err, err
        assert all(word in err for word in expected), err
        assert path.read_text() == damaged  # nothing truncated away
        assert len(srv.requests) == 6  # and nothing was run again
    finally:
        srv.stop()


def test_resume_drops_a_torn_last_line_with_a_warning_and_reruns_it(cli, tmp_path, caplog):
    run_dir, srv = _finished_run(cli, tmp_path)
    try:
        path = run_dir / "results.jsonl"
        lines = path.read_text().splitlines()
        path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:30])  # killed mid-write
        code, err = cli("--resume", str(run_dir))
        assert code == 0, err
        assert f"{path} line 6" in caplog.text and "torn" in caplog.text  # the warning
        assert len(srv.requests) == 7  # exactly the torn rollout ran again
        rows = read_rows(run_dir)
        assert sorted((r["example_id"], r["rollout_idx"]) for r in rows) == [
            (e, k) for e in range(3) for k in range(2)
        ]
        assert json.loads((run_dir / "metadata.json").read_text())["status"] == "completed"
    finally:
        srv.stop()


@pytest.mark.parametrize(
    ("meta_edit", "expected"),
    [
        (lambda m: {**m, "rollouts_per_example": "two"}, ["metadata.json", "-r/--rollouts"]),
        (lambda m: {**m, "num_examples": -7}, ["metadata.json", "-n/--num-examples"]),
        (lambda m: {**m, "sampling_args": {"temperature": -1}}, ["metadata.json", "temperature"]),
        (lambda m: {**m, "env_id": "../x"}, ["metadata.json", "ENV_ID"]),
        (lambda m: {**m, "base_url": "nowhere"}, ["metadata.json", "-b/--api-base-url"]),
        (lambda m: [m], ["metadata.json", "not a JSON object"]),
    ],
)
def test_resume_refuses_a_tampered_metadata_file(cli, tmp_path, meta_edit, expected):
    run_dir, srv = _finished_run(cli, tmp_path)
    srv.stop()
    path = run_dir / "metadata.json"
    path.write_text(json.dumps(meta_edit(json.loads(path.read_text()))))
    (run_dir / "results.jsonl").write_text("")  # something left to run
    code, err = cli("--resume", str(run_dir))
    assert code == 1, err
    assert all(word in err for word in expected), err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("url_tail", "model", "expected"),
    [
        ("", "test-model", ["-b/--api-base-url", "end in /v1", "/v1"]),  # -b without /v1
        ("/v1", "gpt-x", ["-m/--model", "'gpt-x'", "'test-model'"]),  # a model not served
    ],
)
def test_a_wrong_server_url_or_model_is_refused_before_any_rollout(
    cli, tmp_path, url_tail, model, expected
):
    """Both used to run every rollout (into a 404 on a real server), saving reward-0 rows."""
    with TestServer(echo_responder) as srv:
        url = srv.base_url.removesuffix("/v1") + url_tail
        code, err = cli("eval-echo", "-b", url, "-m", model, "-n", "2", "-r", "1", "-s")
        assert code == 1, err
        assert all(word in err for word in expected), err
        assert "Traceback" not in err and not srv.requests  # nothing was run
    assert not (tmp_path / "outputs").exists()


def test_resume_of_a_registry_run_needs_no_e_flag(cli, tmp_path, monkeypatch):
    """--resume forgot -e: the resumed '-m mine' was looked up as a local model and refused."""
    registry = tmp_path / "regs" / "mine.toml"
    registry.parent.mkdir()
    with TestServer(echo_responder) as srv:
        registry.write_text(f'[[endpoint]]\nid = "mine"\nmodel = "test-model"\n'
                            f'url = "{srv.base_url}"\n')
        srv.fail_next(500, n=2)
        code, err = cli("eval-echo", "-m", "mine", "-e", str(registry), "-n", "2", "-r", "1",
                        "--max-retries", "0", "-s")
        assert code == 1 and "--resume" in err, err
        (run_dir,) = run_dirs(tmp_path / "outputs" / "evals")
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")  # the registry path is kept absolute
        code, err = cli("--resume", str(run_dir))
        assert code == 0, err
        assert len(srv.requests) == 4  # 2 refused, then the same 2 again
    assert len(read_rows(run_dir)) == 2


def test_resume_accepts_n_minus_one_when_the_run_had_every_example(cli, tmp_path):
    with TestServer(echo_responder) as srv:
        code, err = cli("eval-echo", "-b", srv.base_url, "-n", "-1", "-r", "1", "-s")
        assert code == 0, err
        (run_dir,) = run_dirs(tmp_path / "outputs" / "evals")
        assert json.loads((run_dir / "metadata.json").read_text())["num_examples"] == 6
        code, err = cli("-n", "-1", "--resume", str(run_dir))  # was: "-n is -1 here but 6"
        assert code == 0 and "Nothing left to run" in err, err
        code, err = cli("eval-echo", "-b", srv.base_url, "-n", "3", "-r", "1", "-s")
        assert code == 0, err
        (short,) = set(run_dirs(tmp_path / "outputs" / "evals")) - {run_dir}
        code, err = cli("-n", "-1", "--resume", str(short))  # -1 is 6 here: not that run's 3
        assert code == 1 and "-n -1" in err and "ran 3" in err, err
        assert len(read_rows(short)) == 3  # nothing ran
