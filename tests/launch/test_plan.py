"""The --dry-run report: placement plan, per-GPU memory estimate, LR schedule, warnings (pure, CPU)."""

from pathlib import Path

import pytest

from megatron_dapo.config import ConfigError, parse_args
from megatron_dapo.launch.memory_estimate import CUDA_CONTEXT_GB, GB, estimate_memory, sglang_graph_max_bs, stage_params
from megatron_dapo.launch.plan import dry_run_report
from megatron_dapo.launch.rank_layout import placement_plan, rank_coord
from megatron_dapo.launch.schedule import lr_schedule
from megatron_dapo.models.hf_config import parse_hf_config

ROOT = Path(__file__).resolve().parents[2]
QWEN32B = ROOT / "examples" / "qwen2.5-32b"

# 16 nodes x 8 GPUs, the paper's batch shape
CLUSTER = [
    "--actor-num-nodes",
    "16",
    "--actor-num-gpus-per-node",
    "8",
    "--bf16",
    "--rollout-engine",
    "sglang",
    "--use-distributed-optimizer",
    "--max-tokens-per-gpu",
    "22528",
    "--rollout-batch-size",
    "512",
    "--n-samples-per-prompt",
    "16",
    "--global-batch-size",
    "512",
    "--over-sampling-batch-size",
    "1536",
    "--lr-warmup-rollout-steps",
    "10",
]


@pytest.fixture(scope="module")
def arch():
    return parse_hf_config(QWEN32B)


def _cfg(*extra):
    cfg = parse_args(CLUSTER + list(extra))
    return cfg


def test_qwen32b_parameter_count(arch):
    assert arch.num_parameters == 32_763_876_352
    assert sum(stage_params(arch, 1, 1)) == arch.num_parameters


