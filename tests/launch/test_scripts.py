"""The launch scripts: examples/run_qwen32b.sh and examples/slurm/submit_dapo.sbatch in dry-run mode.

Two layers: with ``report_only.py`` standing in for the driver (every flag parses, the plan
builds, the paper's hyperparameters are what the script passes), and with the real driver
(``python -m megatron_dapo.train --dry-run``). Every script runs in a session of its own,
and whatever it started is killed when the test ends, also when it fails or times out.
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_dapo.config import parse_args
from tests.launch.procs import RAY_SHUTDOWN_GRACE_S, run_in_session

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "examples" / "run_qwen32b.sh"
SBATCH = ROOT / "examples" / "slurm" / "submit_dapo.sbatch"


def _env(tmp_path, python=None, **extra):
    # HF_CKPT, PROMPT_DATA, EVAL_DATA, TOKENIZER not set, and their defaults exist nowhere: the dry-run stand-ins kick
    # in (a path the user sets is never replaced: tests/launch/test_preflight.py)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SLURM_")
        and k not in ("RAY_ADDRESS", "DRY_RUN", "HF_CKPT", "PROMPT_DATA", "EVAL_DATA", "TOKENIZER")
    }
    # --save on a filesystem not mounted here (the dry run's disk check: a 32B checkpoint does not fit this machine)
    env.update(
        SAVE_DIR=str(tmp_path / "cluster" / "checkpoints" / "save"),
        RUN_DIR=str(tmp_path / "run"),
        # the dry run's 16-row DAPO-Math sample: vendored, so a checkout without ../shared works
        SHARED_DATA=str(ROOT / "tests" / "data"),
    )
    if python:
        env["PYTHON"] = python
    env.update(extra)
    return env


@pytest.fixture()
def shim(tmp_path):
    """A PYTHON for the scripts that only parses the flags and prints the dry-run report."""
    p = tmp_path / "python-shim"
    p.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(ROOT / "tests/launch/report_only.py"))} "$@"\n'
    )
    p.chmod(0o755)
    return str(p)


def _run(cmd, env, timeout=120):
    return run_in_session(cmd, timeout, env=env, cwd=ROOT)


def _driver_argv(stderr: str) -> list:
    line = [x for x in stderr.splitlines() if x.startswith("[run_qwen32b] ") and " -m megatron_dapo.train " in x][-1]
    argv = shlex.split(line[len("[run_qwen32b] ") :])
    return argv[argv.index("megatron_dapo.train") + 1 :]


def test_run_qwen32b_sections_and_syntax():
    text = RUN.read_text()
    for sec in ("MODEL_ARGS", "CKPT_ARGS", "ROLLOUT_ARGS", "DAPO_ARGS", "PERF_ARGS", "EVAL_ARGS", "LOG_ARGS"):
        assert f"{sec}=(" in text
    assert "--num-layers" not in text and "--hidden-size" not in text  # the shape comes from config.json
    assert subprocess.run(["bash", "-n", str(RUN)]).returncode == 0
    assert subprocess.run(["bash", "-n", str(SBATCH)]).returncode == 0


def test_run_qwen32b_passes_the_paper_hyperparameters(tmp_path, shim):
    p = _run(["bash", str(RUN), "--dry-run"], _env(tmp_path, shim))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "config.json not found: dry run with the public config in examples/qwen2.5-32b" in p.stderr
    cfg = parse_args(_driver_argv(p.stderr))  # every flag the script passes parses
    o, r, a, d, par = cfg.optim, cfg.rollout, cfg.algo, cfg.data, cfg.parallel
    assert cfg.model.hf_checkpoint == str(ROOT / "examples" / "qwen2.5-32b") and cfg.model.bf16
    assert (o.lr, o.lr_warmup_rollout_steps, o.weight_decay, o.clip_grad, o.global_batch_size) == (
        1e-6,
        10,
        0.1,
        1.0,
        512,
    )
    assert (r.rollout_batch_size, r.n_samples_per_prompt, r.over_sampling_batch_size, r.max_num_gen_batches) == (
        512,
        16,
        1536,
        10,
    )
    assert (r.temperature, r.top_p, r.engine) == (1.0, 1.0, "sglang")
    assert (a.eps_clip_low, a.eps_clip_high, a.clip_ratio_c) == (0.2, 0.28, 10.0)
    assert (a.max_response_length, a.overlong_buffer_length, a.loss_agg_mode, a.dynamic_sampling) == (
        20480,
        4096,
        "token-mean",
        True,
    )
    assert a.dynamic_sampling_metric == "acc" and a.kl_coef == 0 and a.entropy_coef == 0
    assert (d.max_prompt_length, d.prompt_overflow) == (2048, "truncate-left")
    assert (par.nnodes, par.gpus_per_node, par.tensor_model_parallel_size, par.pipeline_model_parallel_size) == (
        16,
        8,
        8,
        1,
    )
    assert cfg.run.dry_run and o.max_tokens_per_gpu == 22528
    out = p.stdout
    for needle in (
        "16 nodes x 8 GPUs = 128 GPUs",
        "TP 8 x PP 1 x CP 1 x DP 16",
        "32 engines",
        "10 rollout steps = 160 optimizer steps",
        "peak 63.3 GB of 80 GB: fits",
        "--- warnings: none ---",
    ):
        assert needle in out, f"{needle!r} missing:\n{out}"


def test_run_qwen32b_uses_a_present_checkpoint_and_passes_extra_args(tmp_path, shim):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text((ROOT / "examples/qwen2.5-32b/config.json").read_text())
    p = _run(["bash", str(RUN), "--dry-run", "--num-rollout", "7"], _env(tmp_path, shim, HF_CKPT=str(ckpt)))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "not found: dry run with the public config" not in p.stderr
    cfg = parse_args(_driver_argv(p.stderr))
    assert cfg.model.hf_checkpoint == str(ckpt) and cfg.run.num_rollout_steps == 7  # "$@" wins


def test_sbatch_dry_run_without_slurm(tmp_path, shim):
    p = _run(
        ["bash", str(SBATCH)],
        _env(tmp_path, shim, DRY_RUN="1", NODELIST="gpu-a,gpu-b", GPUS_PER_NODE="8", NCCL_SOCKET_IFNAME="ib0"),
    )
    out = p.stdout
    # 2 nodes x 8 = 16 GPUs: global batch 512 / DP 2 fine
    assert p.returncode == 0, out + p.stderr
    assert "(not under Slurm)" in out and "nodes (2): gpu-a gpu-b; head: gpu-a" in out
    assert "-w gpu-a bash -c" in out and "ray start --head" in out and "--include-dashboard=false" in out
    assert "-w gpu-b bash -c" in out and "ray start --address=$HEAD_IP:6379" in out
    assert '{"slurm_node:gpu-b": 1}' in out
    assert "wait-nodes" in out and "--nodes gpu-a,gpu-b --gpus-per-node 8" in out
    assert "NCCL_SOCKET_IFNAME=ib0 GLOO_SOCKET_IFNAME=ib0" in out
    assert "2 nodes x 8 GPUs = 16 GPUs" in out
    p2 = _run(["bash", str(SBATCH), "--dry-run"], _env(tmp_path, shim))
    assert p2.returncode == 0 and "nodes (16): node01" in p2.stdout, p2.stdout + p2.stderr


def test_sbatch_exports_the_ray_start_env_of_a_local_start():
    """The nodes' `ray start` gets the waits and the worker priority that start_ray sets for a
    local start (launch/placement.RAY_START_ENV), each a default a user's value overrides."""
    import re

    from megatron_dapo.launch.placement import RAY_START_ENV

    text = SBATCH.read_text()
    for k, v in RAY_START_ENV.items():
        assert re.search(rf'^export {k}="\$\{{{k}:-{re.escape(v)}\}}"$', text, re.M), (k, v)


