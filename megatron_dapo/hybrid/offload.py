"""Offload / onload of the trainer's memory between hybrid-engine phases.

What is moved: every *storage* behind

* ``params``: the model's parameters, DDP's contiguous ``buffer.param_data`` (distributed
  optimizer), and the optimizer's main parameters (fp32 copies or shards);
* ``grads``: DDP's ``buffer.grad_data`` (every ``param.main_grad`` is a view of it),
  ``param.grad`` and the main parameters' ``.grad``;
* ``optimizer``: the optimizer state (Adam's ``exp_avg`` / ``exp_avg_sq`` ...) of every
  sub-optimizer of megatron's ``ChainedOptimizer``.

Tensors are deduplicated by storage, so a contiguous DDP buffer is copied once, not once per
parameter view, and every view (param.data, main_grad, bucket views, optimizer shards) stays
a valid tensor object. Mechanism (``backend="resize"``, the default): copy each storage's
bytes to host buffers (chunks of 256 MiB), then ``untyped_storage().resize_(0)``; onload re-allocates
(``resize_(nbytes)``) and copies the bytes back. On GPU the host buffers are pinned, kept
between steps (pinning is the expensive part) and the copies are asynchronous with one
synchronize per direction; ``torch.cuda.empty_cache()`` returns the memory to the driver
so the colocated engine can use it. On CPU the same code really frees the storages (a test
sees ``nbytes() == 0``); the host copy is then a plain CPU clone.

Why storage resizing and not ``torch_memory_saver``: it needs no allocator hook (LD_PRELOAD)
and no allocation region at model-build time, keeps every tensor object and view valid, is
exact, and works on CPU for tests. ``torch_memory_saver`` (virtual-memory unmapping, used by
SGLang itself) avoids the host copy of weights only when paired with its CPU backup, i.e.
it moves the same bytes; it is supported here as ``backend="torch_memory_saver"`` (imported
lazily) for trainers that allocated under ``torch_memory_saver.region(tag)``.
``benchmarks/gpu_check.sh`` measures the resize path's offload/onload time and freed bytes
on a GPU.

While offloaded nothing may touch the tensors (no forward, no ``zero_grad_buffer``).
``preserve_grads=False`` (the default) skips the gradient copy: the gradient storages are
freed without a host copy and come back zeroed, like megatron's own ``offload_grad_buffers``.
Nothing reads a gradient between two optimizer steps: every step starts with DDP's
``zero_grad_buffer()`` and the optimizer's ``zero_grad()`` (``training.dapo_step.train_on_minibatch``,
``training.setup.train_step``), so copying them (fp32, 4 bytes per parameter: about 15 GiB
per GPU off and back per step for Qwen2.5-32B at TP 8, PP 1: 4.1B params per GPU) buys nothing.
``preserve_grads=True`` keeps them (a caller that inspects gradients across an offload).
"""

from __future__ import annotations

import logging
import time
from typing import Dict, Iterable, List, Optional, Tuple

import torch

log = logging.getLogger(__name__)

CATEGORIES = ("params", "grads", "optimizer")


def _storage_key(s: torch.UntypedStorage) -> int:
    return s._cdata  # the StorageImpl: stable across resize_, shared by every view


def _sub_optimizers(optimizer) -> list:
    if optimizer is None:
        return []
    subs = getattr(optimizer, "chained_optimizers", None)
    return list(subs) if subs is not None else [optimizer]


def _inner(opt):
    """The torch optimizer inside a megatron optimizer wrapper (or the optimizer itself)."""
    return getattr(opt, "optimizer", opt)


