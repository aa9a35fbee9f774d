"""Ray placement: local group, fast failure of impossible groups, two-node placement (subprocess)."""

import os
import sys
from pathlib import Path

import pytest
import ray

from megatron_dapo.launch.placement import PlacementError, _infeasible_reason, default_cpus_per_bundle, missing_nodes
from tests.launch.procs import RAY_SHUTDOWN_GRACE_S, private_ray_tmpdir, run_in_session

HERE = Path(__file__).resolve().parent


def _node(host, cpu, gpu=0, ip="10.0.0.9", **extra):
    return {
        "NodeManagerHostname": host,
        "NodeManagerAddress": ip,
        "Alive": True,
        "Resources": {"CPU": cpu, "GPU": gpu, **extra},
    }


def test_default_cpus_per_bundle():
    one = [_node("n1", 2)]
    assert default_cpus_per_bundle(2, 0, one) == 1
    assert default_cpus_per_bundle(1, 0, one) == 2
    assert default_cpus_per_bundle(4, 0, one) == 0.5  # fractional when fewer CPUs than bundles
    assert default_cpus_per_bundle(3, 0, one) == 0.66
    # 3 + 1 CPUs, 2 bundles: floor(4/2) = 2 does not fit node n2 -> 1
    assert default_cpus_per_bundle(2, 0, [_node("n1", 3), _node("n2", 1)]) == 1
    # GPU bundles: 1 CPU, or the CPUs per GPU when fewer
    assert default_cpus_per_bundle(16, 1, [_node("n1", 64, 8), _node("n2", 64, 8)]) == 1
    assert default_cpus_per_bundle(8, 1, [_node("n1", 4, 8)]) == 0.5
    with pytest.raises(PlacementError):
        default_cpus_per_bundle(0, 0, one)


def test_infeasible_reasons():
    nodes = [_node("n1", 8, 8), _node("n2", 8, 8)]
    assert _infeasible_reason([{"GPU": 1, "CPU": 1}] * 16, "PACK", nodes) is None
    assert "need 17 GPU" in _infeasible_reason([{"GPU": 1}] * 17, "PACK", nodes)
    assert "fits on no single node" in _infeasible_reason([{"GPU": 9}], "PACK", nodes)
    assert "STRICT_SPREAD needs 3 distinct nodes" in _infeasible_reason([{"GPU": 1}] * 3, "STRICT_SPREAD", nodes)
    assert "STRICT_PACK needs 9 GPU on one node" in _infeasible_reason([{"GPU": 1}] * 9, "STRICT_PACK", nodes)


def test_missing_nodes_by_hostname_tag_or_ip():
    nodes = [
        _node("gpu001.cluster", 64, 8, ip="10.0.0.1"),
        _node("gpu002", 64, 4),
        _node("x3", 8, 0, **{"slurm_node:gpu003": 1}),
    ]
    assert missing_nodes(["gpu001", "gpu003"], 0, nodes) == []
    assert missing_nodes(["gpu001", "gpu002", "gpu004"], 8, nodes) == [
        "gpu002 (registered with 4 of 8 GPUs)",
        "gpu004 (not registered)",
    ]
    assert missing_nodes(["10.0.0.1"], 8, nodes) == []


@pytest.fixture(scope="module")
def local_ray():
    """Reuse a Ray that another test of the session started, else start a small local one."""
    from megatron_dapo.launch.placement import start_ray

    was = ray.is_initialized()
    info = start_ray(num_cpus=2)
    assert info["reused"] == was
    assert start_ray()["reused"] is True  # idempotent
    yield info
    if not was:
        ray.shutdown()


def test_local_placement(local_ray):
    from megatron_dapo.launch.placement import (
        bundle_node_ids,
        bundle_placements,
        create_placement_group,
        on_bundle,
        ranks_to_bundles,
    )

    pg = create_placement_group(2, 0, cpus_per_bundle=0.25, timeout_s=30)
    try:
        nodes = bundle_node_ids(pg)
        assert len(nodes) == 2 and len(set(nodes)) == 1
        where = bundle_placements(pg, 0)
        assert [w["node_id"] for w in where] == nodes and all(w["gpu_ids"] == [] for w in where)
        assert ranks_to_bundles(where) == [0, 1]  # one node, no GPUs: bundle order
        port = on_bundle(pg, 1)["port"]
        assert 0 < port < 65536

        @ray.remote(num_cpus=0.25)
        def where():
            return ray.get_runtime_context().get_node_id()

        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        got = ray.get(
            [
                where.options(
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)
                ).remote()
                for i in range(2)
            ],
            timeout=60,
        )
        assert got == nodes
    finally:
        ray.util.remove_placement_group(pg)


def test_impossible_placement_fails_fast_with_message(local_ray):
    from megatron_dapo.launch.placement import create_placement_group

    with pytest.raises(PlacementError) as e:
        create_placement_group(4, 8, timeout_s=60)  # 32 GPUs on a CPU machine
    msg = str(e.value)
    assert "not placed within" not in msg, msg  # refused as infeasible up front, not after the 60 s wait
    assert "4 bundle(s)" in msg and "'GPU': 8.0" in msg and "cluster has" in msg and "alive node" in msg, msg
    with pytest.raises(PlacementError, match="STRICT_SPREAD needs 2 distinct nodes"):
        create_placement_group(2, 0, cpus_per_bundle=0.1, strategy="STRICT_SPREAD")


@pytest.mark.slow
def test_two_node_placement_in_subprocess():
    """STRICT_SPREAD over ray.cluster_utils.Cluster's two nodes; timeouts; node waits."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    # the script's own session (Ray's daemons and the wait-nodes client included): whatever
    # still runs once it has had time to shut its cluster down is ended
    with private_ray_tmpdir() as ray_tmp:
        done = run_in_session(
            [sys.executable, str(HERE / "multinode_check.py")],
            timeout=240,
            grace_s=RAY_SHUTDOWN_GRACE_S,
            env={**env, "RAY_TMPDIR": ray_tmp},
        )
    proc, stdout, stderr, left = done, done.stdout, done.stderr, done.leftovers
    out = stdout + stderr
    assert proc.returncode == 0, out[-4000:]
    assert not left, f"multinode_check.py left processes running: {left}"
    assert "OK two actors on two nodes" in stdout and "OK all multi-node checks" in stdout, out[-4000:]
