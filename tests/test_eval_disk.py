"""vf-eval when the disk fills up mid-run: the file is named, nothing torn is left, --resume works.

ENOSPC is simulated by patching the filesystem calls (os.write, Path.write_text) for one file
only, so this runs without root or a tiny tmpfs; the model is the scripted TestServer over HTTP.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from test_eval_cli import echo_responder, read_rows, run_dirs
from test_eval_hostile import cli  # noqa: F401 (the in-process vf-eval fixture)

from vfkit.testing.scripted_server import TestServer

NO_SPACE = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _fill_disk_at_results_write(monkeypatch, nth: int) -> None:
    """The nth write to a results.jsonl writes half its bytes; every later one finds no space."""
    real_write = os.write
    calls = {"n": 0}

    def write(fd: int, data) -> int:
        if not os.readlink(f"/proc/self/fd/{fd}").endswith("results.jsonl"):
            return real_write(fd, data)
        calls["n"] += 1
        if calls["n"] < nth:
            return real_write(fd, data)
        if calls["n"] == nth:
            return real_write(fd, bytes(data[: len(data) // 2]))  # a torn line, as on ENOSPC
        raise NO_SPACE

    monkeypatch.setattr(os, "write", write)


def test_disk_full_while_writing_results_names_the_file_and_resume_finishes(
    cli, tmp_path, monkeypatch  # noqa: F811
):
    _fill_disk_at_results_write(monkeypatch, nth=3)  # groups 1 and 2 are saved, then no space
    with TestServer(echo_responder) as srv:
        code, err = cli("eval-echo", "-b", srv.base_url, "-n", "4", "-r", "1", "-c", "1", "-s")
        (run_dir,) = run_dirs(tmp_path / "outputs" / "evals")
        shown = run_dir.relative_to(tmp_path)  # as the user wrote it: -o's default is relative
        assert code == 1
        # it was a bare "OSError: [Errno 28] No space left on device", with no file or advice
        assert f"{shown / 'results.jsonl'}: No space left on device" in err, err
        assert f"--resume {shown}" in err and "Traceback" not in err
        rows = read_rows(run_dir)  # whole lines only: the half-written group was cut off
        assert len(rows) == 2 and (run_dir / "results.jsonl").read_text().endswith("\n")
        meta = json.loads((run_dir / "metadata.json").read_text())
        assert meta["status"] == "incomplete" and meta["num_rollouts"] == 2  # not 'running'
        assert meta["missing_rollouts"] == 2
        assert "rollouts: 2" in cli.stdout  # the summary of what was saved
        monkeypatch.undo()  # space is free again
        srv.requests.clear()
        code, err = cli("--resume", str(run_dir))
        assert code == 0, err
        assert len(srv.requests) == 2  # exactly the rollouts that were not written
    assert sorted(r["example_id"] for r in read_rows(run_dir)) == [0, 1, 2, 3]
    assert json.loads((run_dir / "metadata.json").read_text())["status"] == "completed"


def test_disk_full_while_writing_metadata_leaves_no_temp_file(cli, tmp_path, monkeypatch):  # noqa: F811
    real_write_text = Path.write_text
    calls = {"n": 0}

    def write_text(self: Path, *args, **kwargs):
        if self.name != ".metadata.json.tmp":
            return real_write_text(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 1:  # the first metadata.json is written, the next finds no space
            return real_write_text(self, *args, **kwargs)
        self.touch()  # the file was created, its content did not fit
        raise NO_SPACE

    monkeypatch.setattr(Path, "write_text", write_text)
    with TestServer(echo_responder) as srv:
        code, err = cli("eval-echo", "-b", srv.base_url, "-n", "2", "-r", "1", "-s")
    assert code == 1
    (run_dir,) = run_dirs(tmp_path / "outputs" / "evals")
    shown = run_dir.relative_to(tmp_path)
    assert f"{shown / 'metadata.json'}: No space left on device" in err, err
    assert f"--resume {shown}" in err and "Traceback" not in err
    assert not (run_dir / ".metadata.json.tmp").exists()  # it was left behind, empty
    assert json.loads((run_dir / "metadata.json").read_text())["env_id"] == "eval-echo"