def trainer_tensors(model, optimizer=None) -> Dict[str, List[torch.Tensor]]:
    """The tensors (by category) whose storages the offload moves (see module doc)."""
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    out: Dict[str, List[torch.Tensor]] = {c: [] for c in CATEGORIES}
    for m in chunks:
        ddp_buffers = []
        for attr in ("buffers", "expert_parallel_buffers"):  # DDP's lists (nn.Module.buffers is a method)
            v = getattr(m, attr, None)
            if isinstance(v, (list, tuple)):
                ddp_buffers.extend(v)
        for buf in ddp_buffers:
            if getattr(buf, "param_data", None) is not None:
                out["params"].append(buf.param_data)
            if getattr(buf, "grad_data", None) is not None:
                out["grads"].append(buf.grad_data)
        for p in m.parameters():
            out["params"].append(p.data)
            mg = getattr(p, "main_grad", None)
            if isinstance(mg, torch.Tensor):
                out["grads"].append(mg)
            if p.grad is not None:
                out["grads"].append(p.grad)
    for sub in _sub_optimizers(optimizer):
        inner = _inner(sub)
        for group in getattr(inner, "param_groups", []):
            for p in group["params"]:
                out["params"].append(p.data)
                if p.grad is not None:
                    out["grads"].append(p.grad)
        for st in getattr(inner, "state", {}).values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    out["optimizer"].append(v)
    return out


# Host copies are kept as chunks of at most this many bytes: PyTorch's pinned-memory
# allocator rounds every allocation up to a power of two, which for one 12 GB gradient
# buffer would pin 16 GB; with power-of-two chunks only the last chunk is rounded.
HOST_CHUNK_BYTES = 256 * 2**20


def _host_chunks(n: int, pin: bool) -> List[torch.Tensor]:
    return [
        torch.empty(min(HOST_CHUNK_BYTES, n - i), dtype=torch.uint8, pin_memory=pin)
        for i in range(0, n, HOST_CHUNK_BYTES)
    ]


def _byte_view(s: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=s.device).set_(s)


