"""Two-node placement on Ray's local multi-node test cluster; run in its own process.

Run by tests/launch/test_placement.py (``python tests/launch/multinode_check.py``) so the
cluster never meets a Ray instance the pytest process uses. Prints ``OK`` lines; exits
non-zero on the first failed check; always shuts the cluster down.
"""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from megatron_dapo.launch.placement import set_ray_start_env  # noqa: E402

set_ray_start_env()  # before Ray: its nodes' workers at the driver's priority, its waits (as start_ray)

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.placement_group import placement_group_table  # noqa: E402
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: E402

from megatron_dapo.launch.placement import (  # noqa: E402
    NODE_RESOURCE_PREFIX,
    PlacementError,
    bundle_node_ids,
    bundle_placements,
    create_placement_group,
    ranks_to_bundles,
    start_ray,
    wait_for_nodes,
)


@ray.remote
class Where:
    def node(self):
        ctx = ray.get_runtime_context()
        return ctx.get_node_id(), [str(g) for g in ray.get_gpu_ids()]


def main() -> int:
    t0 = time.time()
    os.environ.pop("RAY_ADDRESS", None)
    cluster = Cluster(initialize_head=False)
    try:
        # Ray gives a starting raylet 30 s to register (hard-coded); on a loaded machine retry once.
        for attempt in (1, 2):
            try:
                if not cluster.head_node:
                    cluster.add_node(
                        include_dashboard=False,
                        num_cpus=1,
                        num_gpus=1,
                        resources={NODE_RESOURCE_PREFIX + "nodeA": 1, "slot": 1},
                    )
                cluster.add_node(num_cpus=1, num_gpus=1, resources={NODE_RESOURCE_PREFIX + "nodeB": 1, "slot": 1})
                break
            except Exception as e:
                if attempt == 2:
                    raise
                print(f"retrying the cluster start after: {e}", file=sys.stderr)
                cluster.shutdown()
                cluster = Cluster(initialize_head=False)
        cluster.wait_for_nodes()
        info = start_ray(address=cluster.address)
        assert not info["reused"], info
        assert start_ray()["reused"]
        print(f"OK cluster up in {time.time() - t0:.1f} s: {info['resources'].get('GPU')} GPUs")

        wait_for_nodes(["nodeA", "nodeB"], gpus_per_node=1, timeout_s=20)
        try:
            wait_for_nodes(["nodeA", "nodeC"], gpus_per_node=1, timeout_s=1, poll_s=0.2)
            raise AssertionError("wait_for_nodes accepted a missing node")
        except PlacementError as e:
            assert "nodeC (not registered)" in str(e) and "nodeA" not in str(e).split("missing:")[1].split(";")[0], e
        print("OK wait_for_nodes names the missing node")
        cli = [
            sys.executable,
            "-m",
            "megatron_dapo.launch.placement",
            "wait-nodes",
            "--address",
            cluster.address,
            "--gpus-per-node",
            "1",
        ]
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        # the CLI's own --timeout bounds it; the subprocess timeout only guards against a hang
        ok = subprocess.run(
            cli + ["--nodes", "nodeA,nodeB", "--timeout", "30"], capture_output=True, text=True, cwd=root, timeout=120
        )
        assert ok.returncode == 0 and "all 2 node(s) registered" in ok.stdout, ok.stdout + ok.stderr
        bad = subprocess.run(
            cli + ["--nodes", "nodeA,nodeC", "--timeout", "2"], capture_output=True, text=True, cwd=root, timeout=120
        )
        assert bad.returncode == 1 and "nodeC (not registered)" in bad.stderr, bad.stdout + bad.stderr
        print("OK the wait-nodes CLI (used by the Slurm script) passes and fails fast naming nodeC")

        # one (fake) GPU per bundle, one bundle per node; default CPUs per GPU bundle = 1
        pg = create_placement_group(2, 1, strategy="STRICT_SPREAD", timeout_s=30)
        nodes = bundle_node_ids(pg)
        assert len(set(nodes)) == 2, nodes
        where = bundle_placements(pg, 1)
        assert [w["node_id"] for w in where] == nodes and all(len(w["gpu_ids"]) == 1 for w in where), where
        assert sorted(ranks_to_bundles(where)) == [0, 1]
        actors = [
            Where.options(
                num_cpus=1,
                num_gpus=1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
            ).remote()
            for i in range(2)
        ]
        got = ray.get([a.node.remote() for a in actors], timeout=60)
        assert got[0][0] != got[1][0], got
        assert [g[0] for g in got] == nodes, (got, nodes)
        assert all(len(g[1]) == 1 for g in got), got
        print(f"OK two actors on two nodes: {[g[0][:8] for g in got]}, GPU ids {[g[1] for g in got]}")
        for a in actors:
            ray.kill(a)
        ray.util.remove_placement_group(pg)

        # feasible by totals, but the slots are taken: must time out, name the request, remove itself
        hold = create_placement_group(2, 0, cpus_per_bundle=0.1, resources_per_bundle={"slot": 1}, strategy="SPREAD")
        try:
            create_placement_group(
                1, 0, cpus_per_bundle=0.1, resources_per_bundle={"slot": 1}, timeout_s=2, name="late"
            )
            raise AssertionError("a group without free slots was placed")
        except PlacementError as e:
            msg = str(e)
            assert "not placed within 2 s" in msg and "'slot': 1" in msg and "removed" in msg, msg
        states = [v["state"] for v in placement_group_table().values() if v["name"] == "late"]
        assert states and all(s == "REMOVED" for s in states), states
        ray.util.remove_placement_group(hold)
        print("OK a group that cannot be placed times out and is removed")
        print(f"OK all multi-node checks in {time.time() - t0:.1f} s")
        return 0
    finally:
        try:
            ray.shutdown()
        finally:
            cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