def test_sbatch_refuses_to_run_outside_slurm(tmp_path, shim):
    p = _run(["bash", str(SBATCH)], _env(tmp_path, shim))
    assert p.returncode == 2 and "not under Slurm" in p.stderr


def test_run_qwen32b_dry_run_with_the_driver(tmp_path):
    p = _run(["bash", str(RUN), "--dry-run"], _env(tmp_path, sys.executable), timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    for needle in (
        "configuration valid",
        "TP 8 x PP 1 x CP 1 x DP 16",
        "per-GPU memory estimate",
        "10 rollout steps = 160 optimizer steps",
        "launch order: 1. engines (SGLang TP4 x 32) on free GPUs",
        "2. engines release weights/kv_cache/cuda_graph",
        "3. trainer builds model + optimizer",
        "4. first weight sync",
        "H100 80GB engine GPU at launch: free 79.0 GB",
        "H200 141GB engine GPU at launch: free 140.0 GB",
        "weights share 16.4 GB + KV cache budget 38.9 GB",
        "CUDA graphs 1.1 GB",
        "old order (trainer",
    ):
        assert needle in p.stdout, p.stdout[-4000:]


def test_sbatch_dry_run_with_the_driver(tmp_path):
    p = _run(["bash", str(SBATCH)], _env(tmp_path, sys.executable, DRY_RUN="1"), timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert "ray start --head" in p.stdout and "configuration valid" in p.stdout


def _run_fake_slurm_job(tmp_path, **extra):
    """submit_dapo.sbatch under the fake Slurm on this machine: (returncode, stdout, stderr,
    RAY_PORT, leftover pids). Every process it started is ended."""
    import uuid

    tmp_path.mkdir(parents=True, exist_ok=True)

    from megatron_dapo.distributed import free_port

    stubs = ROOT / "tests" / "launch" / "fake_slurm"
    temp = f"/tmp/rt-{uuid.uuid4().hex[:8]}"  # Ray's socket paths must stay short
    base = free_port()
    taken = set(range(base, base + 201))  # the worker port range

    def port():  # a free port outside the worker range and unlike the others (Ray refuses overlaps)
        while True:
            p = free_port()
            if p not in taken:
                taken.add(p)
                return str(p)

    env = _env(
        tmp_path,
        sys.executable,
        PATH=f"{stubs}:{os.environ['PATH']}",
        SLURM_JOB_ID="fake1",
        SLURM_JOB_NODELIST="fakehead",
        GPUS_PER_NODE="1",
        CPUS_PER_NODE="1",
        RAY_PORT=port(),
        RAY_NODE_MANAGER_PORT=port(),
        RAY_OBJECT_MANAGER_PORT=port(),
        RAY_MIN_WORKER_PORT=str(base),
        RAY_MAX_WORKER_PORT=str(base + 200),
        RAY_TEMP_DIR=temp,
        RAY_HEAD_START_S="1",
        RAY_WAIT_TIMEOUT="90",
        DRIVER_SCRIPT=str(stubs / "driver.sh"),
    )
    env.pop("RAY_AUTH_MODE", None)
    env.pop("RAY_AUTH_TOKEN", None)
    env.update(extra)
    # The script runs in its own session, so that every process it starts (srun stubs,
    # `ray start --block`, the wait-nodes client, the driver stub) can be ended as a group;
    # Ray daemons may start sessions of their own: whatever runs under our temp dir is ours too
    try:
        done = run_in_session(
            ["bash", str(SBATCH), "--foo", "1"],
            timeout=240,
            grace_s=RAY_SHUTDOWN_GRACE_S,
            pattern=temp,
            env=env,
            cwd=ROOT,
        )
    finally:
        shutil.rmtree(temp, ignore_errors=True)  # Ray's session logs of this job
    return done.returncode, done.stdout, done.stderr, env["RAY_PORT"], done.leftovers


@pytest.mark.slow
def test_sbatch_starts_ray_and_the_driver_under_fake_slurm(tmp_path):
    """The real (non-dry) path with stub srun/scontrol on this machine: head start, token auth,
    node wait, driver. Ray gives a starting raylet a fixed 30 s to register with its GCS; on a
    loaded machine that can run out, the script then stops at once naming the node, and the
    job is submitted once more (what a user would do)."""
    for attempt in (1, 2):
        rc, stdout, stderr, port, left = _run_fake_slurm_job(tmp_path / f"try{attempt}")
        out = stdout + stderr
        assert not left, f"processes left running by the script: {left}"
        if rc != 0 and "exited during startup" in stderr and "timed out during startup" in out and attempt == 1:
            continue
        break
    assert rc == 0, out[-4000:]
    assert "all 1 node(s) registered" in out, out[-4000:]
    line = [x for x in stdout.splitlines() if x.startswith("DRIVER ")]
    assert line, out[-4000:]
    assert "['slurm_node:fakehead'] 1.0 ARGS --foo 1" in line[0] and f":{port} " in line[0]


@pytest.mark.parametrize("client_ignores_term", [False, True], ids=["wait-nodes", "wait-client-ignores-TERM"])
def test_sbatch_stops_at_once_when_ray_start_fails(tmp_path, client_ignores_term):
    """A `ray start --block` that exits (here a stand-in that fails) stops the job, naming the
    node, instead of waiting out RAY_WAIT_TIMEOUT (a day here: waiting for it would run into
    the 240 s limit of the run and fail this test).

    ``wait-client-ignores-TERM``: the node-wait client does not end on SIGTERM, as happens
    when the real one is inside ray.init (Ray's Python SIGTERM handler cannot run while its
    C++ client retries an unreachable GCS; seen once under load). The stand-in `ray` fails
    only once that client is ignoring TERM, so the script must end it another way."""
    ready = tmp_path / "client-ignores-term"
    fake_ray = tmp_path / "ray"
    wait_first = f"for _ in $(seq 600); do [ -e {ready} ] && break; sleep 0.2; done\n" if client_ignores_term else ""
    fake_ray.write_text(
        "#!/usr/bin/env bash\n"
        + wait_first
        + "echo 'ray start failed: The current node timed out during startup' >&2\nexit 1\n"
    )
    fake_ray.chmod(0o755)
    extra = {}
    if client_ignores_term:
        stand_in = tmp_path / "python"
        ignore = (
            "import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"pathlib.Path({str(ready)!r}).touch(); time.sleep(3600)"
        )
        stand_in.write_text(
            "#!/usr/bin/env bash\n"
            f'if [ "$1 $2 $3" = "-m megatron_dapo.launch.placement wait-nodes" ]; then exec {sys.executable} -c "{ignore}"; fi\n'
            f'exec {sys.executable} "$@"\n'
        )
        stand_in.chmod(0o755)
        extra["PYTHON"] = str(stand_in)
    rc, stdout, stderr, _, left = _run_fake_slurm_job(
        tmp_path / "job", RAY_BIN=str(fake_ray), RAY_WAIT_TIMEOUT="86400", **extra
    )
    assert not left, f"processes left running by the script: {left}"
    assert "did not finish in 240 s" not in stderr, stderr[-3000:]
    assert rc == 1, (stdout + stderr)[-3000:]
    assert "`ray start` on fakehead exited during startup" in stderr, stderr[-3000:]
    assert "DRIVER " not in stdout
    assert not client_ignores_term or ready.exists()