class TrainerOffloader:
    """Offload/onload of a trainer's params, gradient buffers and optimizer state.

    ``model``: the DDP-wrapped chunk (or a list of chunks); ``optimizer``: megatron's
    optimizer (or None). ``what``: the categories to release (default all three).
    ``preserve_grads``: copy the gradients to host and back (default False: released and
    zeroed on onload; see the module doc). ``last["host_copy_bytes"]``: bytes copied to host.
    """

    def __init__(
        self,
        model,
        optimizer=None,
        *,
        what: Iterable[str] = CATEGORIES,
        preserve_grads: bool = False,
        backend: str = "resize",
        tag: str = "trainer",
    ):
        what = tuple(what)
        bad = [w for w in what if w not in CATEGORIES]
        if bad:
            raise ValueError(f"unknown offload categories {bad}; known: {CATEGORIES}")
        if backend not in ("resize", "torch_memory_saver"):
            raise ValueError(f"backend must be 'resize' or 'torch_memory_saver', got {backend!r}")
        self.model = model
        self.optimizer = optimizer
        self.what = what
        self.preserve_grads = preserve_grads
        self.backend = backend
        self.tag = tag
        self._host: Dict[int, List[torch.Tensor]] = {}  # storage key -> host byte chunks (kept)
        self._offloaded: List[Tuple[torch.UntypedStorage, int, Optional[List[torch.Tensor]]]] = []
        self.is_offloaded = False
        self.last = {}

    def _device(self) -> torch.device:
        chunks = list(self.model) if isinstance(self.model, (list, tuple)) else [self.model]
        for m in chunks:
            for p in m.parameters():
                return p.device
        return torch.device("cpu")

    def storages(self) -> List[Tuple[str, torch.UntypedStorage]]:
        """Unique (category, storage) pairs that an offload moves now (allocated ones only)."""
        dev = self._device()
        seen = set()
        out = []
        tensors = trainer_tensors(self.model, self.optimizer)
        for cat in CATEGORIES:
            if cat not in self.what:
                continue
            for t in tensors[cat]:
                if t.device.type != dev.type:
                    continue  # e.g. Adam's CPU step counters next to CUDA params
                s = t.untyped_storage()
                k = _storage_key(s)
                if k in seen or s.nbytes() == 0:
                    continue
                seen.add(k)
                out.append((cat, s))
        return out

    def resident_bytes(self) -> int:
        """Bytes currently allocated in the tracked storages (0 when fully offloaded): those on
        the model's device, like :meth:`storages` (Adam's host step counters beside CUDA
        parameters are not the trainer's device memory and are never moved)."""
        dev = self._device()
        seen, total = set(), 0
        tensors = trainer_tensors(self.model, self.optimizer)
        for cat in self.what:
            for t in tensors[cat]:
                if t.device.type != dev.type:
                    continue
                s = t.untyped_storage()
                k = _storage_key(s)
                if k not in seen:
                    seen.add(k)
                    total += s.nbytes()
        return total

    @torch.no_grad()
    def offload(self) -> int:
        """Release the trainer's memory; returns the bytes freed."""
        if self.is_offloaded:
            raise RuntimeError("TrainerOffloader.offload(): already offloaded")
        t0 = time.perf_counter()
        if self.backend == "torch_memory_saver":
            from torch_memory_saver import torch_memory_saver  # optional (GPU backend only)

            torch_memory_saver.pause(self.tag)
            self.is_offloaded = True
            self.last = {"offload_s": time.perf_counter() - t0}
            return 0
        dev = self._device()
        cuda = dev.type == "cuda"
        if cuda:
            torch.cuda.synchronize(dev)
        plan = []
        for cat, s in self.storages():
            n = s.nbytes()
            keep = cat != "grads" or self.preserve_grads
            host = None
            if keep:
                k = _storage_key(s)
                host = self._host.get(k)
                if host is None or sum(h.numel() for h in host) != n:
                    host = _host_chunks(n, pin=cuda)
                    self._host[k] = host
                view = _byte_view(s)
                for i, h in zip(range(0, n, HOST_CHUNK_BYTES), host):
                    h.copy_(view[i : i + h.numel()], non_blocking=cuda)
            plan.append((s, n, host))
        if cuda:
            torch.cuda.synchronize(dev)  # the copies must land before the storage goes
        freed = 0
        for s, n, _ in plan:
            s.resize_(0)
            freed += n
        if cuda:
            torch.cuda.empty_cache()
        self._offloaded = plan
        self.is_offloaded = True
        copied = sum(n for _, n, host in plan if host is not None)
        self.last = {"offload_s": time.perf_counter() - t0, "offload_bytes": freed, "host_copy_bytes": copied}
        log.info("trainer offload: %.1f MiB in %.3f s", freed / 2**20, self.last["offload_s"])
        return freed

    @torch.no_grad()
    def onload(self) -> int:
        """Re-allocate and restore everything offloaded; returns the bytes restored."""
        if not self.is_offloaded:
            raise RuntimeError("TrainerOffloader.onload(): not offloaded")
        t0 = time.perf_counter()
        if self.backend == "torch_memory_saver":
            from torch_memory_saver import torch_memory_saver  # optional (GPU backend only)

            torch_memory_saver.resume(self.tag)
            self.is_offloaded = False
            self.last = {"onload_s": time.perf_counter() - t0}
            return 0
        dev = self._device()
        cuda = dev.type == "cuda"
        total = 0
        for s, n, host in self._offloaded:
            s.resize_(n)
            view = _byte_view(s)
            if host is None:
                view.zero_()
            else:
                for i, h in zip(range(0, n, HOST_CHUNK_BYTES), host):
                    view[i : i + h.numel()].copy_(h, non_blocking=cuda)
            total += n
        if cuda:
            torch.cuda.synchronize(dev)
        self._offloaded = []
        self.is_offloaded = False
        self.last = {"onload_s": time.perf_counter() - t0, "onload_bytes": total}
        log.info("trainer onload: %.1f MiB in %.3f s", total / 2**20, self.last["onload_s"])
        return total

    def drop_host_buffers(self) -> None:
        """Free the kept (pinned) host buffers; the next offload allocates them again."""
        if self.is_offloaded:
            raise RuntimeError("drop_host_buffers() while offloaded would lose the weights")
        self._host.clear()


def offload_policy(policy, **kwargs) -> TrainerOffloader:
    """Offload a ``training.setup.Policy`` (model + optimizer); returns the offloader to onload."""
    off = TrainerOffloader(policy.model, policy.optimizer, **kwargs)
    off.offload()
    return off
