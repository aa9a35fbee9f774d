"""Exact resume in --deterministic mode after a crash during a save (kill -9), and SIGTERM.

A: 3 steps uninterrupted. B: the same run killed (SIGKILL) in the middle of its step-2 save,
then resumed with --load from the step-1 checkpoint. Metrics (except timings) and the final
weights must be identical, bitwise. D: SIGTERM to the driver alone
(as scancel or a time limit sends it) stops the run with everything it started, and its
trainers' shared-memory bucket buffers are gone; E: the same while the driver waits in
``ray.get`` (which turns an exception raised by the handler into another one), exit 143.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir
from tests.e2e.test_train_e2e import base_args, read_metrics
from tests.launch.procs import RAY_SHUTDOWN_GRACE_S, leftovers, run_in_session, session_pids

pytestmark = [pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cmd(hf, prompts, run, save, steps, extra=()):
    args = base_args(
        hf,
        prompts,
        run,
        **{
            "--num-rollout": str(steps),
            "--save": save,
            "--save-interval": "1",
            "--keep-last": "3",
            "--deterministic": None,
            "--save-hf-final": None,
        },
    )
    return [sys.executable, "-m", "megatron_dapo.train", *args, *extra]


def _env():
    env = dict(os.environ, PYTHONPATH=ROOT, RAY_ADDRESS="")
    env.pop("RAY_ADDRESS")
    return env


def _run(cmd, timeout=600, check=True):
    """Run the driver in a session of its own; whatever it started (Ray, workers) is killed
    when it ends, also after a timeout or a failed assertion."""
    r = run_in_session(cmd, timeout, cwd=ROOT, env=_env())
    if check:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return r


def _latest(save):
    try:
        with open(os.path.join(save, "latest")) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time_") and k != "tokens_per_second"} for r in rows]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_resume")
    return make_tiny_qwen2_dir(str(d / "hf")), make_prompts(str(d / "prompts.jsonl"))


def test_a_crash_during_a_save_keeps_the_previous_checkpoint_and_the_resume_is_exact(tiny, tmp_path):
    """B dies by SIGKILL in the middle of its step-2 save (after the ranks wrote their shards,
    before the driver state and the commit; then everything it started is killed): ``latest``
    still names step 1, the partial save is a ``.tmp-`` directory, and the resumed run, which
    redoes step 2 and runs step 3, ends bitwise where the uninterrupted run A ends."""
    hf, prompts = tiny
    run_a, save_a = str(tmp_path / "a"), str(tmp_path / "a_ckpt")
    _run(_cmd(hf, prompts, run_a, save_a, 3))

    run_b, save_b = str(tmp_path / "b"), str(tmp_path / "b_ckpt")
    r = _run(_cmd(hf, prompts, run_b, save_b, 3, extra=["--debug-crash-during-save-step", "2"]), check=False)
    assert r.returncode == -signal.SIGKILL, r.stdout[-3000:] + r.stderr[-3000:]
    assert _latest(save_b) == "step_000001"  # the interrupted save never became 'latest'
    assert any(n.startswith(".tmp-step_000002") for n in os.listdir(save_b))
    out = _run(_cmd(hf, prompts, run_b, save_b, 3, extra=["--load", save_b]))
    assert "continuing after step 1" in out.stdout
    assert not any(n.startswith(".tmp-") for n in os.listdir(save_b))  # stale partial save removed

    a, b = read_metrics(run_a), read_metrics(run_b)
    assert [r["step"] for r in b] == [1, 2, 3]
    assert _strip(a) == _strip(b)
    wa = load_file(os.path.join(run_a, "final_hf", "model.safetensors"))
    wb = load_file(os.path.join(run_b, "final_hf", "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert (wa[k] == wb[k]).all(), k  # bitwise


def test_sigterm_stops_the_run_and_frees_its_buffers(tiny, tmp_path):
    from megatron_dapo.rollout.payload import shared_memory_files

    hf, prompts = tiny
    run = str(tmp_path / "d")
    err_path = tmp_path / "d.stderr"
    with open(err_path, "w") as err:
        p = subprocess.Popen(
            _cmd(hf, prompts, run, str(tmp_path / "d_ckpt"), 50),
            cwd=ROOT,
            env=_env(),
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    left = ["(not reached)"]
    try:
        deadline = time.time() + 600
        files = []
        while not (files and os.path.exists(os.path.join(run, "metrics.jsonl")) and read_metrics(run)):
            assert p.poll() is None, "the run ended before it could be stopped:\n" + err_path.read_text()[-3000:]
            assert time.time() < deadline, "the run never logged its first step"
            time.sleep(0.2)
            # the trainer's bucket buffers (CPU weight sync), kept between syncs
            files = [f for pid in session_pids(p.pid) for f in shared_memory_files(pid)]
        os.kill(p.pid, signal.SIGTERM)  # the driver only
        try:
            code = p.wait(timeout=180)
        except subprocess.TimeoutExpired:
            code = None
    finally:
        left = leftovers(p, grace_s=RAY_SHUTDOWN_GRACE_S)  # the whole session; killed if still there
        p.wait()
    stderr = err_path.read_text()
    assert code == 128 + signal.SIGTERM, f"exit code {code}:\n{stderr[-3000:]}"
    assert "SIGTERM: stopping the run" in stderr
    assert [f for f in files if os.path.exists(f)] == [], "bucket buffers outlived the run"
    assert left == [], left
    assert len(read_metrics(run)) < 50


def test_sigterm_inside_ray_get_still_exits_143_after_the_cleanup(tmp_path):
    """Inside ``ray.get`` a SystemExit raised by a signal handler comes out as SystemExit(1) and a
    KeyboardInterrupt as a fresh KeyboardInterrupt: ``main`` must still clean up and exit 143."""
    from transformers import AutoConfig

    from tests.tiny import tiny_qwen2_config

    cfg = tiny_qwen2_config(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    conf = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    conf.save_pretrained(str(tmp_path / "hf"))
    marker = tmp_path / "shutdown"
    script = os.path.join(ROOT, "tests", "e2e", "sigterm_driver.py")
    p = subprocess.Popen(
        [sys.executable, script, str(marker), str(tmp_path / "hf")],
        cwd=str(tmp_path),
        env=_env(),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    left = ["(not reached)"]
    try:
        line = p.stdout.readline()  # "blocking" once the driver is about to wait in ray.get
        assert line.strip() == "blocking", line + p.stderr.read()[-3000:]
        time.sleep(2)
        os.kill(p.pid, signal.SIGTERM)
        try:
            code = p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            code = None
    finally:
        left = leftovers(p, grace_s=RAY_SHUTDOWN_GRACE_S)
        p.wait()
    stderr = p.stderr.read()
    assert code == 128 + signal.SIGTERM, f"exit code {code}:\n{stderr[-3000:]}"
    assert marker.read_text() == "shutdown\n"
    assert left == [], left
