"""Where each engine runs: on the GPUs of the ranks that feed it (same node, consecutive ids),
and the rank order of the bundles (by node address, then GPU id)."""

import pytest

from megatron_dapo.launch.placement import PlacementError, engine_gpu_plan, ranks_to_bundles


def _p(node, *gpus):
    return {"node_id": node, "gpu_ids": list(gpus)}


def test_engines_see_their_feeders_gpus_with_the_physical_base_id():
    # 2 nodes x 4 GPUs, engines of TP 2: the second engine of each node starts at GPU 2
    placements = [_p("a", 0), _p("a", 1), _p("a", 2), _p("a", 3), _p("b", 0), _p("b", 1), _p("b", 2), _p("b", 3)]
    plan = engine_gpu_plan(placements, 2)
    assert [(e["node_id"], e["base_gpu_id"], e["gpu_ids"], e["ranks"]) for e in plan] == [
        ("a", 0, [0, 1], [0, 1]),
        ("a", 2, [2, 3], [2, 3]),
        ("b", 0, [0, 1], [4, 5]),
        ("b", 2, [2, 3], [6, 7]),
    ]
    cpu = engine_gpu_plan([_p("a"), _p("a"), _p("b"), _p("b")], 2)
    assert [(e["node_id"], e["base_gpu_id"]) for e in cpu] == [("a", None), ("b", None)]


def test_engine_across_nodes_or_gaps_is_refused():
    with pytest.raises(PlacementError, match="span nodes"):
        engine_gpu_plan([_p("a", 0), _p("b", 0)], 2)
    with pytest.raises(PlacementError, match="consecutive"):
        engine_gpu_plan([_p("a", 0), _p("a", 2)], 2)
    with pytest.raises(PlacementError, match="distinct consecutive"):
        engine_gpu_plan([_p("a", 1), _p("a", 1)], 2)
    with pytest.raises(PlacementError, match="must divide"):
        engine_gpu_plan([_p("a", 0)] * 3, 2)


def test_an_engines_gpus_in_any_order_over_its_ranks():
    """Valid: the engine's ranks together hold the K consecutive ids b..b+K-1, in any order;
    SGLang's base_gpu_id is the smallest (TP rank j on b + j)."""
    plan = engine_gpu_plan([_p("a", 3), _p("a", 2), _p("a", 1), _p("a", 0)], 2)
    assert [(e["base_gpu_id"], e["gpu_ids"], e["ranks"]) for e in plan] == [(2, [2, 3], [0, 1]), (0, [0, 1], [2, 3])]
    # a node whose free GPUs are 4..7 (another job holds 0..3)
    assert [e["base_gpu_id"] for e in engine_gpu_plan([_p("a", 5), _p("a", 4), _p("a", 7), _p("a", 6)], 2)] == [4, 6]


def _b(ip, *gpus, node=None):
    return {"node_id": node or f"id-{ip}", "node_ip": ip, "gpu_ids": list(gpus)}


def test_ranks_follow_node_address_then_gpu_id():
    """Ray gives bundles in no promised order (nodes interleaved, GPU ids shuffled): ranks follow
    (node address, GPU id), so rank 0 is on the lowest address and the ranks of a node, in
    GPU order, are consecutive; engines of K ranks then get consecutive ascending GPUs."""
    bundles = [
        _b("10.0.0.10", 1),
        _b("10.0.0.9", 3),
        _b("10.0.0.10", 0),
        _b("10.0.0.9", 2),
        _b("10.0.0.9", 0),
        _b("10.0.0.10", 3),
        _b("10.0.0.9", 1),
        _b("10.0.0.10", 2),
    ]
    order = ranks_to_bundles(bundles)
    ranked = [(bundles[b]["node_ip"], bundles[b]["gpu_ids"][0]) for b in order]
    assert ranked == [("10.0.0.9", g) for g in range(4)] + [("10.0.0.10", g) for g in range(4)]  # 9 < 10 numerically
    plan = engine_gpu_plan([bundles[b] for b in order], 2)
    assert [(e["node_id"], e["gpu_ids"]) for e in plan] == [
        ("id-10.0.0.9", [0, 1]),
        ("id-10.0.0.9", [2, 3]),
        ("id-10.0.0.10", [0, 1]),
        ("id-10.0.0.10", [2, 3]),
    ]
    # CPU bundles (no GPU ids): by address, bundle order within a node
    assert ranks_to_bundles([_b("10.0.0.3"), _b("10.0.0.2"), _b("10.0.0.3"), _b("10.0.0.2")]) == [1, 3, 0, 2]
