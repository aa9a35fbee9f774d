"""The dry run's long-sequence plan: packing, CP and the longest sequence that fits (pure, CPU)."""

from pathlib import Path

import pytest

from megatron_dapo.config import parse_args
from megatron_dapo.launch.memory_estimate import GB, MARGIN_FRACTION, estimate_memory, longest_fitting_sequence
from megatron_dapo.launch.plan import dry_run_report
from megatron_dapo.models.hf_config import parse_hf_config

QWEN32B = Path(__file__).resolve().parents[2] / "examples" / "qwen2.5-32b"
BASE = [
    "--actor-num-nodes",
    "16",
    "--actor-num-gpus-per-node",
    "8",
    "--bf16",
    "--rollout-engine",
    "sglang",
    "--use-distributed-optimizer",
    "--tensor-model-parallel-size",
    "8",
    "--sequence-parallel",
    "--max-tokens-per-gpu",
    "22528",
    "--rollout-batch-size",
    "512",
    "--n-samples-per-prompt",
    "16",
    "--global-batch-size",
    "512",
    "--rollout-num-gpus-per-engine",
    "4",
    "--use-packing",
]


@pytest.fixture(scope="module")
def arch():
    return parse_hf_config(QWEN32B)


def test_longest_fitting_sequence_is_the_boundary(arch):
    cfg = parse_args(BASE)
    for cap in (80.0, 141.0):
        n = longest_fitting_sequence(cfg, arch, cap)
        limit = (1 - MARGIN_FRACTION) * cap * GB

        def peak(tokens):
            c = parse_args(BASE[:-3] + ["--max-tokens-per-gpu", str(tokens), "--use-packing"])
            return estimate_memory(c, arch, cap).train_peak

        assert peak(n) <= limit < peak(n + 1)


def test_cp_and_recompute_change_what_fits(arch):
    plain = longest_fitting_sequence(parse_args(BASE), arch, 80.0)
    cp2 = longest_fitting_sequence(parse_args(BASE + ["--context-parallel-size", "2"]), arch, 80.0)
    rec = longest_fitting_sequence(parse_args(BASE + ["--recompute-granularity", "full"]), arch, 80.0)
    assert plain < 22528 < cp2 < rec  # without recompute a 20k response needs CP 2 on 80 GB
    # the chunked logprob stage: the logits cost ~4 bytes per vocab entry, not a float32 copy per op
    m = estimate_memory(parse_args(BASE), arch, 80.0)
    assert m.logits < 22528 * (152064 // 8) * 6


def test_dry_run_says_whether_cp_is_needed(arch):
    out = dry_run_report(parse_args(BASE), arch, on_gpu=True)
    assert "micro-batches: packed (THD" in out
    assert "a 22528-token sequence does NOT fit at CP 1: raise --context-parallel-size" in out
    assert "does not fit an 80 GB GPU with 15% margin at CP 1" in out  # the warning too
    out = dry_run_report(
        parse_args(
            BASE + ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
        ),
        arch,
        on_gpu=True,
    )
    assert "H100 80GB: longest sequence" in out and "a 22528-token sequence fits at CP 1" in out
