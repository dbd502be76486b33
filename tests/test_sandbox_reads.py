"""What sandboxed code may read: not other sandboxes' files, the home directories or root's secrets.

The code keeps no capability (as root it used to keep CAP_DAC_READ_SEARCH, which reads every
file), and the home directories and the sandbox base directory are covered in its view, with only
its own directory and the interpreter bound back.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from vfkit.sandbox import Sandbox, SandboxLimits, run_python

AS_ROOT = os.geteuid() == 0
LIMITS = SandboxLimits(timeout_s=8, cpu_seconds=8)
SECRET = "rollout A: the answer is 4242"

_LOOK_FOR_OTHERS = """
import glob, os
for path in [{a_file!r}, *glob.glob({pattern!r})]:
    try:
        print(path, open(path).read())
    except OSError as exc:
        print(path, 'refused', exc.errno)
"""


@pytest.mark.parametrize("own_base_dir", [False, True], ids=["default base dir", "base_dir"])
async def test_a_sandbox_cannot_read_another_sandboxs_files(own_base_dir: bool,
                                                           tmp_path: Path) -> None:
    base = str(tmp_path) if own_base_dir else None
    with Sandbox(LIMITS, base_dir=base) as a, Sandbox(LIMITS, base_dir=base) as b:
        written = await a.run(f"open('work.txt', 'w').write({SECRET!r})")
        assert written.ok, written.stderr
        a_file = str(a.path / "work.txt")
        pattern = os.path.join(os.path.dirname(a.path), "vfkit-sandbox-*", "*.txt")
        result = await b.run(_LOOK_FOR_OTHERS.format(a_file=a_file, pattern=pattern))
        assert result.ok, result.stderr
        assert SECRET not in result.stdout, result.stdout
        assert f"{a_file} refused" in result.stdout  # its own directory's parent is covered
        mine = await b.run("open('mine.txt', 'w').write('x')\nprint(open('mine.txt').read())")
        assert mine.stdout == "x\n", mine.stderr  # its own directory is still its own


@pytest.mark.skipif(not AS_ROOT, reason="root's files are unreadable to a non-root host anyway")
async def test_roots_secrets_and_home_are_out_of_reach() -> None:
    code = """
import json, os
try:
    open('/etc/shadow').read()
    print('shadow read')
except OSError as exc:
    print('shadow refused', exc.errno)
print(json.dumps(os.listdir('/root')))
print([line.split()[1] for line in open('/proc/self/status') if line.startswith('CapEff')][0])
"""
    result = await run_python(code, LIMITS)
    assert result.ok, result.stderr
    shadow, root_listing, caps = result.stdout.splitlines()
    if os.path.exists("/etc/shadow") and not os.stat("/etc/shadow").st_mode & stat.S_IROTH:
        assert shadow == "shadow refused 13"  # no capability reads what others may not
    # in /root only the way to the interpreter (when it lives there) is left
    interpreter_dirs = {p.split("/")[2] for p in (sys.base_prefix, sys.prefix, *sys.path)
                        if p.startswith("/root/")}
    assert set(json.loads(root_listing)) <= interpreter_dirs, root_listing
    assert caps == "0000000000000000"
