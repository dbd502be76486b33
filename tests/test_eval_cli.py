"""`vf-eval` end to end: the real CLI in a subprocess against the test server (real HTTP).

The environment is tests/fixtures/eval_envs/eval-echo ("Repeat: <word>", exact-match reward),
put on PYTHONPATH for the subprocess; its pyproject says num_examples = 4, rollouts_per_example = 2.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from vfkit.testing.child_env import child_env
from vfkit.testing.scripted_server import TestServer

FIXTURE_ENV = Path(__file__).parent / "fixtures" / "eval_envs" / "eval-echo"
WRONG = {"banana", "damson"}  # the scripted model gets these wrong: reward 0


def echo_responder(body: dict[str, Any]) -> str:
    """Answer the word after "Repeat:", except for the WRONG ones."""
    word = body["messages"][-1]["content"].split("Repeat:")[-1].strip()
    return "no idea" if word in WRONG else word


def cli_env(**extra: str) -> dict[str, str]:
    env = child_env(FIXTURE_ENV)
    env.pop("OPENAI_API_KEY", None)
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", **extra)
    return env


def vf_eval(cwd: Path, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """Run `python -m vfkit.cli.eval ARGS` in `cwd` (outputs land under cwd/outputs)."""
    return subprocess.run(
        [sys.executable, "-m", "vfkit.cli.eval", *args],
        cwd=cwd, env=cli_env(**env), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def run_dirs(base: Path) -> list[Path]:
    return sorted(p.parent for p in base.glob("*/*/metadata.json"))


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    text = (run_dir / "results.jsonl").read_text()  # lines end at "\n" only: rows keep U+2028 etc.
    return [json.loads(line) for line in text.split("\n") if line]


def start_until_rows(argv: list[str], cwd: Path, out: Path, rows: int = 4,
                     stdout: int | None = subprocess.DEVNULL) -> subprocess.Popen:
    """Start vf-eval and return once a run under `out` has written `rows` results."""
    proc = subprocess.Popen(argv, cwd=cwd, env=cli_env(), stdout=stdout,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(len(read_rows(d)) >= rows for d in run_dirs(out)):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "no rows written"
        time.sleep(0.05)
    return proc


@pytest.fixture
def server():
    with TestServer(echo_responder) as srv:
        yield srv


def test_flags_output_files_and_fields(server, tmp_path):
    seen_headers: list[str] = []
    srv = TestServer(echo_responder, api_key="sekret")

    @srv.app.middleware("http")
    async def record(request, call_next):  # the CLI's --header must reach the server
        seen_headers.append(request.headers.get("x-trace", ""))
        return await call_next(request)

    with srv:
        proc = vf_eval(
            tmp_path, "eval-echo", "-m", "test-model", "-b", srv.base_url, "-k", "MY_KEY",
            "--header", "X-Trace: abc", "-a", '{"system_prompt": "Be brief."}',
            "-n", "3", "-r", "3", "-c", "2", "-t", "24", "-T", "0.5", "-S", '{"top_p": 0.9}',
            "-C", "turn,advantage", "-o", str(tmp_path / "evals"), MY_KEY="sekret",
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = run_dirs(tmp_path / "evals")
    assert run_dir.parent.name == "eval-echo--test-model"
    rows = read_rows(run_dir)
    # -n 3 -r 3 beat the package's pyproject defaults (4 and 2)
    assert sorted((r["example_id"], r["rollout_idx"]) for r in rows) == [
        (e, k) for e in range(3) for k in range(3)
    ]
    row = next(r for r in rows if r["answer"] == "apple")
    assert row["prompt"][0] == {"role": "system", "content": "Be brief."}  # -a reached the env
    assert row["prompt"][-1]["content"] == "Repeat: apple"
    assert row["completion"][-1]["content"] == "apple"
    assert row["reward"] == 1.0 and row["exact"] == 1.0 and row["length"] == 0.5
    assert row["turn"] == 1 and "advantage" in row  # -C state columns
    assert row["error"] is None and row["is_truncated"] is False and row["task"]
    assert row["timing"]["total_ms"] >= row["timing"]["generation_ms"] >= 0
    assert [r["reward"] for r in rows if r["answer"] == "banana"] == [0.0] * 3
    # the sampling flags reached every request; -S wins over -T only for the keys it sets
    assert len(srv.requests) == 9
    assert all(
        q["max_tokens"] == 24 and q["temperature"] == 0.5 and q["top_p"] == 0.9
        for q in srv.requests
    )
    assert "abc" in seen_headers
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["env_id"] == "eval-echo" and meta["env_args"] == {"system_prompt": "Be brief."}
    assert meta["model"] == "test-model" and meta["base_url"] == srv.base_url
    assert (meta["num_examples"], meta["rollouts_per_example"]) == (3, 3)
    assert meta["sampling_args"] == {"max_tokens": 24, "temperature": 0.5, "top_p": 0.9}
    assert meta["status"] == "completed" and meta["num_rollouts"] == 9
    assert meta["avg_reward"] == pytest.approx(2 / 3)  # apple, cherry right; banana wrong
    assert meta["avg_metrics"]["exact"] == pytest.approx(2 / 3)
    assert meta["vfkit_version"] and meta["date"] and meta["time"]
    assert "sekret" not in (run_dir / "metadata.json").read_text()
    # the summary: table of reward + each reward function, per rollout index, counts
    assert all(word in proc.stdout for word in ("reward", "exact", "length", "r3", "errors: 0"))


def test_output_dir_reads_in_one_line_with_pandas_and_datasets(server, tmp_path):
    proc = vf_eval(tmp_path, "eval-echo", "-b", server.base_url, "-s")  # no -m
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = run_dirs(tmp_path / "outputs" / "evals")  # the default output folder
    # -b without -m: the model the server lists in /v1/models
    assert run_dir.parent.name == "eval-echo--test-model"
    assert {q["model"] for q in server.requests} == {"test-model"}
    import datasets
    import pandas as pd

    df = pd.read_json(run_dir / "results.jsonl", lines=True)
    ds = datasets.load_dataset("json", data_files=str(run_dir / "results.jsonl"), split="train")
    # no -n/-r: the environment package's [tool.vfkit.eval] gives 4 examples x 2 rollouts
    assert len(df) == len(ds) == 8
    assert {"example_id", "prompt", "completion", "reward", "exact", "timing"} <= set(df.columns)
    assert df["reward"].mean() == pytest.approx(0.5)  # 2 of the first 4 words are WRONG
    assert ds[0]["completion"][-1]["role"] == "assistant"


def test_endpoint_registry_lookup_and_its_key_variable(tmp_path):
    server = TestServer(echo_responder, model="served-name").start()
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "endpoints.toml").write_text(
        f'[[endpoint]]\nid = "echo"\nmodel = "served-name"\nurl = "{server.base_url}"\n'
        'key = "ECHO_KEY"\n'
    )
    try:
        proc = vf_eval(tmp_path, "eval-echo", "-m", "echo", "-n", "1", "-r", "1", "-s")
        assert proc.returncode != 0
        assert "ECHO_KEY" in proc.stderr and "Traceback" not in proc.stderr
        proc = vf_eval(tmp_path, "eval-echo", "-m", "echo", "-n", "1", "-r", "1", "-s",
                       ECHO_KEY="k")
        assert proc.returncode == 0, proc.stderr
        assert [q["model"] for q in server.requests] == ["served-name"]
    finally:
        server.stop()
    (run_dir,) = run_dirs(tmp_path / "outputs" / "evals")
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["endpoint_source"] == "registry" and meta["base_url"] == server.base_url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["no-such-env", "-b", "http://127.0.0.1:9/v1"], ["no-such-env", "vf-install"]),
        (["eval-echo", "-S", "{temperature: 1}"], ["-S/--sampling-args", "not valid JSON"]),
        (["eval-echo", "-a", "[1]"], ["-a/--env-args", "JSON object"]),
        (["eval-echo", "-b", "http://127.0.0.1:9/v1", "-k", "NOT_SET_VAR"], ["NOT_SET_VAR"]),
        (["eval-echo", "-p", "./environments"], ["-p/--env-dir-path", "vf-install"]),
        (["eval-echo", "--max-concurrent-generation", "4"],
         ["--max-concurrent-generation", "-c bounds rollouts"]),
    ],
)
def test_user_errors_are_one_clear_line(tmp_path, args, expected):
    proc = vf_eval(tmp_path, *args)
    assert proc.returncode == 1
    assert all(word in proc.stderr for word in expected), proc.stderr
    assert "Traceback" not in proc.stderr


def test_unreachable_base_url_fails_fast(tmp_path):
    timeout = 20
    start = time.monotonic()
    url = f"http://127.0.0.1:{_free_port()}/v1"
    proc = vf_eval(tmp_path, "eval-echo", "-b", url, "--timeout", str(timeout))
    elapsed = time.monotonic() - start
    assert proc.returncode == 1 and elapsed < timeout
    assert "cannot reach" in proc.stderr and url in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_resume_after_a_kill_loses_and_duplicates_nothing(tmp_path):
    out = tmp_path / "evals"
    with TestServer(echo_responder) as srv:
        srv.delay_next(0.3, n=100)  # a slow model, so the kill lands mid-run
        argv = [sys.executable, "-m", "vfkit.cli.eval", "eval-echo", "-b", srv.base_url,
                "-m", "test-model", "-n", "6", "-r", "2", "-c", "1", "-o", str(out)]  # fmt: skip
        proc = start_until_rows(argv, tmp_path, out)
        proc.kill()  # SIGKILL: no chance to clean up
        proc.wait()
        (run_dir,) = run_dirs(out)
        before = (run_dir / "results.jsonl").read_text().splitlines()
        assert 4 <= len(before) < 12
        with (run_dir / "results.jsonl").open("a") as f:
            f.write('{"example_id": 5, "rollout_')  # as if killed in the middle of a write
        requests_before = len(srv.requests)
        proc2 = vf_eval(tmp_path, "--resume", str(run_dir))  # settings come from metadata.json
        assert proc2.returncode == 0, proc2.stderr
        # exactly the missing rollouts were requested again
        assert len(srv.requests) - requests_before == 12 - len(before)
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    assert lines[: len(before)] == before  # old rows untouched, the torn line gone
    pairs = [(r["example_id"], r["rollout_idx"]) for r in map(json.loads, lines)]
    assert sorted(pairs) == [(e, k) for e in range(6) for k in range(2)]  # none lost or doubled
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "completed" and meta["num_rollouts"] == 12


def test_a_seed_in_sampling_args_repeats_an_eval_with_every_rollout_drawn_apart(tmp_path):
    sent = []
    for run in ("a", "b"):
        with TestServer(echo_responder) as srv:
            proc = vf_eval(tmp_path, "eval-echo", "-b", srv.base_url, "-m", "test-model",
                           "-n", "4", "-r", "3", "-S", '{"seed": 5}', "-o", str(tmp_path / run))
            assert proc.returncode == 0, proc.stderr
            sent.append(sorted((b["messages"][-1]["content"], b["seed"]) for b in srv.requests))
    assert sent[0] == sent[1] and len(sent[0]) == 12
    assert len({seed for _, seed in sent[0]}) == 12  # no two rollouts share a stream



def test_a_resumed_seeded_eval_gives_missing_rollouts_their_own_seeds(tmp_path):
    """Rollouts missing from a group (they failed, or a torn write) run again with the seeds
    they had, not the group's first ones: before, a resumed rollout 2 repeated rollout 0."""
    def seeds_by_prompt(requests: list[dict]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for body in requests:
            out.setdefault(body["messages"][-1]["content"], []).append(body["seed"])
        return {prompt: sorted(seeds) for prompt, seeds in out.items()}

    with TestServer(echo_responder) as srv:
        proc = vf_eval(tmp_path, "eval-echo", "-b", srv.base_url, "-m", "test-model", "-n", "3",
                       "-r", "3", "-S", '{"seed": 5}', "-o", str(tmp_path / "evals"))
        assert proc.returncode == 0, proc.stderr
        first = seeds_by_prompt(srv.requests)
        (run_dir,) = run_dirs(tmp_path / "evals")
        path = run_dir / "results.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        gone = {(1, 2), (2, 1)}  # rollout 2 of example 1, rollout 1 of example 2
        path.write_text("".join(json.dumps(r) + "\n" for r in rows
                                if (r["example_id"], r["rollout_idx"]) not in gone))
        srv.requests.clear()
        proc = vf_eval(tmp_path, "--resume", str(run_dir))
        assert proc.returncode == 0, proc.stderr
        resumed = seeds_by_prompt(srv.requests)
    assert all(seeds == [seeds[0], seeds[0] + 1, seeds[0] + 2] for seeds in first.values())
    prompt = {r["example_id"]: r["prompt"][-1]["content"] for r in rows}
    assert resumed == {prompt[1]: [first[prompt[1]][2]], prompt[2]: [first[prompt[2]][1]]}

def _port_closed(base_url: str) -> bool:
    from urllib.parse import urlparse

    try:
        socket.create_connection(("127.0.0.1", urlparse(base_url).port), timeout=2).close()
    except OSError:
        return True
    return False


@pytest.mark.slow
def test_embedded_server_is_started_for_local_weights_and_stopped(tiny_model_path, tmp_path):
    proc = vf_eval(tmp_path, "eval-echo", "-m", str(tiny_model_path), "-n", "2", "-r", "2",
                   "-t", "8", "-s", timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = run_dirs(tmp_path / "outputs" / "evals")
    assert run_dir.parent.name == f"eval-echo--{tiny_model_path.name}"
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["endpoint_source"] == "embedded" and meta["model"] == str(tiny_model_path)
    rows = read_rows(run_dir)
    assert len(rows) == 4 and all(r["completion"][-1]["role"] == "assistant" for r in rows)
    assert all(r["error"] is None for r in rows), rows[0]["error"]
    assert _port_closed(meta["base_url"])  # no orphan server left behind


@pytest.mark.slow
def test_ctrl_c_stops_the_embedded_server(tiny_model_path, tmp_path):
    out = tmp_path / "evals"
    # 512 rollouts (~7 s on 2 cores): 32 finished within 0.8 s of the first results, so a
    # loaded machine could deliver Ctrl-C after the run had already completed
    argv = [sys.executable, "-m", "vfkit.cli.eval", "eval-echo", "-m", str(tiny_model_path),
            "-a", '{"num_rows": 64}', "-n", "64", "-r", "8", "-t", "200", "-o", str(out)]
    # the child gets Ctrl-C's default disposition, as in a terminal: a test runner started in
    # the background has SIGINT ignored, and an ignored signal stays ignored across exec
    proc = subprocess.Popen(argv, cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while not run_dirs(out):  # metadata.json appears once the server answers
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the embedded server did not come up"
        time.sleep(0.05)
    proc.send_signal(2)  # SIGINT, as Ctrl-C
    assert proc.wait(timeout=60) == 130
    meta = json.loads((run_dirs(out)[0] / "metadata.json").read_text())
    assert meta["status"] == "interrupted"
    assert _port_closed(meta["base_url"])
    assert "--resume" in (proc.stderr.read() if proc.stderr else "")
