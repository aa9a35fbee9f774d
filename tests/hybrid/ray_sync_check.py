"""Weight sync over Ray on a local two-node cluster; run in its own process by test_ray_sync.py.

``python tests/hybrid/ray_sync_check.py WORK_DIR TPxPP [TPxPP ...]``: two Ray nodes of 2 CPUs
(ray.cluster_utils.Cluster), 4 trainer ranks (2 per node), 2 HF engines of "2 GPUs" each,
built by the driver's own ``Cluster``. Checks, printing ``OK`` lines: each engine runs on the
node of the ranks that feed it; ``Cluster.sync`` fills both engines with exactly the
trainer's weights (megatron_to_hf of the gathered megatron tensors); the bytes Ray's object
store created during a sync stay below 1 MiB while the model is tens of MB (the buckets
travel as memory handles); re-syncing one restarted engine alone works. Each layout in turn on the same Ray cluster
(the driver's Cluster built and shut down per layout). Exits non-zero on the first failed
check; always shuts the cluster down.
"""

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from megatron_dapo.launch.placement import set_ray_start_env  # noqa: E402

set_ray_start_env()  # before Ray: its nodes' workers at the driver's priority, its waits (as start_ray)

import ray  # noqa: E402
import torch  # noqa: E402
from ray.cluster_utils import Cluster as RayTestCluster  # noqa: E402

OBJECT_STORE_BOUND = 2**20


def object_store_created_bytes() -> int:
    """Bytes ever created in the object stores of all nodes (Ray's own counter)."""
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    reply = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address))
    return int(reply.store_stats.cumulative_created_bytes)


def engine_state(handle) -> dict:
    def read(actor_self):
        e = actor_self.engine
        return {n: e.get_weight(n).clone() for n in e.expected_weight_names()}

    return ray.get(handle.__ray_call__.remote(read))


def node_of(handle) -> str:
    return ray.get(handle.__ray_call__.remote(lambda actor_self: ray.get_runtime_context().get_node_id()))


def check_layout(hf_dir: str, tp: int, pp: int, t0: float) -> None:
    """Every check of the module doc for one layout, on the Ray cluster already up."""
    from megatron_dapo.checkpoint.mapping import megatron_to_hf
    from megatron_dapo.config import parse_args
    from megatron_dapo.driver.cluster import Cluster
    from megatron_dapo.models.hf_config import parse_hf_config
    from megatron_dapo.rollout.payload import shared_memory_files

    cluster = None
    try:
        cfg = parse_args(
            [
                "--hf-checkpoint",
                hf_dir,
                "--tensor-model-parallel-size",
                str(tp),
                "--pipeline-model-parallel-size",
                str(pp),
                "--rollout-num-gpus-per-engine",
                "2",
                "--rollout-engine",
                "hf",
                "--actor-num-nodes",
                "2",
                "--actor-num-gpus-per-node",
                "2",
                "--micro-batch-size",
                "1",
                "--global-batch-size",
                "8",
                "--rollout-batch-size",
                "4",
                "--n-samples-per-prompt",
                "2",
                "--update-weight-buffer-size",
                str(4 * 2**20),
            ]
        )
        cluster = Cluster(cfg, hf_dir, hf_dir)
        print(f"OK TP {tp} x PP {pp}: cluster of {cluster.world} ranks up in {time.time() - t0:.1f} s")
        cluster.trainers.load_initial_weights()
        handles = [cluster.make_engine(i) for i in range(cluster.num_engines)]
        assert len(handles) == 2
        # each engine on its feeders' node, the two engines on different nodes
        ranks_nodes = [ray.get(a.placement.remote())["node_id"] for a in cluster.actors]
        engine_nodes = [node_of(h) for h in handles]
        assert engine_nodes[0] != engine_nodes[1], engine_nodes
        for e, plan in enumerate(cluster.engine_plan):
            assert engine_nodes[e] == plan["node_id"] == ranks_nodes[plan["ranks"][0]] == ranks_nodes[plan["ranks"][1]]
        print(f"OK engine e fed by ranks {[p['ranks'] for p in cluster.engine_plan]} on its own node")

        arch = parse_hf_config(hf_dir)
        want = {}
        for g, full in cluster.trainers.full_weights().items():
            for n, t in megatron_to_hf(arch, g, full):
                want[n] = t
        model_bytes = sum(t.numel() * t.element_size() for t in want.values())
        for k in range(2):
            before = object_store_created_bytes()
            out = cluster.sync(handles)
            through_store = object_store_created_bytes() - before
            assert out["bytes"] == model_bytes and out["buckets"] > 1, out
            assert through_store < OBJECT_STORE_BOUND < model_bytes, (through_store, model_bytes)
            print(
                f"OK sync {k}: {out['bytes']} bytes in {out['buckets']} buckets, {out['seconds']:.2f} s; "
                f"object store bytes per sync: {through_store}"
            )
        for e, h in enumerate(handles):
            got = engine_state(h)
            assert set(got) == set(want), set(got) ^ set(want)
            bad = [n for n in want if not torch.equal(got[n], want[n])]
            assert not bad, (e, bad[:5])
        print("OK every engine holds exactly the trainer's weights")
        # a restarted engine 1 is synced alone (the other ranks only take part in the collectives)
        ray.kill(handles[1])
        handles[1] = cluster.make_engine(1)
        cluster.sync([handles[1]])
        got = engine_state(handles[1])
        assert all(torch.equal(got[n], want[n]) for n in want)
        print("OK a restarted engine re-synced alone")
        # the feeders' bucket buffers are named shared-memory files: none may outlive the cluster

        pids = [i["pid"] for i in cluster.infos]
        held = sum(len(shared_memory_files(p)) for p in pids)
        assert held >= len(pids), f"expected each feeder to hold shared-memory buffers, found {held}"
        cluster.shutdown(handles)
        cluster = None
        deadline = time.time() + 30
        while any(os.path.exists(f"/proc/{p}") for p in pids) and time.time() < deadline:
            time.sleep(0.5)
        left = [f for p in pids for f in shared_memory_files(p)]
        assert not left, f"shared-memory files outlived the cluster: {left}"
        print(f"OK no shared-memory file outlived the cluster ({held} before shutdown)")
    finally:
        if cluster is not None:
            try:
                cluster.shutdown()
            except Exception:
                pass


def main(work: str, layouts: list) -> int:
    from megatron_dapo.launch.placement import start_ray
    from tests.e2e.fixtures import make_tiny_qwen2_dir

    t0 = time.time()
    hf_dir = make_tiny_qwen2_dir(os.path.join(work, "hf"))
    os.environ.pop("RAY_ADDRESS", None)
    rc = RayTestCluster(initialize_head=False)
    try:
        for attempt in (1, 2):  # a raylet has 30 s to register; on a loaded machine retry once
            try:
                if not rc.head_node:
                    rc.add_node(include_dashboard=False, num_cpus=2)
                rc.add_node(num_cpus=2)
                break
            except Exception as e:
                if attempt == 2:
                    raise
                print(f"retrying the cluster start after: {e}", file=sys.stderr)
                rc.shutdown()
                rc = RayTestCluster(initialize_head=False)
        rc.wait_for_nodes()
        start_ray(address=rc.address)
        for tp, pp in layouts:
            check_layout(hf_dir, tp, pp, t0)
        print("OK all ray sync checks")
        return 0
    finally:
        ray.shutdown()
        rc.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], [tuple(int(x) for x in a.split("x")) for a in sys.argv[2:]]))