def test_weights_per_gpu_tp8_pp2_is_a_sixteenth(arch):
    cfg = _cfg("--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "2")
    m = estimate_memory(cfg, arch)
    assert m.weights == pytest.approx(65.5e9 / 16, rel=0.01)  # bf16 weights / (TP x PP)
    assert m.grads == pytest.approx(2 * m.weights)  # fp32 grads
    # Adam m + v + fp32 main params = 12 bytes/param, sharded over DP 8
    assert m.optimizer == pytest.approx(12 * m.params_per_gpu / 8)
    assert 14 * GB < m.static < 17 * GB
    # activations: recompute is a large saving, both within sane bounds
    assert 5 * GB < m.activations_full_recompute < 30 * GB
    assert 50 * GB < m.activations_no_recompute < 200 * GB
    assert m.activations_full_recompute < m.activations_no_recompute / 3
    assert 1 * GB < m.logits < 10 * GB


def test_distributed_optimizer_and_sequence_parallel_shrink_memory(arch):
    base = estimate_memory(_cfg("--tensor-model-parallel-size", "8", "--use-distributed-optimizer", "false"), arch)
    dist = estimate_memory(_cfg("--tensor-model-parallel-size", "8"), arch)
    assert base.optimizer == pytest.approx(dist.optimizer * 16)  # DP 16
    sp = estimate_memory(_cfg("--tensor-model-parallel-size", "8", "--sequence-parallel"), arch)
    assert sp.activations_no_recompute < dist.activations_no_recompute
    fp32 = estimate_memory(_cfg("--tensor-model-parallel-size", "8", "--bf16", "false"), arch)
    assert fp32.weights == 2 * dist.weights and fp32.optimizer < dist.optimizer  # no fp32 main copy


def test_engine_kv_cache(arch):
    m = estimate_memory(_cfg("--tensor-model-parallel-size", "8", "--rollout-num-gpus-per-engine", "8"), arch, 80)
    # 64 layers x 2 (K, V) x 1 KV head per GPU x 128 x 2 bytes
    assert m.kv_bytes_per_token == 64 * 2 * 1 * 128 * 2
    assert m.engine_weights == pytest.approx(65.5e9 / 8, rel=0.01)
    # SGLang's sizing: mem_fraction_static x the free memory at launch (the GPU minus a CUDA context)
    assert m.kv_cache == pytest.approx(0.7 * (80e9 - CUDA_CONTEXT_GB * 1e9) - m.engine_weights)
    assert m.kv_tokens == int(m.kv_cache // m.kv_bytes_per_token)
    m4 = estimate_memory(_cfg("--tensor-model-parallel-size", "8", "--rollout-num-gpus-per-engine", "4"), arch, 141)
    assert m4.kv_bytes_per_token == 2 * m.kv_bytes_per_token
    assert m4.engine_pool == pytest.approx(0.7 * (141e9 - CUDA_CONTEXT_GB * 1e9))


def test_engine_budget_engines_first_vs_trainer_resident(arch):
    # TP 8 x DP 16 trainer, TP 4 engines: what an engine GPU gets when the engines are launched
    # first, and what it got when the trainer's weights, grads and optimizer were resident.
    m = estimate_memory(_cfg("--tensor-model-parallel-size", "8", "--rollout-num-gpus-per-engine", "4"), arch, 80)
    assert m.static == pytest.approx(m.weights + m.grads + m.optimizer) and 25e9 < m.static < 30e9
    assert m.free_at_launch_trainer_resident == pytest.approx(m.engine_free_at_launch - m.static)
    assert m.kv_cache_trainer_resident == pytest.approx(0.7 * (m.engine_free_at_launch - m.static) - m.engine_weights)
    assert m.kv_cache - m.kv_cache_trainer_resident == pytest.approx(0.7 * m.static)  # what the order buys
    assert m.kv_tokens_trainer_resident < 0.6 * m.kv_tokens
    # SGLang 0.5.23's decode-graph estimate (memory_hook.py): max_bs 512 from engine TP 4, 2 MiB each
    assert (m.graph_max_bs, m.engine_graphs) == (512, 512 * 2 * 2**20)
    assert sglang_graph_max_bs(80, 2) == 256 and sglang_graph_max_bs(141, 8) == 512
    assert m.engine_graphs < m.engine_slack == pytest.approx(0.3 * m.engine_free_at_launch)


def _num(pattern: str, text: str) -> float:
    import re

    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in:\n{text}"
    return float(found.group(1).replace(",", ""))


def test_report_prints_launch_order_and_engine_gpu_budget(arch):
    text = dry_run_report(_cfg("--tensor-model-parallel-size", "8", "--rollout-num-gpus-per-engine", "4"), arch)
    lines = text.splitlines()
    first = next(
        i for i, x in enumerate(lines) if x.startswith("launch order: 1. engines (SGLang TP4 x 32) on free GPUs")
    )
    assert lines[first + 1].strip() == "2. engines release weights/kv_cache/cuda_graph"
    assert lines[first + 2].strip().startswith("3. trainer builds model + optimizer (TP 8 x PP 1 x CP 1 x DP 16")
    assert lines[first + 3].strip().startswith("4. first weight sync")
    assert lines[first + 4].strip().startswith("5. loop: generate")
    for name, cap, (kv_lo, kv_hi) in (("H100 80GB", 80, (35, 42)), ("H200 141GB", 141, (75, 85))):
        line = next(x for x in lines if x.strip().startswith(f"{name} engine GPU at launch"))
        assert _num(r"free ([\d.]+) GB", line) == pytest.approx(cap - CUDA_CONTEXT_GB)
        assert _num(r"weights share ([\d.]+) GB", line) == pytest.approx(16.4)  # 32.8B x 2 bytes / TP 4
        kv = _num(r"KV cache budget ([\d.]+) GB", line)
        tokens = _num(r"= ([\d,]+) KV tokens per engine", line)
        assert kv_lo < kv < kv_hi and tokens == pytest.approx(kv * 1e9 / (64 * 1024), rel=0.01)
        graphs = lines[lines.index(line) + 1]
        assert _num(r"CUDA graphs ([\d.]+) GB", graphs) == pytest.approx(1.1) and "up to 512" in graphs
        old = lines[lines.index(line) + 2]
        assert "old order" in old and _num(r"optimizer ([\d.]+) GB resident", old) > 25
        old_tokens = _num(r"= ([\d,]+) KV tokens", old)
        assert 0 < old_tokens < tokens and tokens - old_tokens == pytest.approx(0.7 * 27.6e9 / (64 * 1024), rel=0.02)


def test_rank_layout_megatron_order():
    # TP fastest, then CP, DP, PP
    assert [(c.tp, c.cp, c.dp, c.pp) for c in (rank_coord(r, 2, 2, 2, 2) for r in (0, 1, 2, 4, 8))] == [
        (0, 0, 0, 0),
        (1, 0, 0, 0),
        (0, 1, 0, 0),
        (0, 0, 1, 0),
        (0, 0, 0, 1),
    ]
    # every rank of TP 8 x DP 8 x PP 2 gets its own coordinate, and the coordinate gives the rank back
    coords = [rank_coord(r, 8, 1, 8, 2) for r in range(128)]
    assert len({(c.tp, c.cp, c.dp, c.pp) for c in coords}) == 128
    assert all(c.rank == c.tp + 8 * (c.cp + 1 * (c.dp + 8 * c.pp)) for c in coords)
    c = rank_coord(77, 8, 1, 8, 2)
    assert (c.tp, c.cp, c.dp, c.pp) == (5, 0, 1, 1)
    c = rank_coord(13, 2, 2, 2, 2)
    assert (c.tp, c.cp, c.dp, c.pp) == (1, 0, 1, 1)


def test_placement_plan_nodes_and_engines():
    plan = placement_plan(
        _cfg(
            "--tensor-model-parallel-size",
            "8",
            "--pipeline-model-parallel-size",
            "2",
            "--rollout-num-gpus-per-engine",
            "4",
        )
    )
    assert (plan.world, plan.dp, plan.num_engines) == (128, 8, 32)
    assert plan.nodes[0].ranks == range(0, 8) and plan.nodes[0].pp_stages == (0,)
    assert plan.nodes[15].pp_stages == (1,) and plan.nodes[15].dp_replicas == (7,)
    assert plan.engines[3].gpus == range(12, 16) and plan.engines[3].nodes == (1,)
    assert plan.nodes[1].engines == (2, 3)


def test_lr_schedule_both_units():
    s = lr_schedule(_cfg())
    assert s.optimizer_steps_per_rollout_step == 16
    assert (s.warmup_rollout_steps, s.warmup_optimizer_steps) == (10, 160)
    s = lr_schedule(_cfg("--lr-warmup-rollout-steps", "none", "--lr-warmup-iters", "40", "--num-rollout", "2"))
    assert (s.warmup_rollout_steps, s.warmup_optimizer_steps, s.total_optimizer_steps) == (2.5, 40, 32)


def test_report_contents(arch):
    cfg = _cfg(
        "--tensor-model-parallel-size",
        "8",
        "--pipeline-model-parallel-size",
        "2",
        "--rollout-num-gpus-per-engine",
        "8",
        "--recompute-granularity",
        "full",
        "--recompute-method",
        "uniform",
        "--recompute-num-layers",
        "1",
        "--sequence-parallel",
    )
    text = dry_run_report(cfg, arch, "examples/qwen2.5-32b/config.json")
    assert isinstance(text, str)
    for needle in (
        "16 nodes x 8 GPUs = 128 GPUs",
        "TP 8 x PP 2 x CP 1 x DP 8",
        "node   0: ranks 0-7, PP stage 0",
        "node  15: ranks 120-127, PP stage 1",
        "16 engines",
        "engine  15: GPUs 120-127 (node 15)",
        "weights bf16",
        "4.1 GB",
        "grads fp32",
        "full recompute",
        "<- configured",
        "KV cache",
        "32 KiB per token",
        "H100 80GB",
        "H200 141GB",
        "10 rollout steps = 160 optimizer steps",
        "= 16",
        "examples/qwen2.5-32b/config.json",
        "fits",
    ):
        assert needle in text, f"{needle!r} missing from:\n{text}"
    assert "DOES NOT FIT" not in text


def test_report_warns_on_suspicious_settings(arch):
    cfg = _cfg(
        "--tensor-model-parallel-size",
        "8",
        "--use-distributed-optimizer",
        "false",
        "--rollout-num-gpus-per-engine",
        "16",
        "--max-tokens-per-gpu",
        "8192",
        "--lr-warmup-rollout-steps",
        "200",
        "--num-rollout",
        "50",
    )
    text = dry_run_report(cfg, arch)
    assert "DOES NOT FIT" in text
    for needle in (
        "without --use-distributed-optimizer",
        "spans two nodes",
        "a longest sample does not fit",
        "longer than the run",
        "does not fit an 80 GB GPU",
        "without --sequence-parallel",
    ):
        assert needle in text, f"{needle!r} missing from:\n{text}"


def test_report_validates_first(arch):
    with pytest.raises(ConfigError, match="--tensor-model-parallel-size 16"):
        dry_run_report(_cfg("--tensor-model-parallel-size", "16"), arch)  # 40 heads / 16
    with pytest.raises(ConfigError, match="global-batch-size"):
        dry_run_report(_cfg("--global-batch-size", "500"), arch)


def test_cpu_target_report():
    from tests.tiny import tiny_qwen2_config

    arch = parse_hf_config(tiny_qwen2_config())
    cfg = parse_args(
        [
            "--actor-num-gpus-per-node",
            "2",
            "--tensor-model-parallel-size",
            "2",
            "--rollout-batch-size",
            "4",
            "--n-samples-per-prompt",
            "4",
            "--global-batch-size",
            "8",
            "--rollout-engine",
            "hf",
            "--max-tokens-per-gpu",
            "512",
            "--max-prompt-length",
            "64",
            "--max-response-length",
            "64",
            "--overlong-buffer-length",
            "16",
        ]
    )
    text = dry_run_report(cfg, arch, "tiny")
    assert (
        "target: CPU (fp32)" in text
        and "1 nodes x 2 CPU workers = 2 CPU workers" in text
        and "optimizer steps per rollout step" in text
    )


def test_the_plan_says_what_one_step_off_bounded_and_their_controller_do(arch):
    def cpu(*extra):  # one-step-off runs on the CPU today (refused on GPUs)
        return parse_args(
            [
                "--hf-checkpoint",
                str(QWEN32B),
                "--max-prompt-length",
                "64",
                "--max-response-length",
                "64",
                "--overlong-buffer-length",
                "8",
                *extra,
            ]
        )

    text = dry_run_report(cpu(), arch, on_gpu=False)
    assert "async:" not in text
    text = dry_run_report(cpu("--async-mode", "one-step-off"), arch, on_gpu=False)
    assert "async: --async-mode one-step-off: the rollout of step n+1 runs while step n trains" in text
    assert "a lag of 1 (none across a checkpoint)" in text and "--tis-cap 2" in text
    text = dry_run_report(cpu("--async-mode", "one-step-off", "--staleness-control", "ess"), arch, on_gpu=False)
    assert "steered between 0 and 1 by each step's ESS / N and ratio tail (--staleness-control ess, low 0.6" in text
    text = dry_run_report(cpu("--async-mode", "bounded", "--max-staleness", "3"), arch, on_gpu=False)
    assert "async: --async-mode bounded: the engines generate up to 3 steps ahead of the trainer" in text
    assert "is regenerated; a lag of 3" in text
    text = dry_run_report(
        cpu("--async-mode", "bounded", "--max-staleness", "4", "--staleness-control", "ess"), arch, on_gpu=False
    )
    assert "steered between 0 and 4" in text


def test_the_plan_prints_both_pools_of_a_disaggregated_run(arch):
    """--rollout-placement disaggregated: the trainer's pool and the engines' own, the memory of
    each (from the same estimate as the colocated plan), the broadcast sync and the overlap."""
    from megatron_dapo.launch.memory_estimate import GB, GPU_CAPACITY_GB, estimate_memory

    flags = [
        "--hf-checkpoint",
        str(QWEN32B),
        *CLUSTER,
        "--rollout-placement",
        "disaggregated",
        "--rollout-num-gpus",
        "64",
        "--rollout-num-gpus-per-engine",
        "4",
    ]
    cfg = parse_args(flags + ["--async-mode", "bounded", "--max-staleness", "2"])
    text = dry_run_report(cfg, arch, on_gpu=True)
    mm = estimate_memory(cfg, arch, GPU_CAPACITY_GB["H100 80GB"])
    assert "the engines in a group of their own" in text and "engines 0-" not in text
    assert "trainer pool: the 128 GPUs above, nothing offloaded" in text
    assert f"training peak {mm.train_peak / GB:.1f} GB" in text
    assert "engine pool: --rollout-num-gpus 64 GPUs of their own = 16 engines x TP 4" in text
    assert "about 8 more node(s) of 8" in text and f"{mm.kv_tokens:,} KV tokens" in text
    assert "broadcasts it once to all 16 engines over one collective group they join (NCCL" in text
    assert "overlap: --async-mode bounded: the engines generate the next step(s) while the trainer trains" in text
    assert "launch order: 1. engines (SGLang TP4 x 16) on their own GPUs" in text
    assert "engines release" not in text  # nothing of the colocated switch
    sync_only = dry_run_report(parse_args(flags), arch, on_gpu=True)
    assert "overlap: none with --async-mode off" in sync_only
