"""Errors are not results: vf-eval against a server that dies, fails, or a reward that raises.

Real CLI in a subprocess, real HTTP to the scripted TestServer (helpers from test_eval_cli).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from test_eval_cli import (
    cli_env,
    echo_responder,
    read_rows,
    run_dirs,
    start_until_rows,
    vf_eval,
)

from vfkit.evaluation.failures import FailureTally, infrastructure_error
from vfkit.testing.scripted_server import TestServer


def _state(error: str | None, stop: str | None) -> dict:
    return {"error": error, "stop_condition": stop}


@pytest.mark.parametrize(
    ("error", "stop", "infra"),
    [
        ("APIConnectionError: Connection error.", "error", True),
        ("APITimeoutError: Request timed out.", "error", True),
        ("InternalServerError: Error code: 503 - overloaded", "error", True),
        ("RateLimitError: Error code: 429", "error", True),
        # refused to serve this client: no answer about the model either (they were saved as
        # reward-0 rows, averaged in, and --resume could not run them again)
        ("AuthenticationError: Error code: 401 - bad key", "error", True),
        ("PermissionDeniedError: Error code: 403", "error", True),
        ("NotFoundError: Error code: 404 - The model `x` does not exist.", "error", True),
        ("ConnectionResetError: [Errno 104] Connection reset by peer", "error", True),
        ("BadRequestError: Error code: 400 - bad temperature", "error", False),  # data
        ("ValueError: the environment's own bug", "error", False),  # data
        ("reward function exact raised ValueError: boom", "completed", False),  # scored row
        (None, "completed", False),
    ],
)
def test_infrastructure_errors_are_told_from_data(error, stop, infra):
    assert (infrastructure_error(_state(error, stop)) is not None) is infra


def test_tally_stops_after_failures_in_a_row_and_a_success_resets_it():
    tally = FailureTally("http://u:***@h/v1")
    dead = _state("APIConnectionError: Connection error.", "error")
    ok = _state(None, "completed")
    assert [tally.keep(s) for s in (dead, dead, ok)] == [False, False, True]
    for _ in range(7):
        tally.keep(dead)
    tally.check()  # 7 in a row since the success: not yet
    tally.keep(dead)
    with pytest.raises(Exception, match="stopped answering: 8 rollouts in a row"):
        tally.check()
    assert tally.as_metadata() == {
        "failed_rollouts": 10,
        "failure_reasons": {"APIConnectionError: Connection error.": 10},
    }


@pytest.mark.slow
def test_server_killed_mid_run_saves_no_error_rows_and_resume_runs_exactly_the_rest(tmp_path):
    out = tmp_path / "evals"
    with TestServer(echo_responder) as srv:
        srv.delay_next(0.3, n=100)  # a slow model, so the server dies mid-run
        argv = [sys.executable, "-m", "vfkit.cli.eval", "eval-echo", "-b", srv.base_url,
                "-m", "test-model", "-n", "6", "-r", "2", "-c", "1", "-o", str(out),
                "--max-retries", "0", "--timeout", "10"]  # fmt: skip
        proc = start_until_rows(argv, tmp_path, out, stdout=subprocess.PIPE)
    # the server is gone (its port closed); vf-eval must notice and say so, not score zeros
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr and "--resume" in stderr
    (run_dir,) = run_dirs(out)
    before = read_rows(run_dir)
    assert 4 <= len(before) < 12
    assert all(r["error"] is None for r in before)  # no reward-0 "Connection error" rows
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "incomplete"
    assert meta["missing_rollouts"] == 12 - len(before) == meta["failed_rollouts"]
    assert "APIConnectionError" in next(iter(meta["failure_reasons"]))

    with TestServer(echo_responder) as srv2:  # a new server, at a new address
        proc2 = vf_eval(tmp_path, "--resume", str(run_dir), "-b", srv2.base_url)
        assert proc2.returncode == 0, proc2.stderr
        assert len(srv2.requests) == 12 - len(before)  # exactly the missing ones, once each
    rows = read_rows(run_dir)
    assert rows[: len(before)] == before
    pairs = sorted((r["example_id"], r["rollout_idx"]) for r in rows)
    assert pairs == [(e, k) for e in range(6) for k in range(2)]  # none lost or doubled
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "completed" and meta["missing_rollouts"] == 0


@pytest.mark.parametrize(
    ("status", "saved", "meta_status", "advice"),
    [
        # 5xx after the client's retries: no answer, nothing saved, --resume runs them
        (503, 0, "incomplete", "--resume"),
        (401, 0, "incomplete", "-k/--api-key-var"),  # key refused: no answer either
        (404, 0, "incomplete", "end in /v1"),  # no such route or model
        # the server refused every request's values: saved as failed rows, nothing scored
        (400, 4, "failed", "start a new run"),
    ],
)
def test_every_rollout_failing_exits_non_zero(tmp_path, status, saved, meta_status, advice):
    with TestServer(echo_responder) as srv:
        srv.fail_next(status, n=100, message="injected")
        proc = vf_eval(tmp_path, "eval-echo", "-b", srv.base_url, "-m", "test-model",
                       "-n", "2", "-r", "2", "-s", "--max-retries", "0")  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert advice in proc.stderr, proc.stderr
    (run_dir,) = run_dirs(tmp_path / "outputs" / "evals")
    assert len(read_rows(run_dir)) == saved
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == meta_status
    assert meta["avg_reward"] is None  # nothing scored: no mean, never 0.0


def test_refused_requests_are_not_results_and_resume_runs_them(tmp_path):
    """401s (key refused) were saved as reward-0 rows: the mean fell, the run said
    'completed', exit 0, and --resume had nothing left to run."""
    with TestServer(echo_responder) as srv:
        srv.fail_next(401, n=2)
        proc = vf_eval(tmp_path, "eval-echo", "-b", srv.base_url, "-n", "4", "-r", "1",
                       "-c", "1", "-s")  # fmt: skip
        assert proc.returncode == 1, proc.stderr
        assert "--resume" in proc.stderr and "-k/--api-key-var" in proc.stderr
        (run_dir,) = run_dirs(tmp_path / "outputs" / "evals")
        rows = read_rows(run_dir)
        assert len(rows) == 2 and all(r["error"] is None for r in rows)
        meta = json.loads((run_dir / "metadata.json").read_text())
        assert meta["status"] == "incomplete" and meta["failed_rollouts"] == 2
        assert meta["avg_reward"] == pytest.approx(sum(r["reward"] for r in rows) / 2)
        srv.requests.clear()
        proc = vf_eval(tmp_path, "--resume", str(run_dir))
        assert proc.returncode == 0, proc.stderr
        assert len(srv.requests) == 2  # exactly the refused ones ran again
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "completed" and meta["num_rollouts"] == 4
    assert meta["avg_reward"] == pytest.approx(0.5)  # apple 1, banana 0, cherry 1, damson 0


def test_a_failed_rollout_is_saved_but_left_out_of_the_means(tmp_path):
    """A rollout with no model answer (here the server refused its values, a 400) keeps its
    row and error, but is not averaged in as reward 0; its count stands next to the means."""
    with TestServer(echo_responder) as srv:
        srv.fail_next(400, n=1, message="injected refusal")
        proc = vf_eval(tmp_path, "eval-echo", "-b", srv.base_url, "-n", "4", "-r", "1",
                       "-c", "1", "-s")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = run_dirs(tmp_path / "outputs" / "evals")
    rows = read_rows(run_dir)
    failed = [r for r in rows if r["stop_condition"] == "error"]
    assert len(rows) == 4 and len(failed) == 1 and "injected refusal" in failed[0]["error"]
    scored = [r for r in rows if r["stop_condition"] != "error"]
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "completed"
    assert (meta["scored_rollouts"], meta["errored_rollouts"]) == (3, 1)
    assert meta["avg_reward"] == pytest.approx(sum(r["reward"] for r in scored) / 3)
    assert meta["avg_metrics"]["exact"] == pytest.approx(sum(r["exact"] for r in scored) / 3)
    assert "means over 3 scored rollouts" in proc.stdout
    assert "1 rollouts failed and are left out of the means" in proc.stdout


BOOM_ENV = '''
from datasets import Dataset
import vfkit as vf

def picky(completion, answer) -> float:
    if answer == "boom":
        raise ValueError("picky cannot score boom")
    return float(completion[-1]["content"] == answer)

def load_environment():
    rows = [{"question": f"Repeat: {w}", "answer": w} for w in ("apple", "boom")]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[picky]))
'''


def test_a_raising_reward_function_is_still_a_scored_row(tmp_path):
    (tmp_path / "eval_boom.py").write_text(BOOM_ENV)
    env = cli_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    with TestServer(echo_responder) as srv:
        proc = subprocess.run(
            [sys.executable, "-m", "vfkit.cli.eval", "eval-boom", "-b", srv.base_url,
             "-n", "2", "-r", "2", "-s"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = run_dirs(tmp_path / "outputs" / "evals")
    rows = read_rows(run_dir)
    assert len(rows) == 4
    boom = [r for r in rows if r["answer"] == "boom"]
    assert all(r["reward"] == 0.0 and "picky cannot score boom" in r["error"] for r in boom)
    assert all(r["stop_condition"] != "error" for r in boom)  # it ran; only scoring failed
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "completed" and meta["avg_reward"] == pytest.approx(0.5)



@pytest.mark.slow
def test_two_resumes_of_one_run_the_second_refuses_at_once(tmp_path):
    with TestServer(echo_responder) as srv:
        proc = vf_eval(tmp_path, "eval-echo", "-b", srv.base_url, "-n", "6", "-r", "2", "-s")
        assert proc.returncode == 0, proc.stderr
        (run_dir,) = run_dirs(tmp_path / "outputs" / "evals")
        (run_dir / "results.jsonl").write_text("")  # as if nothing had been saved: 12 to run
        # the first resume takes ~18 s, so a second vf-eval that starts slowly (a loaded CI
        # machine: 0.3 s a request, ~3 s in all, was not enough) still finds it running
        srv.delay_next(1.5, n=100)
        first = subprocess.Popen(
            [sys.executable, "-m", "vfkit.cli.eval", "--resume", str(run_dir), "-c", "1"],
            cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while not read_rows(run_dir):  # the first resume is under way
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            assert time.monotonic() < deadline, "the first resume wrote nothing"
            time.sleep(0.05)
        second = vf_eval(tmp_path, "--resume", str(run_dir))
        assert first.poll() is None, "the first resume ended before the second was refused"
        assert second.returncode == 1
        assert str(run_dir) in second.stderr and f"pid {first.pid}" in second.stderr
        assert "Traceback" not in second.stderr
        assert first.wait(timeout=120) == 0
    pairs = [(r["example_id"], r["rollout_idx"]) for r in read_rows(run_dir)]
    assert sorted(pairs) == [(e, k) for e in range(6) for k in range(2)]  # no duplicates


@pytest.mark.slow
def test_embedded_server_killed_mid_run_then_resume_finishes(tiny_model_path, tmp_path):
    import psutil

    out = tmp_path / "evals"
    # Enough rollouts that the kill lands mid-run however fast the server is (8 x 2 did not:
    # with each group's prompt prefilled once, all of them could land between two polls).
    rows, rollouts = 8, 8  # the fixture has 8 words
    argv = [sys.executable, "-m", "vfkit.cli.eval", "eval-echo", "-m", str(tiny_model_path),
            "-a", json.dumps({"num_rows": rows}), "-n", str(rows), "-r", str(rollouts),
            "-t", "48", "-c", "1",
            "--max-retries", "0", "-o", str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 240
    while not any(read_rows(d) for d in run_dirs(out) if (d / "results.jsonl").exists()):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "no rows written"
        time.sleep(0.05)
    (server,) = psutil.Process(proc.pid).children()  # the embedded server
    server.kill()  # SIGKILL: the server dies mid-run
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr and "--resume" in stderr
    (run_dir,) = run_dirs(out)
    before = read_rows(run_dir)
    total = rows * rollouts
    assert 0 < len(before) < total and all(r["error"] is None for r in before)
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "incomplete" and meta["missing_rollouts"] == total - len(before)

    proc2 = vf_eval(tmp_path, "--resume", str(run_dir), timeout=300)  # a fresh embedded server
    assert proc2.returncode == 0, proc2.stderr
    pairs = sorted((r["example_id"], r["rollout_idx"]) for r in read_rows(run_dir))
    assert pairs == [(e, k) for e in range(rows) for k in range(rollouts)]
    assert json.loads((run_dir / "metadata.json").read_text())["status"] == "completed"


def test_a_server_that_stops_answering_still_gets_the_summary_of_what_was_saved(tmp_path):
    answered = []

    def dies_after_one_group(body: dict) -> str:
        if len(answered) >= 2:
            raise RuntimeError("engine died")  # the scripted server answers 500
        answered.append(body)
        return echo_responder(body)

    with TestServer(dies_after_one_group) as srv:
        proc = vf_eval(tmp_path, "eval-echo", "-b", srv.base_url, "-n", "6", "-r", "2", "-c", "1",
                       "--max-retries", "0", "-s")  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "stopped answering: 8 rollouts in a row" in proc.stderr and "--resume" in proc.stderr
    assert "rollouts: 2   scored: 2" in proc.stdout  # the summary was skipped before
    assert "no answer (not saved): 8" in proc.stdout
