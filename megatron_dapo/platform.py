"""CPU compatibility layer for megatron-core (the ONE place where megatron is patched).

megatron-core assumes CUDA throughout. On a machine without CUDA, :func:`apply_cpu_patches`
makes it run on the CPU with the gloo backend, which is how CI tests tensor and pipeline
parallelism. On a CUDA machine nothing here is applied: :func:`apply_cpu_patches` is a no-op.

Measured on megatron-core 0.16.1 + torch 2.13 (CPU). Each patch names the call sites that
need it:

1. ``_CudaToCpuMode`` (a ``torch.overrides.TorchFunctionMode``): rewrites ``device="cuda"``,
   ``device=torch.cuda.current_device()`` (an int means a CUDA ordinal to torch),
   ``.cuda()`` and ``.to("cuda")`` into CPU equivalents. Needed by: every pipeline schedule
   (``pipeline_parallel/schedules.py`` allocates loss/num-token tensors with
   ``device="cuda"``, even at PP=1), ``p2p_communication`` buffers, ``optimizer/__init__``,
   ``optimizer/clip_grads.py`` (``torch.tensor(..., device="cuda")``), DDP
   ``param_and_grad_buffer`` (``torch.cuda.current_device()`` as device), the rotary embedding
   (``inv_freq.to(device=torch.cuda.current_device())``), the finalize-grads all-reduces.
2. ``torch.cuda.current_device`` -> 0, ``torch.cuda.synchronize`` / ``torch.cuda.empty_cache``
   -> no-ops, ``torch.cuda.device_count`` -> 0 kept, ``torch.cuda.current_stream`` /
   ``torch.cuda.Stream`` / ``torch.cuda.stream`` -> dummies: ``p2p_communication`` (with
   ``batch_p2p_sync``), ``dist_checkpointing`` save (synchronize before writing), the DDP
   buffers' communication stream, ``timers``.
3. ``tensor.type()`` (no arguments) reports ``'torch.cuda.FloatTensor'`` for a CPU float
   tensor (inside the same torch function mode): ``optimizer/clip_grads.py`` asserts
   ``param.grad.type() == 'torch.cuda.FloatTensor'`` and ``distrib_optimizer.py`` /
   ``optimizer.py`` dispatch on ``param.type()`` when building main-param groups.
4. ``model_parallel_cuda_manual_seed`` must be called with ``inference_rng_tracker=True`` on
   CPU (the default tracker forks ``torch.cuda`` RNG states): see :func:`manual_seed`.
5. ``get_default_causal_mask`` is CUDA-only: callers pass an explicit attention mask
   (``megatron_dapo.models.causal_mask``).
6. The local-spec ``WrappedTorchNorm`` refuses ``sequence_parallel=True`` without TE/apex;
   sequence parallel is therefore validated as GPU-only in the config.
7. ``dist_checkpointing``'s async writer starts a helper process that re-imports
   ``__main__``: every entry point of this package has a ``__main__`` guard.

Nothing in this module is imported by ``import megatron_dapo``.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
from torch.overrides import TorchFunctionMode

_APPLIED = False


def cuda_available() -> bool:
    """True when CUDA is usable (then no patch is applied)."""
    return torch.cuda.is_available()


def default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if cuda_available() else torch.device("cpu")


def dist_backend() -> str:
    return "nccl" if cuda_available() else "gloo"


def _is_cuda_device(d) -> bool:
    if d is None:
        return False
    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d.startswith("cuda")
    if isinstance(d, int) and not isinstance(d, bool):
        return True  # torch reads a bare int as a CUDA ordinal
    return False


_CPU = torch.device("cpu")
_TO_FUNCS = {torch.Tensor.to}
_IDENTITY_FUNCS = {torch.Tensor.cuda}
_TENSOR_TYPE = torch.Tensor.type


class _CudaToCpuMode(TorchFunctionMode):
    """Route every tensor that megatron-core puts on 'cuda' to the CPU (patch 1)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _IDENTITY_FUNCS:  # tensor.cuda(...) -> the tensor itself
            return args[0]
        if func is _TENSOR_TYPE and len(args) == 1 and not kwargs:  # patch 3
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if name.startswith("torch.") and ".cuda." not in name else name
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs = dict(kwargs, device=_CPU)
        if func in _TO_FUNCS and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], _CPU) + tuple(args[2:])
        if kwargs.get("pin_memory"):
            kwargs = dict(kwargs, pin_memory=False)
        return func(*args, **kwargs)


class _DummyStream:
    """Stand-in for torch.cuda.Stream on CPU: every operation is synchronous already."""

    def __init__(self, *a, **k):
        pass

    def wait_stream(self, *a, **k):
        pass

    def wait_event(self, *a, **k):
        pass

    def record_event(self, *a, **k):
        return _DummyEvent()

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _DummyEvent(_DummyStream):
    def record(self, *a, **k):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


def apply_cpu_patches() -> bool:
    """Apply the CPU compatibility layer once per process; no-op when CUDA is available.

    Returns True when the patches are active.
    """
    global _APPLIED
    if _APPLIED:
        return True
    if cuda_available():
        return False
    # Patch 1: a process-wide torch function mode (entered once, never exited).
    mode = _CudaToCpuMode()
    mode.__enter__()
    # Patch 2: the torch.cuda attributes megatron calls directly.
    torch.cuda.current_device = lambda: 0
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.empty_cache = lambda *a, **k: None
    torch.cuda.current_stream = lambda *a, **k: _DummyStream()
    torch.cuda.default_stream = lambda *a, **k: _DummyStream()
    torch.cuda.Stream = _DummyStream
    torch.cuda.Event = _DummyEvent
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    torch.cuda.memory_allocated = lambda *a, **k: 0
    torch.cuda.max_memory_allocated = lambda *a, **k: 0
    torch.cuda.memory_reserved = lambda *a, **k: 0
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    _APPLIED = True
    return True


def manual_seed(seed: int) -> None:
    """Seed torch and megatron's model-parallel RNG tracker (patch 4 on CPU)."""
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed, inference_rng_tracker=not cuda_available(), force_reset_rng=True)


@functools.lru_cache(maxsize=None)
def te_available() -> bool:
    """Whether transformer_engine imports (never imported on CPU-only installs)."""
    if not cuda_available():
        return False
    try:
        import transformer_engine  # noqa: F401
    except Exception:
        return False
    return True
