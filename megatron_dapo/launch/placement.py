"""Ray placement: start or join a cluster, one placement group over every GPU, node waits.

* :func:`start_ray` joins ``address`` / ``$RAY_ADDRESS`` or starts a local cluster, and
  reuses a Ray that is already initialised in this process. A local start waits longer than
  Ray's defaults (:data:`RAY_START_ENV`), retries once after a clean shutdown when the node does
  not come up (a busy machine: Ray's raylet aborts when its dashboard agent has not reported
  within a fixed 15 s), and otherwise raises :class:`~megatron_dapo.errors.StartupError`, one
  line naming the cause and what to try.
* :func:`create_placement_group` asks for ``num_bundles`` bundles (one per GPU on a cluster,
  one per worker process in the CPU demo) and waits at most ``timeout_s``: a group that
  cannot be placed is removed and a :class:`PlacementError` names what was requested and
  what the cluster has, instead of Ray's silent, endless pending state. Requests that no
  node set could ever satisfy fail at once, without waiting.
* :func:`bundle_placements` / :func:`ranks_to_bundles`: where each bundle landed (node id,
  node address, GPU ids: one tiny task per bundle), and the order of bundles by (node
  address, GPU id) that ranks follow (Ray promises neither that bundle ``i`` and ``i + 1``
  share a node nor any order of GPU ids); :func:`on_bundle`: the same on one bundle, with a
  port that is free on its node (the rendezvous of rank 0, driver/cluster.py).
* :func:`engine_gpu_plan`: each engine on its feeding ranks' GPUs.
* :func:`wait_for_nodes` (and ``python -m megatron_dapo.launch.placement wait-nodes``): block
  until every expected node has registered its GPUs, else fail naming the missing nodes;
  the Slurm script calls it between ``ray start`` and the driver.

Tested with Ray 2.60 (see docs/slurm.md for the pin); Ray is imported inside functions.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import ipaddress
import math
import os
import signal
import sys
import tempfile
import threading
import time
from typing import Dict, Iterable, List, Optional, Sequence

from ..errors import StartupError
from . import ray_reaper

#: Custom resource the Slurm script gives every node: ``slurm_node:<hostname>``.
NODE_RESOURCE_PREFIX = "slurm_node:"
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


class PlacementError(RuntimeError):
    """A placement group or node set that the cluster cannot provide."""


def start_ray(address: Optional[str] = None, num_cpus: Optional[float] = None, **init_kwargs) -> dict:
    """Connect to ``address`` (or ``$RAY_ADDRESS``), else start a local cluster; idempotent.

    Returns ``{"address", "reused", "resources"}``. ``num_cpus`` only applies to a new local
    cluster (Ray refuses it when joining one). Dashboard off, worker logs not forwarded to
    the driver.
    """
    set_ray_start_env()  # before Ray's first import in this process (see RAY_START_ENV)
    import ray  # Ray only inside the functions: launch/ imports nothing heavy (launch/__init__.py)

    if ray.is_initialized():
        return {"address": _gcs_address(), "reused": True, "resources": ray.cluster_resources()}
    address = address or os.environ.get("RAY_ADDRESS") or None
    kw = dict(include_dashboard=False, log_to_driver=False)
    kw.update(init_kwargs)
    if address and address != "local":
        try:
            with keep_sigterm_handler(ray):
                ray.init(address=address, **kw)
        except Exception as e:
            token = os.path.expanduser("~/.ray/auth_token")
            if os.environ.get("RAY_AUTH_MODE") is None and os.path.exists(token):
                # Ray 2.60: `ray start --head` enables token auth when this file exists, an explicit
                # address does not: the connection is refused as unauthenticated (docs/slurm.md).
                raise ConnectionError(
                    f"could not connect to Ray at {address} ({e}); RAY_AUTH_MODE is unset and {token} exists: "
                    "if the cluster was started with token authentication, export RAY_AUTH_MODE=token "
                    "(and the cluster's RAY_AUTH_TOKEN) on the driver as well"
                ) from e
            raise
    else:
        if num_cpus is not None:
            kw["num_cpus"] = num_cpus
        _init_local(ray, kw)
    return {"address": _gcs_address(), "reused": False, "resources": ray.cluster_resources()}


#: The environment of a local Ray start: Ray's waits for the node, raised from its defaults so that
#: a busy machine (a shared login node, a loaded CI runner) still starts it; its workers' priority;
#: their CPU allocator. Ray's C++ side reads them from the environment once per process, so
#: :func:`start_ray` sets them before Ray is imported here; the GCS, the raylet and the workers
#: inherit them. A value already in the environment wins.
RAY_START_ENV = {
    # the driver's wait for its raylet to register with the GCS (Ray: 30 s)
    "RAY_raylet_start_wait_time_s": "120",
    # an agent's registration with its raylet (Ray: 30 s; newer releases also use it for the
    # dashboard agent's port files, which Ray 2.60 waits for 15 s, fixed)
    "RAY_agent_register_timeout_ms": "120000",
    # Ray starts its workers at nice 15, so that its own daemons stay responsive; but the trainer
    # and engine actors are the job: at nice 15 a busy loop at nice 0 takes ~97% of their core
    # (kernel weights 36 vs 1024), and a one-step tiny run with 4 busy loops on 2 cores did not
    # finish in 15 minutes (docs/benchmarks-log.md, "Suite time on an AMD EPYC")
    "RAY_worker_niceness": "0",
    # PyTorch's CPU allocator backs every allocation of 2 MiB or more with transparent huge pages
    # (madvise), read once per process: the trainer and engine actors inherit it from the raylet.
    # A tiny CPU run's trainer otherwise takes ~3M page faults on its vocab-sized logits
    # (8.4 s of system time of 21 s; with it 234k and 3.2 s; docs/benchmarks-log.md, "Page faults").
    # A machine without THP ignores it; GPU memory and pinned host memory do not use this allocator.
    "THP_MEM_ALLOC_ENABLE": "1",
}
#: Attempts at a local start; the second comes after a clean shutdown of the first.
RAY_START_ATTEMPTS = 2


def set_ray_start_env(environ=os.environ) -> Dict[str, str]:
    """Put :data:`RAY_START_ENV` into ``environ`` where unset; returns what is in force."""
    for k, v in RAY_START_ENV.items():
        environ.setdefault(k, v)
    return {k: environ[k] for k in RAY_START_ENV}


@contextlib.contextmanager
def keep_sigterm_handler(ray):
    """Keep the caller's SIGTERM handler in force while ``ray.init`` runs.

    ``ray.init`` (2.60, ``worker.py``) first installs a handler of its own that raises
    ``SystemExit`` wherever the main thread happens to be, and a SIGTERM in its 5-10 s start can
    land where such an exception is only printed and dropped (seen: in ``logging``'s fork hook,
    "Exception ignored in ... _releaseLock"): the signal is lost and the run goes on to finish a
    step. With the caller's handler in force the caller at least learns of it (the driver's sets a
    flag that it checks right after the start, ``driver/signals.py``). A default or ignored
    disposition, or a call outside the main thread, leaves Ray's behaviour as it is."""
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    ours = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    if not callable(ours) or utils is None or not hasattr(utils, "set_sigterm_handler"):
        yield
        return
    ray_setter = utils.set_sigterm_handler
    utils.set_sigterm_handler = lambda handler: None  # Ray's own is not installed; ``ours`` stays
    try:
        yield
    finally:
        utils.set_sigterm_handler = ray_setter
        if signal.getsignal(signal.SIGTERM) is not ours:  # anything else that replaced it meanwhile
            signal.signal(signal.SIGTERM, ours)


