"""Where each engine runs: on the GPUs of the ranks that feed it (same node, consecutive ids)."""

import pytest

from megatron_dapo.launch.placement import PlacementError, engine_gpu_plan


def _p(node, *gpus):
    return {"node_id": node, "gpu_ids": list(gpus)}


def test_engines_see_their_feeders_gpus_with_the_physical_base_id():
    # 2 nodes x 4 GPUs, engines of TP 2: the second engine of each node starts at GPU 2
    placements = [_p("a", 0), _p("a", 1), _p("a", 2), _p("a", 3), _p("b", 0), _p("b", 1), _p("b", 2), _p("b", 3)]
    plan = engine_gpu_plan(placements, 2)
    assert [(e["node_id"], e["base_gpu_id"], e["gpu_ids"], e["ranks"]) for e in plan] == [
        ("a", 0, [0, 1], [0, 1]), ("a", 2, [2, 3], [2, 3]), ("b", 0, [0, 1], [4, 5]), ("b", 2, [2, 3], [6, 7])]
    cpu = engine_gpu_plan([_p("a"), _p("a"), _p("b"), _p("b")], 2)
    assert [(e["node_id"], e["base_gpu_id"]) for e in cpu] == [("a", None), ("b", None)]


def test_engine_across_nodes_or_gaps_is_refused():
    with pytest.raises(PlacementError, match="span nodes"):
        engine_gpu_plan([_p("a", 0), _p("b", 0)], 2)
    with pytest.raises(PlacementError, match="consecutive"):
        engine_gpu_plan([_p("a", 0), _p("a", 2)], 2)
    with pytest.raises(PlacementError, match="must divide"):
        engine_gpu_plan([_p("a", 0)] * 3, 2)
