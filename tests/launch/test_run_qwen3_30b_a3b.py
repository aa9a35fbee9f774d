"""examples/run_qwen3_30b_a3b.sh in dry-run mode: the Qwen3-30B-A3B recipe's flags, its layout
(TP 2 x EP 8 x ETP 1, engine TP 4) and the plan lines its dry run prints, with the real driver on
a config-only HF directory built from transformers' Qwen3MoeConfig (no weights, no hub).

Every script runs in a session of its own and whatever it started is ended (tests/launch/procs.py).
"""

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_dapo.config import parse_args
from megatron_dapo.models import parse_hf_config
from tests.launch.procs import run_in_session
from tests.launch.test_scripts import _env

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "examples" / "run_qwen3_30b_a3b.sh"
TAG = "[run_qwen3_30b_a3b] "


def routing_replay_parses() -> bool:
    """Whether this checkout's driver has --routing-replay (added by the R3 work)."""
    try:
        parse_args(["--routing-replay"])
    except (SystemExit, Exception):
        return False
    return True


def _replay_env() -> dict:
    # the script passes --routing-replay; where the driver does not know it yet, run without it
    return {} if routing_replay_parses() else {"ROUTING_REPLAY": "0"}


def _driver_argv(stderr: str) -> list:
    line = [x for x in stderr.splitlines() if x.startswith(TAG) and " -m megatron_dapo.train " in x][-1]
    argv = shlex.split(line[len(TAG) :])
    return argv[argv.index("megatron_dapo.train") + 1 :]


@pytest.fixture(scope="module")
def a3b_config_dir(tmp_path_factory):
    """Qwen3-30B-A3B's shape as transformers writes it (Qwen3MoeConfig.save_pretrained), no weights."""
    from transformers import Qwen3MoeConfig

    d = tmp_path_factory.mktemp("qwen3-30b-a3b-config")
    Qwen3MoeConfig(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        router_aux_loss_coef=0.001,
        max_position_embeddings=32768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ).save_pretrained(d)
    # the marker of a shape-only directory: the dry run warns about the missing weights instead of failing
    (d / "SHAPE_ONLY.md").write_text("Qwen3-30B-A3B shape only (test)\n")
    return d


@pytest.fixture()
def shim(tmp_path):
    p = tmp_path / "python-shim"
    p.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(ROOT / "tests/launch/report_only.py"))} "$@"\n'
    )
    p.chmod(0o755)
    return str(p)


def test_script_syntax_and_flags():
    text = RUN.read_text()
    assert subprocess.run(["bash", "-n", str(RUN)]).returncode == 0
    assert "--num-layers" not in text and "--hidden-size" not in text  # the shape comes from config.json
    for flag in (
        "--routing-replay",
        "--expert-model-parallel-size 8",
        "--expert-tensor-parallel-size 1",
        "--tensor-model-parallel-size 2",
        "--sequence-parallel",
        "--rollout-num-gpus-per-engine 4",
    ):
        assert flag in text, flag
    # the stand-in shape the script uses when HF_CKPT is not set parses as Qwen3-30B-A3B
    a = parse_hf_config(ROOT / "examples" / "qwen3-30b-a3b")
    assert (a.num_layers, a.hidden_size, a.num_experts, a.moe_router_topk, a.moe_ffn_hidden_size) == (
        48,
        2048,
        128,
        8,
        768,
    )
    assert (ROOT / "examples" / "qwen3-30b-a3b" / "SHAPE_ONLY.md").exists()