@contextlib.contextmanager
def lean_local_head(ray, log_to_driver: bool):
    """While ``ray.init`` starts a local node, leave out two head processes that such a node does
    not use: the autoscaler's monitor (one node, nothing to scale; ``ray start --no-monitor``) and,
    when worker logs are not forwarded to the driver (``log_to_driver=False``, the driver's
    default), the log monitor, whose only reader that is. Each polls for the life of the cluster:
    measured over the test suite, 0.9 and 2.8 CPU-s per local start (docs/benchmarks.md). The
    raylet, its agents, the GCS and the API server start as before. ``ray.init`` has no argument
    for either, so its ``RayParams`` gets them as defaults (Ray 2.60, ``_private/parameter.py``;
    a Ray without that class starts its node as it always did)."""
    params = getattr(getattr(getattr(ray, "_private", None), "parameter", None), "RayParams", None)
    if not isinstance(params, type):
        yield
        return
    init = params.__init__

    def lean_init(self, *args, **kwargs):
        kwargs.setdefault("no_monitor", True)
        if not log_to_driver:
            kwargs.setdefault("include_log_monitor", False)
        init(self, *args, **kwargs)

    params.__init__ = lean_init
    try:
        yield
    finally:
        params.__init__ = init


def _init_local(ray, kw: dict, attempts: int = RAY_START_ATTEMPTS, pause_s: float = 5.0) -> None:
    """``ray.init(address="local")``, tried ``attempts`` times with a clean ``ray.shutdown()``
    between tries; a node that never comes up is one :class:`StartupError` line."""
    started = time.monotonic()
    for attempt in range(1, attempts + 1):
        before = _child_pids()
        try:
            with keep_sigterm_handler(ray), lean_local_head(ray, log_to_driver=bool(kw.get("log_to_driver", True))):
                ray.init(address="local", **kw)  # never join a stray cluster by accident
            ray_reaper.watch(_child_pids() - before)  # the node ends with this driver, however it ends
            return
        except (TypeError, ValueError):
            raise  # our own arguments: a bug, not the machine
        except BaseException as e:  # Ray raises a bare Exception when the node times out during startup
            _end_half_started(ray, before)
            if not isinstance(e, Exception):
                raise  # SIGTERM / Ctrl-C during the start: nothing of it left running, then the caller's cleanup
            cause = _local_start_failure(e)
            if attempt < attempts:
                print(
                    f"[ray] the local Ray node did not start ({cause}); retrying after a clean shutdown "
                    f"(attempt {attempt + 1} of {attempts})",
                    file=sys.stderr,
                    flush=True,
                )
                time.sleep(pause_s)
                continue
            raise StartupError(
                f"the local Ray node did not start in {attempts} attempts ({time.monotonic() - started:.0f} s; "
                f"{cause}; {_machine_load()}): run again when the machine is less busy, or start Ray "
                f"yourself (`ray start --head`) and pass its address in RAY_ADDRESS"
            ) from e


