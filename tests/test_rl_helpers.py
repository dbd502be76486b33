"""Helpers for the vf-rl tests (no tests here): a tiny environment, configs, process tracking."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil

from vfkit.testing.child_env import child_env

ENV_MODULE = textwrap.dedent(
    '''
    """rl-echo: "Say a <n>" -> reward 1 when the answer contains the letter a."""
    from datasets import Dataset
    import vfkit as vf

    def has_a(completion) -> float:
        text = completion[-1]["content"] if completion else ""
        return float("a" in (text or ""))

    def load_environment(num_rows: int = 16):
        rows = [{"question": f"Say a {i}", "answer": "a"} for i in range(num_rows)]
        return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[has_a]))
    '''
)

CONFIG = textwrap.dedent(
    """
    model = "{model}"
    [env]
    id = "rl-echo"
    [inference]
    port = 0
    [trainer.args]
    rollouts_per_example = 2
    batch_size = 4
    micro_batch_size = 2
    max_steps = {steps}
    max_tokens = 6
    max_seq_len = 128
    max_prompt_len = 64
    learning_rate = 1e-3
    lora_rank = 4
    lora_target_modules = ["q_proj", "v_proj"]
    eval_steps = {eval_steps}
    eval_num_examples = 2
    save_steps = 1
    output_dir = "{outputs}"
    run_name = "{run}"
    bf16 = false
    adapter_probe_tolerance = inf
    """
)


def write_config(
    tmp: Path, model: Path, *, steps: int = 2, eval_steps: int = 0, run: str = "rl"
) -> Path:
    """A config for a tiny run in `tmp` and the rl-echo env module beside it."""
    (tmp / "envs").mkdir(exist_ok=True)
    (tmp / "envs" / "rl_echo.py").write_text(ENV_MODULE)
    path = tmp / "rl.toml"
    path.write_text(
        CONFIG.format(
            model=model, steps=steps, eval_steps=eval_steps, outputs=tmp / "outputs", run=run
        )
    )
    return path


def vfrl_env(tmp: Path) -> dict[str, str]:
    """Environment for vf-rl subprocesses: the test env importable, few threads, offline."""
    env = child_env(tmp / "envs")
    env |= {
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "NO_COLOR": "1",
        "TMUX_TMPDIR": str(tmp),
    }
    return env


def vfrl(tmp: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `vf-rl ARGS` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "vfkit.cli.rl", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=vfrl_env(tmp),
        cwd=tmp,
    )


class Tracked:
    """A started process whose descendants are all recorded while it runs (orphan checks)."""

    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: Path,
                 watch: tuple[int, ...] = ()) -> None:
        """`watch`: other processes (the tmux server) whose descendants are recorded from the
        start, however soon `argv` itself exits."""
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=env, cwd=cwd,
        )  # fmt: skip
        self.seen: set[psutil.Process] = set()
        self.roots = [psutil.Process(self.proc.pid)]
        for pid in watch:
            self.watch_also(pid)
        self._thread = threading.Thread(target=self._record, daemon=True)
        self._thread.start()

    def _record(self) -> None:
        while self.proc.poll() is None or any(_running(r) for r in self.roots[1:]):
            for root in list(self.roots):
                with contextlib.suppress(psutil.Error):
                    self.seen.update(root.children(recursive=True))
            time.sleep(0.05)

    def watch_also(self, pid: int) -> None:
        """Record the descendants of another process too (the tmux server), while `argv` runs:
        a short-lived `argv` can end first, so pass such pids as `watch` instead."""
        with contextlib.suppress(psutil.Error):
            self.roots.append(psutil.Process(pid))

    def finish(self, timeout: float = 300) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out

    def orphans(self, grace: float = 3.0) -> list[str]:
        """Descendants still running after `grace` seconds (there should be none)."""
        deadline = time.monotonic() + grace
        while True:
            left = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in self.seen if _running(p)]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_for(predicate, timeout: float, what: str, proc: Tracked | None = None) -> None:
    """Poll `predicate` until true; fail with `what` (and the process output) on timeout."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.proc.poll() is not None:
            raise AssertionError(f"vf-rl exited before {what}:\n{proc.proc.stdout.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
