"""Exact resume after a crash during a save (kill -9), resume on fewer nodes, and SIGTERM.

A: ``python -m megatron_dapo.train`` with ``--actor-num-nodes 2 --actor-num-gpus-per-node 1``
(2 trainer ranks, DP 2; one rollout engine fed by both), 2 DAPO steps in --deterministic mode,
a checkpoint after each; it is the reference of B and C (one module fixture).

* B: the same run killed (SIGKILL) in the middle of its step-2 save, after both ranks wrote their
  shards, then resumed with --load from the step-1 checkpoint at the same layout: its metrics
  (except timings) and final weights equal A's, bitwise.
* C: ``--load`` of A's step-1 checkpoint with ``--actor-num-nodes 1`` (1 rank, DP 1, one engine),
  step 2 only: a 2 -> 1 node resume. What is simulated: the two "nodes" are two Ray bundles on
  this one host, so the checkpoint records 1 host; what changes between A and C is the rank count
  and the data-parallel size, which is what a 2 -> 1 node resume changes for the checkpoint (its
  tensors have global keys, no node in them). With --deterministic, C's step 2 generates the same
  responses (per-sample seeds, the same weights, one engine in both): the same generation metrics,
  |dloss| <= 1e-6 (measured 1.2e-8) and the weights within the bound of tests/tolerances.py for
  the step's two Adam steps (--adam-eps 1e-3 there; measured 3.3e-8 at lr 1e-3). C logs one note
  that the per-rank RNG states were re-derived.
* D: SIGTERM to the driver alone (as scancel or a time limit sends it) stops the run with
  everything it started, and its trainers' shared-memory bucket buffers are gone; E: the same
  while the driver waits in ``ray.get`` (which turns an exception raised by the handler into
  another one), exit 143.
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
from tests.tolerances import COMPARE_ADAM_EPS, adam_weight_atol, max_abs

pytestmark = [pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOSS_TOL = 1e-6
# the step's generation, the same in A and C when the responses are the same
SAME_ROLLOUT_KEYS = ("reward_mean", "acc_mean", "response_length_mean", "response_length_max", "kept_group_ratio")


def _cmd(hf, prompts, run, save, steps, nodes=1, extra=()):
    """The driver's command line; ``save=None``: no checkpoints (a run whose own are never read)."""
    saving = {"--save": save, "--save-interval": "1", "--keep-last": "3"} if save else {}
    args = base_args(
        hf,
        prompts,
        run,
        **{
            "--num-rollout": str(steps),
            **saving,
            "--deterministic": None,
            "--save-hf-final": None,
            "--actor-num-nodes": str(nodes),
            "--actor-num-gpus-per-node": "1",
            "--rollout-num-gpus-per-engine": str(nodes),
            "--adam-eps": str(COMPARE_ADAM_EPS),
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


def _main(cmd, capsys):
    """The driver's ``main`` in this process, for a run that is refused or ends before Ray starts
    (the same checks as ``python -m megatron_dapo.train``, without a Python start and its imports):
    a CompletedProcess of its exit code and what it printed. An error that is no user error raises
    here, as it would end the subprocess with a traceback."""
    from megatron_dapo.train import main

    assert cmd[1:3] == ["-m", "megatron_dapo.train"], cmd
    capsys.readouterr()
    code = main(cmd[3:])
    out = capsys.readouterr()
    return subprocess.CompletedProcess(cmd, code, out.out, out.err)


def _latest(save):
    try:
        with open(os.path.join(save, "latest")) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time_") and k != "tokens_per_second"} for r in rows]


def _final_weights(run):
    return load_file(os.path.join(run, "final_hf", "model.safetensors"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_resume")
    return make_tiny_qwen2_dir(str(d / "hf")), make_prompts(str(d / "prompts.jsonl"))


@pytest.fixture(scope="module")
def run_a(tiny, tmp_path_factory):
    """A: the uninterrupted 2-node run (2 steps, a checkpoint after each): (run dir, save dir)."""
    hf, prompts = tiny
    d = tmp_path_factory.mktemp("resume_a")
    run, save = str(d / "a"), str(d / "a_ckpt")
    _run(_cmd(hf, prompts, run, save, 2, nodes=2))
    return run, save


def test_a_crash_during_a_save_keeps_the_previous_checkpoint_and_the_resume_is_exact(tiny, run_a, tmp_path, capsys):
    """B dies by SIGKILL in the middle of its step-2 save (after its two ranks wrote their shards,
    before the driver state and the commit; then everything it started is killed): ``latest``
    still names step 1, the partial save is a ``.tmp-`` directory, and the resumed run, which
    redoes step 2, ends bitwise where the uninterrupted run A ends."""
    hf, prompts = tiny
    run_b, save_b = str(tmp_path / "b"), str(tmp_path / "b_ckpt")
    crash = ["--debug-crash-during-save-step", "2"]
    r = _run(_cmd(hf, prompts, run_b, save_b, 2, nodes=2, extra=crash), check=False)
    assert r.returncode == -signal.SIGKILL, r.stdout[-3000:] + r.stderr[-3000:]
    assert _latest(save_b) == "step_000001"  # the interrupted save never became 'latest'
    assert any(n.startswith(".tmp-step_000002") for n in os.listdir(save_b))
    out = _run(_cmd(hf, prompts, run_b, save_b, 2, nodes=2, extra=["--load", save_b]))
    assert "continuing after step 1" in out.stdout
    assert not any(n.startswith(".tmp-") for n in os.listdir(save_b))  # stale partial save removed

    a, b = read_metrics(run_a[0]), read_metrics(run_b)
    assert [r["step"] for r in b] == [1, 2]
    assert _strip(a) == _strip(b)
    wa, wb = _final_weights(run_a[0]), _final_weights(run_b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert (wa[k] == wb[k]).all(), k  # bitwise

    # issue 38, through the real driver's main on B's real checkpoint (each refused or ended before
    # Ray starts, so in this process): nothing left to do at step 2 of 2; another --seed; a damaged shard
    again = _main(_cmd(hf, prompts, run_b, save_b, 2, nodes=2, extra=["--load", save_b]), capsys)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "step 2 is already done and --num-rollout is 2: nothing left to do" in again.stdout
    assert [r["step"] for r in read_metrics(run_b)] == [1, 2]
    seeded = _main(_cmd(hf, prompts, run_b, save_b, 3, nodes=2, extra=["--load", save_b, "--seed", "4"]), capsys)
    assert seeded.returncode == 2 and "Traceback" not in seeded.stderr
    assert "--seed 4: the resumed run" in seeded.stderr and "--seed 3" in seeded.stderr
    step2 = os.path.join(save_b, "step_000002")
    shard = sorted(n for n in os.listdir(step2) if n.endswith(".distcp"))[0]
    with open(os.path.join(step2, shard), "r+b") as f:
        f.seek(100)
        f.write(b"\xff" * 8)
    damaged = _main(_cmd(hf, prompts, run_b, save_b, 3, nodes=2, extra=["--load", save_b]), capsys)
    assert damaged.returncode == 2 and "Traceback" not in damaged.stderr
    assert f"step_000002/{shard} is damaged" in damaged.stderr + damaged.stdout


def test_a_two_node_checkpoint_resumes_on_one_node(tiny, run_a, tmp_path):
    from megatron_dapo.checkpoint.dist_ckpt import read_metadata

    hf, prompts = tiny
    step1 = os.path.join(run_a[1], "step_000001")
    layout = read_metadata(step1)["layout"]
    assert (layout["world_size"], layout["dp"], layout["tp"]) == (2, 2, 1), layout
    run_c = str(tmp_path / "c")
    out = _run(_cmd(hf, prompts, run_c, None, 2, nodes=1, extra=["--load", step1]))

    notes = [line for line in out.stdout.splitlines() if line.startswith("[resume] layout:")]
    assert len(notes) == 1 and "DP 2 -> 1, ranks 2 -> 1" in notes[0] and "re-derived" in notes[0], out.stdout[-3000:]
    assert "continuing after step 1" in out.stdout
    a, c = read_metrics(run_a[0]), read_metrics(run_c)
    assert [r["step"] for r in c] == [2]
    ra, rc = _strip(a)[1], _strip(c)[0]
    for k in SAME_ROLLOUT_KEYS:
        assert ra[k] == rc[k], (k, ra[k], rc[k])
    dloss = abs(ra["pg_loss"] - rc["pg_loss"])
    wa, wc = _final_weights(run_a[0]), _final_weights(run_c)
    assert wa.keys() == wc.keys()
    dw = max(float((wa[k] - wc[k]).abs().max()) for k in wa)
    print(f"[reshard] driver, 2 ranks (--actor-num-nodes 2) -> 1 rank: |dloss| {dloss:.2e} |dweight| {dw:.2e}")
    assert ra["grad_norm"] == pytest.approx(rc["grad_norm"], rel=1e-5)
    # step 2 is two Adam steps (lr 1e-3, clip 1.0 by default) on gradients that differ by DP 2 vs DP 1
    weight_tol = adam_weight_atol(1e-3, max(ra["grad_norm"], rc["grad_norm"]), max_abs(wa), steps=2, clip_grad=1.0)
    assert dloss <= LOSS_TOL and dw <= weight_tol, (dloss, dw, weight_tol)


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