def _end_half_started(ray, before: set) -> None:
    """End what a failed or interrupted ``ray.init`` left running (its GCS, raylet, dashboard,
    agents, monitors): Ray's shutdown knows no node that failed to start, and a raylet that is
    still starting spawns its agents while the shutdown runs; those then leave this process's
    tree and, their GCS gone, wait out a 60 s report timeout before they exit (measured: 70 s
    after a SIGTERM during the start). So the new processes are first frozen (SIGSTOP, again
    until no new one appears: a stopped process spawns nothing), then killed, and only then is
    the driver's side shut down."""
    _end_processes(_freeze_new(before), grace_s=0.0)
    try:
        ray.shutdown()
    except Exception:  # pragma: no cover - best effort on a half-started node
        pass
    _end_processes(_child_pids() - before)


def _child_pids() -> set:
    import psutil  # a dependency of ray[default]

    try:
        return {c.pid for c in psutil.Process().children(recursive=True)}
    except psutil.Error:  # pragma: no cover
        return set()


def _freeze_new(before: set, rounds: int = 20) -> set:
    """SIGSTOP every descendant of this process that is not in ``before``, again until a listing
    finds no new one (at most ``rounds``); returns the stopped pids."""
    stopped: set = set()
    for _ in range(rounds):
        new = _child_pids() - before - stopped
        if not new:
            break
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        stopped |= new
    return stopped