@pytest.mark.parametrize("nnodes", [4, 8])
def test_flags_and_node_count(tmp_path, shim, nnodes):
    """Every flag parses (the report-only stand-in for the driver), NNODES reaches the driver,
    the DAPO hyperparameters are the paper's, the expert layout is the one argued in docs/moe.md."""
    p = run_in_session(
        ["bash", str(RUN), "--dry-run"], 120, env=_env(tmp_path, shim, NNODES=str(nnodes), **_replay_env()), cwd=ROOT
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "dry run with the public config in examples/qwen3-30b-a3b" in p.stderr
    argv = _driver_argv(p.stderr)
    assert ("--routing-replay" in argv) == routing_replay_parses()
    cfg = parse_args(argv)
    par, o, r, a = cfg.parallel, cfg.optim, cfg.rollout, cfg.algo
    assert (par.nnodes, par.gpus_per_node) == (nnodes, 8)
    assert (par.tensor_model_parallel_size, par.pipeline_model_parallel_size, par.context_parallel_size) == (2, 1, 1)
    assert (par.expert_model_parallel_size, par.expert_tensor_parallel_size, par.sequence_parallel) == (8, 1, True)
    assert r.num_gpus_per_engine == 4 and r.engine == "sglang" and par.use_distributed_optimizer
    assert (o.lr, o.lr_warmup_rollout_steps, o.global_batch_size, o.max_tokens_per_gpu) == (1e-6, 10, 512, 22528)
    assert (a.eps_clip_low, a.eps_clip_high, a.max_response_length, a.dynamic_sampling) == (0.2, 0.28, 20480, True)
    assert cfg.moe.moe_router_load_balancing_type == "global_aux_loss"
    assert f"{nnodes} nodes x 8 GPUs = {nnodes * 8} GPUs; TP 2 x PP 1 x CP 1 x DP {nnodes * 4}" in p.stdout


def test_dry_run_with_the_driver_prints_the_moe_plan(tmp_path, a3b_config_dir):
    """The real driver's dry run at 4 nodes on a Qwen3MoeConfig directory: the expert sync bytes
    per feeder, the per-GPU memory and the KV budget recorded in docs/moe.md."""
    env = _env(tmp_path, sys.executable, NNODES="4", HF_CKPT=str(a3b_config_dir), **_replay_env())
    p = run_in_session(["bash", str(RUN), "--dry-run"], 300, env=env, cwd=ROOT)
    out = p.stdout
    assert p.returncode == 0, (out + p.stderr)[-4000:]
    assert "not found: dry run with the public config" not in p.stderr  # a path the user set is used as given
    for needle in (
        "configuration valid",
        f"model shape from: {a3b_config_dir}",
        "qwen3_moe 30.53B params, 48 layers, hidden 2048",
        "128 experts of width 768, top-8, expert parallel EP 8 x ETP 1",
        "4 nodes x 8 GPUs = 32 GPUs; TP 2 x PP 1 x CP 1 x DP 16",
        "launch order: 1. engines (SGLang TP4 x 8) on free GPUs",
        # weight sync: the whole model per feeder, the experts' part of it, gathered inside the node
        "61.1 GB per feeder and sync (bf16), 114 buckets of 512 MiB",
        "experts: 58.0 GB of it per feeder (48 layers x 128 experts), 50.7 GB all-gathered from the other 7 ranks "
        "of each stage's ETP x EP group (within the node)",
        "expected sync: 0.37 s",
        # trainer memory: dense / TP 2 + router + experts / 8; optimizer dense / DP 16, experts / EDP 4
        "trainer: 4.401B params per GPU",
        "= static                    37.9 GB",
        "full recompute             5.5 GB  <- configured",
        "= training peak             56.7 GB",
        # engine TP 4 = 4 KV heads: one KV head per GPU
        "KV cache 48 layers x 2 x 1 KV heads/GPU x 128 x 2 bytes = 24 KiB per token per GPU",
        "KV cache budget 40.0 GB = 1,628,985 KV tokens per engine",
        "KV cache budget 82.7 GB = 3,366,452 KV tokens per engine",
        "H100 80GB: training 56.7 GB, generation 63.3 GB -> peak 63.3 GB of 80 GB: fits",
        "H200 141GB: training 56.7 GB, generation 106.0 GB -> peak 106.0 GB of 141 GB: fits",
        "--- warnings: none ---",
    ):
        assert needle in out, f"{needle!r} missing:\n{out[-6000:]}"
