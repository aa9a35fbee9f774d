"""The dry run's mixture-of-experts accounting (launch/memory_estimate.py,
launch/weight_sync_plan.py), checked by hand for Qwen3-30B-A3B: the router replicated on every
TP rank, experts split over ETP x EP, the distributed optimizer's expert state over EDP, the
routed tokens' activations, and the weight sync's expert bytes per feeder, with an expert group
wider than a node sending part of them over the network. Pure, CPU."""

import pytest

from megatron_dapo.config import parse_args
from megatron_dapo.launch.config_warnings import plan_warnings
from megatron_dapo.launch.memory_estimate import _act_bytes_per_token_layer, estimate_memory, stage_params
from megatron_dapo.launch.plan import dry_run_report
from megatron_dapo.launch.weight_sync_plan import sync_plan
from megatron_dapo.models import parse_hf_config
from tests.moe.test_moe_config import QWEN3_30B_A3B

L, H, E, K, I = 48, 2048, 128, 8, 768
Q, KV = 32 * 128, 4 * 128
ATTN = H * Q + 2 * H * KV + Q * H  # q, k, v, o
EXPERTS = E * 3 * H * I  # one layer's experts


def _cfg(nodes=4, tp=2, ep=8, etp=1, pp=1, extra=()):
    return parse_args(
        [
            "--actor-num-nodes",
            str(nodes),
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
            "--rollout-num-gpus-per-engine",
            "4",
            "--tensor-model-parallel-size",
            str(tp),
            "--pipeline-model-parallel-size",
            str(pp),
            "--expert-model-parallel-size",
            str(ep),
            "--expert-tensor-parallel-size",
            str(etp),
            "--recompute-granularity",
            "full",
            *(["--sequence-parallel"] if tp > 1 else []),
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def arch():
    return parse_hf_config(QWEN3_30B_A3B)


def test_params_per_gpu_by_hand(arch):
    # per layer: attention / TP, norms (2 H + q/k norms) / TP, the router [E, H] whole, experts / (ETP x EP)
    layer = (ATTN + 2 * H + 2 * 128) // 2 + E * H + EXPERTS // 8
    emb = 152064 * H // 2  # vocab 151936 padded to a multiple of 128 x TP 2
    assert stage_params(arch, 2, 1, 128, 8) == [L * layer + 2 * emb + H]
    m = estimate_memory(_cfg(), arch)
    assert m.params_per_gpu == L * layer + 2 * emb + H
    assert (m.weights, m.grads) == (2 * m.params_per_gpu, 4 * m.params_per_gpu)
    experts = L * EXPERTS // 8
    # distributed optimizer: dense state over DP 16, expert state over EDP = 32 / (PP 1 x ETP 1 x EP 8) = 4
    assert m.optimizer == pytest.approx(12 * ((m.params_per_gpu - experts) / 16 + experts / 4))
    # at 8 nodes only the expert state's EDP (8) and the dense DP (32) change
    m8 = estimate_memory(_cfg(nodes=8), arch)
    assert m8.params_per_gpu == m.params_per_gpu
    assert m8.optimizer == pytest.approx(12 * ((m.params_per_gpu - experts) / 32 + experts / 8))


def test_moe_activations_count_the_routed_copies(arch):
    # TP 2 with sequence parallel, ETP 1: each rank holds 1/2 of the tokens; its EP group
    # processes ETP x tokens x top-k / TP routed copies per rank, each with its dispatched input
    # and combined output (2 H) and fc1 out + activation (3 I), bf16
    hid, tpp = _act_bytes_per_token_layer(arch, 2, True, 2, 1)
    assert hid == (4 * H * 2 + E * (2 + 4)) / 2
    assert tpp == ((3 * Q + 2 * KV) * 2 + K * (2 * H + 3 * I) * 2) / 2
    # ETP 2: each copy's input reaches both ETP ranks, the width is split between them
    _, tpp2 = _act_bytes_per_token_layer(arch, 2, True, 2, 2)
    assert tpp2 == ((3 * Q + 2 * KV) * 2 + K * (2 * H * 2 + 3 * I) * 2) / 2
    # the routed copies dominate: the old count (top-k x width only) was well under half of them
    assert K * (2 * H + 3 * I) > 2.5 * K * 3 * I
    m = estimate_memory(_cfg(), arch)
    assert m.activations_no_recompute == pytest.approx(22528 * L * (hid + tpp))


def test_sync_plan_expert_bytes_per_feeder(arch):
    sp = sync_plan(_cfg(), arch, "sglang")
    experts = L * EXPERTS * 2
    assert sp.bytes_per_feeder == arch.num_parameters * 2
    assert (sp.expert_bytes_per_feeder, sp.expert_group, sp.expert_cross_node_bytes) == (experts, 8, 0)
    assert sp.expert_gathered_bytes == experts * 7 // 8
    # same at 8 nodes: a feeder gathers its node's EP group, whatever the DP size
    sp8 = sync_plan(_cfg(nodes=8), arch, "sglang")
    assert (sp8.expert_bytes_per_feeder, sp8.expert_gathered_bytes, sp8.seconds) == (
        sp.expert_bytes_per_feeder,
        sp.expert_gathered_bytes,
        sp.seconds,
    )


def test_expert_group_wider_than_a_node(arch):
    """EP 16 on 8-GPU nodes: half of each feeder's gathered experts cross the network, the sync
    estimate grows, and the plan warns that every MoE layer's all-to-all crosses nodes."""
    near, far = _cfg(ep=8), _cfg(ep=16)
    sp = sync_plan(far, arch, "sglang")
    experts = L * EXPERTS * 2
    assert sp.expert_group == 16 and sp.expert_cross_node_bytes == experts // 2
    # those bytes move at the inter-node figure (40 GB/s) instead of NVLink's (200 GB/s)
    assert sp.seconds == pytest.approx(sync_plan(near, arch, "sglang").seconds + experts / 2 * (1 / 40e9 - 1 / 200e9))
    w = plan_warnings(far, arch, on_gpu=True)
    assert any("= 16 > --actor-num-gpus-per-node 8" in x and "crosses nodes" in x for x in w), w
    assert not any("crosses nodes" in x for x in plan_warnings(near, arch, on_gpu=True))
    report = dry_run_report(far, arch, on_gpu=True)
    assert "29.0 GB of it from other nodes" in report
    assert "(within the node)" in dry_run_report(near, arch, on_gpu=True)


def test_distributed_optimizer_shards_dense_state_over_dp_times_cp(arch):
    """megatron-core's distributed optimizer shards dense state over its dp_cp group: at CP 2
    the dense part of a GPU's Adam state is half of what DP alone would give; experts stay on EDP."""
    from pathlib import Path

    dense = parse_hf_config(Path(__file__).resolve().parents[2] / "examples" / "qwen2.5-32b")
    one, two = (
        _cfg(nodes=16, tp=8, ep=1, etp=8),
        _cfg(nodes=16, tp=8, ep=1, etp=8, extra=["--context-parallel-size", "2"]),
    )
    m1, m2 = estimate_memory(one, dense), estimate_memory(two, dense)
    assert m1.params_per_gpu == m2.params_per_gpu
    assert m1.optimizer == pytest.approx(12 * m1.params_per_gpu / 16)  # DP 16
    assert m2.optimizer == pytest.approx(12 * m2.params_per_gpu / (8 * 2))  # DP 8 x CP 2
    assert "(sharded over DP 8 x CP 2)" in dry_run_report(two, dense, on_gpu=True)
    # MoE at CP 2: dense part over DP 8 x CP 2 = 16, experts over EDP = 32 / 8 = 4
    m = estimate_memory(_cfg(extra=["--context-parallel-size", "2"]), arch)
    experts = L * EXPERTS // 8
    assert m.optimizer == pytest.approx(12 * ((m.params_per_gpu - experts) / 16 + experts / 4))
    assert "(dense sharded over DP 16, experts over EDP 4)" in dry_run_report(_cfg(), arch, on_gpu=True)