def _end_processes(pids: Iterable[int], grace_s: float = 10.0) -> None:
    """TERM, then KILL after ``grace_s`` (at once where it is 0), the processes a failed
    ``ray.init`` started; stopped ones are continued after the TERM so that they can act on it."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            continue
    if grace_s > 0:
        for p in procs:
            try:
                p.terminate()
                p.resume()
            except psutil.Error:
                pass
        _, procs = psutil.wait_procs(procs, timeout=grace_s)
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=max(grace_s, 10.0))


def _machine_load() -> str:
    try:
        return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    except OSError:  # pragma: no cover - no load average on this platform
        return f"{os.cpu_count()} cores"


def _local_start_failure(exc: BaseException, temp_dir: Optional[str] = None) -> str:
    """Why a local node did not come up, in a few words: the raylet's own abort line when its
    log has one (the newest session under Ray's temp dir), else Ray's message."""
    root = temp_dir or os.environ.get("RAY_TMPDIR") or os.path.join(tempfile.gettempdir(), "ray")
    sessions = sorted(glob.glob(os.path.join(root, "session_2*")), key=os.path.getmtime)
    if sessions:
        log = os.path.join(sessions[-1], "logs", "raylet.out")
        try:
            with open(log, errors="replace") as f:
                fatal = [line for line in f if " C " in line[:40] or "Check failed" in line]
        except OSError:
            fatal = []
        if fatal:
            line = fatal[-1]
            if "metrics_agent_port" in line or "dashboard_agent" in line or "WaitForDashboardAgent" in line:
                return "its raylet aborted: the dashboard agent did not report its ports within Ray's fixed 15 s"
            if "runtime_env_agent" in line:
                return "its raylet aborted: the runtime-env agent did not report its port in time"
            text = line.split("Check failed:", 1)[-1] if "Check failed:" in line else line.split(")", 1)[-1]
            return "its raylet aborted: " + " ".join(text.split())[:160]
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _gcs_address() -> Optional[str]:
    import ray  # lazy: Ray

    try:
        return ray.get_runtime_context().gcs_address
    except Exception:  # pragma: no cover - older Ray
        return None


def alive_nodes() -> List[dict]:
    import ray  # lazy: Ray

    return [n for n in ray.nodes() if n.get("Alive", n.get("alive"))]


def _node_summary(nodes: Sequence[dict]) -> str:
    parts = []
    for n in nodes:
        res = n.get("Resources", {})
        parts.append(
            f"{n.get('NodeManagerHostname') or n.get('NodeManagerAddress')} (CPU {res.get('CPU', 0):g}, "
            f"GPU {res.get('GPU', 0):g})"
        )
    return f"{len(nodes)} alive node(s): " + ", ".join(parts) if parts else "no alive nodes"


def default_cpus_per_bundle(num_bundles: int, gpus_per_bundle: float, nodes: Sequence[dict]) -> float:
    """CPUs per bundle when the caller gives none.

    GPU bundles get 1 CPU (less if the GPU nodes have fewer CPUs than GPUs). CPU bundles
    (``gpus_per_bundle == 0``: the CPU demo and tests) share the CPUs Ray sees:
    floor(total / num_bundles) when that is >= 1, else a fraction rounded down to 0.01
    (Ray accepts fractional CPU requests), lowered until the bundles fit the nodes.
    """
    if num_bundles < 1:
        raise PlacementError(f"num_bundles must be >= 1, got {num_bundles}")
    cpus = [n.get("Resources", {}).get("CPU", 0.0) for n in nodes]
    if gpus_per_bundle > 0:
        ratios = [
            n["Resources"].get("CPU", 0.0) / n["Resources"]["GPU"] * gpus_per_bundle
            for n in nodes
            if n.get("Resources", {}).get("GPU", 0) > 0
        ]
        return min([1.0] + [math.floor(r * 100) / 100 for r in ratios if r > 0])
    total = sum(cpus)
    share = total / num_bundles
    c = float(math.floor(share)) if share >= 1 else math.floor(share * 100) / 100
    while c > 0 and sum(math.floor(x / c + 1e-9) for x in cpus) < num_bundles:
        c = c - 1 if c > 1 else math.floor(c * 50) / 100  # integers first, then halve the fraction
    if c <= 0:
        raise PlacementError(
            f"cannot split the cluster's {total:g} CPUs into {num_bundles} bundles ({_node_summary(nodes)})"
        )
    return c


def _infeasible_reason(bundles: List[Dict[str, float]], strategy: str, nodes: Sequence[dict]) -> Optional[str]:
    """Why no assignment of ``bundles`` to ``nodes`` can exist (by total resources), else None."""
    caps = [dict(n.get("Resources", {})) for n in nodes]
    keys = {k for b in bundles for k in b}
    for k in keys:
        need = sum(b.get(k, 0) for b in bundles)
        have = sum(c.get(k, 0) for c in caps)
        if need > have + 1e-9:
            return f"the bundles need {need:g} {k} in total, the cluster has {have:g}"
    for i, b in enumerate(bundles):
        if not any(all(c.get(k, 0) + 1e-9 >= v for k, v in b.items()) for c in caps):
            return f"bundle {i} {b} fits on no single node"
    if strategy == "STRICT_SPREAD":
        fitting = [c for c in caps if all(c.get(k, 0) + 1e-9 >= v for k, v in bundles[0].items())]
        if len(fitting) < len(bundles):
            return f"STRICT_SPREAD needs {len(bundles)} distinct nodes, only {len(fitting)} can host a bundle"
    if strategy == "STRICT_PACK":
        for k in keys:
            need = sum(b.get(k, 0) for b in bundles)
            if not any(c.get(k, 0) + 1e-9 >= need for c in caps):
                return f"STRICT_PACK needs {need:g} {k} on one node; the largest node has {max(c.get(k, 0) for c in caps):g}"
    return None


def create_placement_group(
    num_bundles: int,
    gpus_per_bundle: float,
    cpus_per_bundle: Optional[float] = None,
    strategy: str = "PACK",
    timeout_s: float = 60.0,
    resources_per_bundle: Optional[Dict[str, float]] = None,
    name: str = "",
):
    """A ready placement group of ``num_bundles`` x {GPU: gpus_per_bundle, CPU: cpus_per_bundle}.

    Raises :class:`PlacementError` (after removing the pending group) when it is not placed
    within ``timeout_s`` or can never be placed; the message names the request and the
    cluster's alive nodes.
    """
    import ray  # lazy: Ray
    from ray.util.placement_group import placement_group, remove_placement_group

    if strategy not in STRATEGIES:
        raise PlacementError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if num_bundles < 1:
        raise PlacementError(f"num_bundles must be >= 1, got {num_bundles}")
    if not ray.is_initialized():
        start_ray()
    nodes = alive_nodes()
    if cpus_per_bundle is None:
        cpus_per_bundle = default_cpus_per_bundle(num_bundles, gpus_per_bundle, nodes)
    bundle: Dict[str, float] = {}
    if cpus_per_bundle:
        bundle["CPU"] = float(cpus_per_bundle)
    if gpus_per_bundle:
        bundle["GPU"] = float(gpus_per_bundle)
    bundle.update(resources_per_bundle or {})
    if not bundle:
        raise PlacementError("a bundle must request some resource (gpus_per_bundle or cpus_per_bundle > 0)")
    bundles = [dict(bundle) for _ in range(num_bundles)]
    request = f"{num_bundles} bundle(s) of {bundle} with strategy {strategy}"
    reason = _infeasible_reason(bundles, strategy, nodes)
    if reason:
        raise PlacementError(f"cannot place {request}: {reason}; cluster: {_node_summary(nodes)}")
    pg = placement_group(bundles, strategy=strategy, name=name)
    if not pg.wait(timeout_s):
        try:
            remove_placement_group(pg)
        finally:
            avail = ray.available_resources()
            raise PlacementError(
                f"placement group of {request} not placed within {timeout_s:g} s (removed); cluster: "
                f"{_node_summary(alive_nodes())}; available now: CPU {avail.get('CPU', 0):g}, GPU "
                f"{avail.get('GPU', 0):g} (other placement groups or actors may hold the rest)"
            )
    return pg


def bundle_node_ids(pg) -> List[str]:
    """Node id of each bundle, in bundle order."""
    from ray.util.placement_group import placement_group_table  # lazy: Ray

    table = placement_group_table(pg)
    b2n = table["bundles_to_node_id"]
    return [b2n[i] for i in range(len(table["bundles"]))]


def _where(with_port: bool = False) -> dict:
    """What a task placed on a bundle sees: its node (id, IP), the GPU ids Ray gave it
    (physical ids on that node) and, ``with_port``, a rendezvous port free on that node."""
    import ray  # lazy: Ray

    from ..ports import free_port  # torch-free, as this module (its __main__ runs in Slurm scripts)

    out = {
        "node_id": ray.get_runtime_context().get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "gpu_ids": [int(g) for g in ray.get_gpu_ids()],
    }
    if with_port:
        out["port"] = free_port()
    return out


def on_bundle(pg, bundle: int, gpus: float = 0.0, timeout_s: float = 300.0) -> dict:
    """Run :func:`_where` on ``bundle`` of ``pg`` (a tiny task: no CPU, ``gpus`` GPU, so that
    it gets the bundle's GPU ids while actors hold most of the bundle)."""
    import ray  # lazy: Ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    task = ray.remote(_where).options(
        num_cpus=0,
        num_gpus=gpus,
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=bundle),
    )
    return ray.get(task.remote(True), timeout=timeout_s)


