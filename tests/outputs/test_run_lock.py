"""Issue 38, item 1: one run owns its directories. A second run on the --run-dir or --save of a
live run is refused in one line naming it (also with --start-over, which then moves nothing);
the lock dies with its process, and a lock file left by a dead run is taken over with a line
saying whose it was. The holder is a real second process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from megatron_dapo import train
from megatron_dapo.config import ConfigError, parse_args
from megatron_dapo.outputs import run_lock
from megatron_dapo.outputs.run_dir import prepare_outputs
from tests.foundation.test_user_errors import _args, _no_debug, one_line, tiny  # noqa: F401 (fixtures)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HOLDER = """
import sys, time
from megatron_dapo.outputs import run_lock
for directory, flag in zip(sys.argv[1::2], sys.argv[2::2]):
    run_lock.acquire(directory, flag, "holder-run")
print("locked", flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path):
    """Start a process that holds the locks of (directory, flag) pairs until it is killed."""
    procs = []

    def start(*pairs):
        argv = [x for d, f in pairs for x in (str(d), f)]
        p = subprocess.Popen([sys.executable, "-c", HOLDER, *argv], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "locked"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=30)


@pytest.fixture(autouse=True)
def _release():
    yield
    run_lock.release_all()


def test_a_live_run_holds_its_run_dir_and_save_against_a_second_run(tmp_path, holder):
    run_dir, save = tmp_path / "run", tmp_path / "ckpt"
    p = holder((run_dir, "--run-dir"))
    with pytest.raises(ConfigError) as e:
        prepare_outputs(parse_args(["--run-dir", str(run_dir)]))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"--run-dir {run_dir} is in use by a live run")
    assert f"pid {p.pid}" in msg and "run holder-run" in msg
    # the dry run says so too, and locks nothing
    with pytest.raises(ConfigError, match="is in use by a live run"):
        prepare_outputs(parse_args(["--run-dir", str(run_dir)]), dry_run=True)
    # --save outside the run dir is owned as well
    q = holder((save, "--save"))
    with pytest.raises(ConfigError, match=f"--save {save} is in use by a live run .*pid {q.pid}"):
        prepare_outputs(parse_args(["--run-dir", str(tmp_path / "other"), "--save", str(save)]))


def test_start_over_never_moves_a_live_runs_files_through_the_real_entry_point(tiny, tmp_path, holder, capfd):
    run_dir = tmp_path / "run"
    os.makedirs(run_dir)
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    (run_dir / "config.json").write_text("{}")
    holder((run_dir, "--run-dir"))
    before = sorted(os.listdir(run_dir))
    capfd.readouterr()
    argv = _args(tiny, tmp_path, "--start-over")
    code = train.main(argv)
    assert code == 2
    one_line(capfd.readouterr().err, "--run-dir", "is in use by a live run", "--start-over never moves")
    assert sorted(os.listdir(run_dir)) == before  # nothing moved aside
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_the_lock_dies_with_its_process_and_a_stale_file_is_taken_over_with_a_line(tmp_path, holder):
    run_dir = tmp_path / "run"
    p = holder((run_dir, "--run-dir"))
    p.send_signal(signal.SIGKILL)  # kill -9: no cleanup ran, the lock file stays
    p.wait(timeout=30)
    assert os.path.exists(run_dir / run_lock.LOCK_NAME)
    out = prepare_outputs(parse_args(["--run-dir", str(run_dir)]))
    stale = [line for line in out.lines if "took over the lock of a run that is gone" in line]
    assert stale and f"pid {p.pid}" in stale[0] and "run holder-run" in stale[0], out.lines
    # now this process holds it: a second process is refused
    child = subprocess.run(
        [sys.executable, "-c", HOLDER, str(run_dir), "--run-dir"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert child.returncode != 0 and "is in use by a live run" in child.stderr
    assert f"pid {os.getpid()}" in child.stderr
    # a clean release removes the file: the next run starts without a word about it
    run_lock.release_all()
    assert not os.path.exists(run_dir / run_lock.LOCK_NAME)
    out = prepare_outputs(parse_args(["--run-dir", str(run_dir)]))
    assert not any("took over" in line for line in out.lines)


def test_a_finished_run_leaves_its_directories_free(tmp_path, holder):
    run_dir = tmp_path / "run"
    prepare_outputs(parse_args(["--run-dir", str(run_dir)]))
    run_lock.release_all()  # what train.main does when the run ends
    holder((run_dir, "--run-dir"))  # another process takes it at once
