"""The dry run's weight-sync plan: who feeds which engine on which node, bytes, expected time."""

import subprocess
import sys
from pathlib import Path

import pytest

from megatron_dapo.config import parse_args
from megatron_dapo.launch.memory_estimate import GB
from megatron_dapo.launch.plan import dry_run_report
from megatron_dapo.launch.weight_sync_plan import ENGINE_COPY_GBPS, INTER_NODE_GBPS, INTRA_NODE_GBPS, sync_plan
from megatron_dapo.models.hf_config import parse_hf_config

ROOT = Path(__file__).resolve().parents[2]
QWEN32B = ROOT / "examples" / "qwen2.5-32b"
CLUSTER = [
    "--actor-num-nodes",
    "16",
    "--actor-num-gpus-per-node",
    "8",
    "--bf16",
    "--rollout-engine",
    "sglang",
    "--use-distributed-optimizer",
    "--rollout-num-gpus-per-engine",
    "4",
]


@pytest.fixture(scope="module")
def arch():
    return parse_hf_config(QWEN32B)


def test_engines_fed_by_their_own_gpus_on_their_node(arch):
    sp = sync_plan(parse_args(CLUSTER + ["--tensor-model-parallel-size", "8"]), arch, "sglang")
    assert len(sp.feeds) == 32
    assert [(f.engine, f.node, list(f.feeders)) for f in sp.feeds[:3]] == [
        (0, 0, [0, 1, 2, 3]),
        (1, 0, [4, 5, 6, 7]),
        (2, 1, [8, 9, 10, 11]),
    ]
    assert sp.feeds[-1].node == 15 and list(sp.feeds[-1].feeders) == [124, 125, 126, 127]
    assert sp.bytes_per_feeder == arch.num_parameters * 2  # bf16: every feeder holds the whole model
    assert all(f.cross_node_bytes == 0 for f in sp.feeds)  # PP 1: nothing crosses nodes
    want = sp.bytes_per_feeder / (INTRA_NODE_GBPS * GB) + sp.bytes_per_feeder / (ENGINE_COPY_GBPS * GB)
    assert sp.seconds == pytest.approx(want)
    assert sp.buffers == 3 and sync_plan(parse_args(CLUSTER), arch, "hf").buffers == 2


def test_pp_stages_on_other_nodes_cross_the_network(arch):
    # PP 2 over 16 nodes: stage 0 on nodes 0-7, stage 1 on nodes 8-15: each feeder receives the
    # other stage's bytes over the network, which dominates the estimate
    cfg = parse_args(CLUSTER + ["--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "2"])
    sp = sync_plan(cfg, arch)
    cross = [f.cross_node_bytes for f in sp.feeds]
    assert all(0.4 * sp.bytes_per_feeder < c < 0.6 * sp.bytes_per_feeder for c in cross), cross
    assert sp.seconds > cross[0] / (INTER_NODE_GBPS * GB)


def test_engine_spanning_nodes_is_flagged(arch):
    cfg = parse_args(
        [
            "--actor-num-nodes",
            "2",
            "--actor-num-gpus-per-node",
            "6",
            "--bf16",
            "--rollout-engine",
            "sglang",
            "--rollout-num-gpus-per-engine",
            "4",
            "--tensor-model-parallel-size",
            "4",
            "--use-distributed-optimizer",
            "--global-batch-size",
            "12",
            "--rollout-batch-size",
            "6",
            "--n-samples-per-prompt",
            "2",
        ]
    )
    sp = sync_plan(cfg, arch)
    assert [f.node for f in sp.feeds] == [0, None, 1]
    report = dry_run_report(cfg, arch, on_gpu=True)
    assert "SPANS NODES" in report and "an engine would span nodes" in report


def test_qwen32b_dry_run_prints_the_sync_plan():
    out = subprocess.run(
        ["bash", str(ROOT / "examples" / "run_qwen32b.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "--- weight sync plan" in text
    assert "engine   0 (node 0) <- ranks 0-3: 65.5 GB per feeder" in text
    assert "expected sync:" in text and f"{INTRA_NODE_GBPS:.0f} GB/s intra-node" in text