def bundle_placements(pg, gpus_per_bundle: float, timeout_s: float = 300.0) -> List[dict]:
    """``{"node_id", "node_ip", "gpu_ids"}`` of every bundle, in bundle order (one tiny task per
    bundle, all at once). A GPU bundle keeps its GPU ids for its lifetime: the actors placed on
    it later see the same ids."""
    import ray  # lazy: Ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    gpus = 0.01 if gpus_per_bundle else 0
    task = ray.remote(_where)
    futs = [
        task.options(
            num_cpus=0,
            num_gpus=gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=b),
        ).remote()
        for b in range(pg.bundle_count)
    ]
    return ray.get(futs, timeout=timeout_s)


def _address_key(addr: str):
    """Sort key of a node address: IP addresses numerically (10.0.0.9 before 10.0.0.10), then names."""
    try:
        ip = ipaddress.ip_address(addr)
        return (0, ip.version, int(ip), "")
    except ValueError:
        return (1, 0, 0, addr or "")


def ranks_to_bundles(placements: Sequence[dict]) -> List[int]:
    """Bundle index of each rank: bundles sorted by (node address, GPU id, bundle index).

    ``placements[b]`` is bundle ``b``'s ``{"node_id", "node_ip", "gpu_ids"}``
    (:func:`bundle_placements`). Ranks of one node are consecutive and follow the node's GPU
    ids, whatever order Ray gave the bundles in (Ray promises neither that bundle ``i`` and
    ``i + 1`` share a node nor that their GPU ids ascend). Rank 0 is on the node with the
    lowest address. CPU bundles (no GPU ids) of one node keep their bundle order.
    """

    def key(b):
        p = placements[b]
        gpus = p.get("gpu_ids") or []
        return (
            _address_key(p.get("node_ip") or p.get("node_id") or ""),
            p.get("node_id") or "",
            min(gpus) if gpus else -1,
            b,
        )

    return sorted(range(len(placements)), key=key)


