"""Two Ray nodes on two network addresses that cannot reach each other's loopback, the driver on
a third: the trainers' process group must rendezvous on rank 0's node (driver/cluster.py).

Run by tests/launch/test_rendezvous.py as the only program of fresh PID, network and mount
namespaces (``unshare --pid --fork --mount-proc --net --mount``, under a user namespace when
not root), so that every process it starts, ``ray stop`` included, sees only its own
processes, and everything ends with the namespace::

    python tests/launch/rendezvous_check.py orchestrate WORK_DIR RAY_TEMP_DIR DRIVER_TIMEOUT_S

* ``orchestrate`` (inside the namespaces): a private tmpfs on /dev/shm (Ray's object store and
  the bucket buffers stay in the namespace); a bridge 10.231.0.1/24 and three network
  namespaces on it, one per Ray node: ``h`` 10.231.0.4 (the head, no CPUs: only the driver
  runs there), ``a`` 10.231.0.2 and ``b`` 10.231.0.3 (one CPU each: one trainer rank each).
  Each node's only interface is ``eth0`` (GLOO_SOCKET_IFNAME): a TCP port opened in one
  namespace is reachable from the others only at that namespace's address, as between hosts.
  Then the driver in ``h``; ``ray stop --force`` at the end, whatever happened.
* ``driver`` (in ``h``): a real ``Cluster`` of 2 ranks (TP 2, tiny Qwen2, gloo), then checks:
  rank 0 on the node with the lowest address; an all_reduce over the two nodes; megatron's
  TP forward (probe logprobs) across them. Prints ``OK`` lines.

A driver that gives the ranks its own address for the rendezvous (rank 0 is not on the driver's
node here) never brings the cluster up: the orchestrator stops it after DRIVER_TIMEOUT_S and
exits 3 saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

NODES = {"h": "10.231.0.4", "a": "10.231.0.2", "b": "10.231.0.3"}  # the head last in address order
BRIDGE = "10.231.0.1"
PORTS = dict(
    port=6379,
    node_manager=6380,
    object_manager=6381,
    metrics=6382,
    agent_grpc=6383,
    agent_listen=6384,
    runtime_env=6385,
)
WORKER_PORTS = (10002, 10200)  # none of PORTS in this range (Ray refuses overlaps)


def sh(*cmd, check=True, timeout=60, **kw):
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} -> {p.returncode}: {p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p


def net_ns_holder():
    """A process in a new network namespace (``sleep``); its pid names the namespace."""
    proc = subprocess.Popen(["unshare", "--net", "sleep", "100000"])
    mine = os.readlink("/proc/self/ns/net")
    for _ in range(200):
        try:
            if os.readlink(f"/proc/{proc.pid}/ns/net") != mine:
                return proc
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("unshare --net did not switch namespaces")


def in_ns(pid: int, *cmd):
    return ["nsenter", "-t", str(pid), "-n", *cmd]


def ray_env(temp: str) -> dict:
    from megatron_dapo.launch.placement import RAY_START_ENV

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_START_ENV)  # as examples/slurm/submit_dapo.sbatch exports them for `ray start`
    # the nodes' only interface; token auth off for head, workers and driver alike (docs/slurm.md)
    env.update(GLOO_SOCKET_IFNAME="eth0", RAY_TMPDIR=temp, RAY_AUTH_MODE="disabled", PYTHONPATH=ROOT)
    return env


def ray_start(pid: int, ip: str, temp: str, head: bool):
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    common = [
        "--node-ip-address",
        ip,
        "--node-manager-port",
        str(PORTS["node_manager"]),
        "--object-manager-port",
        str(PORTS["object_manager"]),
        "--metrics-export-port",
        str(PORTS["metrics"]),
        "--dashboard-agent-grpc-port",
        str(PORTS["agent_grpc"]),
        "--dashboard-agent-listen-port",
        str(PORTS["agent_listen"]),
        "--runtime-env-agent-port",
        str(PORTS["runtime_env"]),
        "--min-worker-port",
        str(WORKER_PORTS[0]),
        "--max-worker-port",
        str(WORKER_PORTS[1]),
        "--disable-usage-stats",
    ]
    if head:
        cmd = [
            ray,
            "start",
            "--head",
            "--port",
            str(PORTS["port"]),
            "--num-cpus",
            "0",
            "--num-gpus",
            "0",
            "--include-dashboard=false",
            "--temp-dir",
            temp,
        ] + common
    else:
        cmd = [
            ray,
            "start",
            "--address",
            f"{NODES['h']}:{PORTS['port']}",
            "--num-cpus",
            "1",
            "--num-gpus",
            "0",
        ] + common
    return sh(*in_ns(pid, *cmd), env=ray_env(temp), timeout=180, check=False)


def orchestrate(work: str, temp: str, driver_timeout: float) -> int:
    sh("mount", "-t", "tmpfs", "tmpfs", "/dev/shm")  # our own, gone with the namespace
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", "br0", "type", "bridge")
    sh("ip", "addr", "add", f"{BRIDGE}/24", "dev", "br0")
    sh("ip", "link", "set", "br0", "up")
    holders = {}
    try:
        for name, ip in NODES.items():
            h = holders[name] = net_ns_holder()
            sh("ip", "link", "add", f"v{name}", "type", "veth", "peer", "name", "eth0", "netns", str(h.pid))
            sh("ip", "link", "set", f"v{name}", "master", "br0", "up")
            sh(*in_ns(h.pid, "ip", "link", "set", "lo", "up"))
            sh(*in_ns(h.pid, "ip", "addr", "add", f"{ip}/24", "dev", "eth0"))
            sh(*in_ns(h.pid, "ip", "link", "set", "eth0", "up"))
        # a's loopback is not b's: a port opened on a's 127.0.0.1 is not seen from b
        print(f"OK three network namespaces: {NODES}", flush=True)
        t0 = time.time()
        for name in ("h", "a", "b"):
            for attempt in (1, 2):  # Ray gives a raylet 30 s to register; under load retry once
                p = ray_start(holders[name].pid, NODES[name], temp, head=name == "h")
                if p.returncode == 0:
                    break
                print(
                    f"ray start on {name} failed (attempt {attempt}): {p.stderr[-1500:]}", file=sys.stderr, flush=True
                )
                if attempt == 2:
                    return 2
        print(f"OK Ray nodes up in {time.time() - t0:.1f} s", flush=True)
        try:
            drv = subprocess.run(
                in_ns(
                    holders["h"].pid,
                    sys.executable,
                    os.path.abspath(__file__),
                    "driver",
                    work,
                    f"{NODES['h']}:{PORTS['port']}",
                ),
                env=ray_env(temp),
                timeout=driver_timeout,
                capture_output=True,
                text=True,
                cwd=work,
            )
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            print(out + err[-3000:], flush=True)
            print(
                f"FAIL: the driver did not bring the cluster up within {driver_timeout:g} s "
                "(the trainers' rendezvous never completed)",
                flush=True,
            )
            return 3
        print(drv.stdout + drv.stderr[-3000:], flush=True)
        return drv.returncode
    finally:
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        # only this PID namespace's processes are visible: this stops our Ray nodes, nobody else's
        subprocess.run([ray, "stop", "--force"], capture_output=True, timeout=120, env=ray_env(temp))
        for h in holders.values():
            h.kill()
            h.wait()


def allreduce_rank(actor_self):
    import torch
    import torch.distributed as dist

    from megatron_dapo.distributed import collective_device

    t = torch.tensor([float(dist.get_rank() + 1)], device=collective_device())
    dist.all_reduce(t)
    return float(t.item())


def node_ip(actor_self):
    import ray

    return ray.util.get_node_ip_address()


def driver(work: str, address: str) -> int:
    import math

    import ray

    from megatron_dapo.config import parse_args
    from megatron_dapo.driver.cluster import Cluster
    from megatron_dapo.launch.placement import start_ray
    from tests.e2e.fixtures import make_tiny_qwen2_dir

    t0 = time.time()
    hf = make_tiny_qwen2_dir(os.path.join(work, "hf"))
    start_ray(address=address, _node_ip_address=NODES["h"])
    assert ray.util.get_node_ip_address() == NODES["h"]
    cfg = parse_args(
        [
            "--hf-checkpoint",
            hf,
            "--tensor-model-parallel-size",
            "2",
            "--actor-num-nodes",
            "2",
            "--actor-num-gpus-per-node",
            "1",
            "--rollout-num-gpus-per-engine",
            "1",
            "--rollout-engine",
            "hf",
            "--micro-batch-size",
            "1",
            "--global-batch-size",
            "2",
            "--rollout-batch-size",
            "1",
            "--n-samples-per-prompt",
            "2",
        ]
    )
    cluster = Cluster(cfg, hf, hf)
    try:
        print(
            f"OK cluster of {cluster.world} ranks up in {time.time() - t0:.1f} s, rendezvous "
            f"{cluster.master_addr}:{cluster.master_port}",
            flush=True,
        )
        ips = ray.get([a.__ray_call__.remote(node_ip) for a in cluster.actors], timeout=120)
        assert ips == [NODES["a"], NODES["b"]], ips  # ranks by node address; rank 0 not on the driver's node
        assert cluster.master_addr == NODES["a"], cluster.master_addr
        print(f"OK rank r on {ips[0]}, {ips[1]} (by address), the driver on {NODES['h']}", flush=True)
        sums = ray.get([a.__ray_call__.remote(allreduce_rank) for a in cluster.actors], timeout=120)
        assert sums == [3.0, 3.0], sums
        print("OK all_reduce over the two nodes", flush=True)
        cluster.trainers.load_initial_weights()
        lp = cluster.probe_logprobs([[1, 2, 3, 4, 5]])
        assert len(lp) == 1 and len(lp[0]) == 4 and all(math.isfinite(x) for x in lp[0]), lp
        print("OK megatron TP 2 forward across the two nodes", flush=True)
        return 0
    finally:
        cluster.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "orchestrate":
        sys.exit(orchestrate(sys.argv[2], sys.argv[3], float(sys.argv[4])))
    sys.exit(driver(sys.argv[2], sys.argv[3]))