def engine_gpu_plan(placements: Sequence[dict], gpus_per_engine: int) -> List[dict]:
    """Where each rollout engine runs, from where its feeding ranks run.

    ``placements[r]``: ``{"node_id", "gpu_ids"}`` of trainer rank ``r`` (what Ray gave it).
    Engine ``e`` is fed by ranks ``e*K .. e*K+K-1`` (``hybrid.weight_sync.engine_feeders``)
    and must see exactly their GPUs. Valid: all on one node (CUDA IPC does not cross nodes),
    one GPU per rank, and together the K consecutive physical ids ``b .. b+K-1`` (SGLang puts
    TP rank ``j`` on ``base_gpu_id + j``), in ANY order over the ranks: ``base_gpu_id`` is
    the smallest. :func:`ranks_to_bundles` gives ascending ids (rank ``e*K + j`` on GPU
    ``b + j``, which feeds TP rank ``j``: a local copy); another order stays correct, a
    feeder's buffer is then read by the TP rank of another GPU of the same node (a peer copy).
    Returns ``[{"engine", "node_id", "ranks", "base_gpu_id", "gpu_ids"}]`` (``gpu_ids``
    ascending, ids ``None`` on CPU); raises :class:`PlacementError` naming the engine otherwise.
    """
    k = int(gpus_per_engine)
    if k < 1 or len(placements) % k:
        raise PlacementError(f"--rollout-num-gpus-per-engine {k} must divide the {len(placements)} trainer ranks")
    plan = []
    for e in range(len(placements) // k):
        ranks = list(range(e * k, (e + 1) * k))
        nodes = {placements[r]["node_id"] for r in ranks}
        if len(nodes) != 1:
            raise PlacementError(
                f"engine {e} would span nodes {sorted(nodes)} (ranks {ranks}): its GPUs must share a node; "
                "choose --rollout-num-gpus-per-engine dividing the GPUs per node"
            )
        ids = [g for r in ranks for g in placements[r].get("gpu_ids", [])]
        if ids:
            got = sorted(ids)
            if len(ids) != k or got != list(range(got[0], got[0] + k)):
                raise PlacementError(
                    f"engine {e}: its ranks {ranks} hold GPUs {ids}, not {k} distinct consecutive ids "
                    "(SGLang puts TP rank j on base_gpu_id + j)"
                )
            ids = got
        plan.append(
            {
                "engine": e,
                "node_id": nodes.pop(),
                "ranks": ranks,
                "base_gpu_id": ids[0] if ids else None,
                "gpu_ids": ids or None,
            }
        )
    return plan


def _node_names(n: dict) -> set:
    names = set()
    for k in n.get("Resources", {}):
        if k.startswith(NODE_RESOURCE_PREFIX):
            names.add(k[len(NODE_RESOURCE_PREFIX) :])
    host = n.get("NodeManagerHostname") or ""
    if host:
        names.update({host, host.split(".")[0]})
    if n.get("NodeManagerAddress"):
        names.add(n["NodeManagerAddress"])
    return names


def missing_nodes(expected: Iterable[str], gpus_per_node: float, nodes: Sequence[dict]) -> List[str]:
    """Expected node names (hostnames, IPs or ``slurm_node:`` tags) not registered with their GPUs."""
    out = []
    for name in expected:
        short = name.split(".")[0]
        match = [n for n in nodes if name in _node_names(n) or short in _node_names(n)]
        if not match:
            out.append(f"{name} (not registered)")
        elif gpus_per_node and max(n.get("Resources", {}).get("GPU", 0) for n in match) < gpus_per_node:
            have = max(n.get("Resources", {}).get("GPU", 0) for n in match)
            out.append(f"{name} (registered with {have:g} of {gpus_per_node:g} GPUs)")
    return out


def wait_for_nodes(
    expected: Sequence[str], gpus_per_node: float = 0, timeout_s: float = 300.0, poll_s: float = 2.0
) -> List[dict]:
    """Block until every node in ``expected`` is alive with ``gpus_per_node`` GPUs.

    Raises :class:`PlacementError` naming the missing nodes after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = alive_nodes()
        missing = missing_nodes(expected, gpus_per_node, nodes)
        if not missing:
            return nodes
        if time.monotonic() >= deadline:
            raise PlacementError(
                f"after {timeout_s:g} s, {len(missing)} of {len(expected)} node(s) missing: {', '.join(missing)}; "
                f"cluster: {_node_summary(nodes)}"
            )
        time.sleep(poll_s)


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m megatron_dapo.launch.placement")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wait-nodes", help="wait until every node has registered its GPUs with Ray")
    w.add_argument("--address", default=None, help="Ray address (default $RAY_ADDRESS)")
    w.add_argument("--nodes", required=True, help="comma-separated node names (Slurm hostnames)")
    w.add_argument("--gpus-per-node", type=float, default=0)
    w.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args(argv)
    expected = [x for x in args.nodes.split(",") if x]
    deadline = time.monotonic() + args.timeout
    while True:  # the head may still be starting
        try:
            start_ray(address=args.address)
            break
        except Exception as e:  # ConnectionError, or a timeout inside ray.init
            import ray  # lazy: Ray

            ray.shutdown()
            if time.monotonic() >= deadline:
                where = args.address or os.environ.get("RAY_ADDRESS") or "a local cluster"
                print(f"ERROR: Ray head at {where} not reachable within {args.timeout:g} s ({e})", file=sys.stderr)
                return 1
            time.sleep(2)
    try:
        nodes = wait_for_nodes(expected, args.gpus_per_node, max(0.0, deadline - time.monotonic()))
    except PlacementError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 1
    print(f"all {len(expected)} node(s) registered: {_node_summary(nodes)}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
