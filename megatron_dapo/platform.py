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
8. Mixture of experts (:func:`apply_moe_cpu_patches`, called where a MoE model is built on
   the CPU): ``transformer/moe/moe_utils.py`` imports ``te_general_gemm`` only when
   transformer_engine imports, yet the router's gating (``RouterGatingLinearFunction``, forward
   and backward) tests ``te_general_gemm is not None`` unconditionally (a NameError without
   TE): the name is defined as None, so the router runs its torch matmul. The all-to-all
   dispatcher moves its split sizes to the host with ``maybe_move_tensor_to_cpu(...,
   as_numpy=True)``, which converts only CUDA tensors, so on the CPU the splits stay tensors
   and ``all_to_all_single`` refuses them (it takes a sequence of ints): the dispatcher's
   reference is replaced by one that returns what the GPU path returns, a host tensor or its
   numpy array. A custom autograd Function's backward runs with torch function modes off, so
   the all-to-all that the dispatcher's backward runs (``tensor_parallel/mappings.py:
   _AllToAll.forward``, which allocates its output on ``torch.cuda.current_device()``) runs
   inside patch 1's mode again. The token dispatchers' CUDA streams and events (``token_dispatcher.py``: ``torch.cuda.Stream()``,
   ``torch.cuda.current_stream()``) are patch 2's dummies; ``Router.gating`` moving its
   weight ``.to(torch.cuda.current_device())`` and the dispatchers' ``device="cuda"``
   tensors are patch 1.
9. Activation recompute: the device RNG state that ``CheckpointFunction`` saves and restores
   is the CPU generator's, and its backward (the recompute) runs inside patch 1's mode
   (:func:`_patch_recompute_rng`).

10. Import time (``megatron_dapo/platform_imports.py``, installed by ``import megatron_dapo``
   because it must act before megatron-core is imported, and standard library only because
   importing the package must stay cheap): while a ``megatron.core`` module runs its import,
   ``torch.compile`` is a lazy decorator, so the fusions' ``@jit_fuser`` and 0.19's router
   ``@torch.compile`` import dynamo and inductor at their first call, not in every process that
   imports megatron-core. On any device.
11. Pickled tensors (the same hook, after ``megatron.core`` imported): megatron-core 0.19 points
   ``torch.storage._load_from_bytes`` at its own ``safe_load_from_bytes``, so every tensor a
   trainer rank pickles names megatron-core and its receiver (the driver) imported all of it;
   ``platform_imports.load_storage_bytes`` takes its place, the same ``weights_only=True`` load.
   On any device.
12. Checkpoint write results (:func:`in_process_write_results`, called before every save): a
   synchronous ``dist_checkpointing.save`` hands its write results to its own process through a
   module-global queue, which megatron-core creates at the first save as a
   ``multiprocessing`` spawn-context ``Manager().Queue()`` (``strategies/filesystem_async.py``,
   0.16.1 and 0.19): a server process that re-runs the rank's ``__main__`` (a Ray worker's
   ``default_worker.py``) and lives as long as the rank, 3.5 CPU-s per saving rank on this
   machine. Only an asynchronous save (a separate writer process), which this project does not
   use, needs that queue to cross processes; a ``queue.Queue`` takes its place. On any device.

Strict collectives (a test mode, ``MEGATRON_DAPO_STRICT_COLLECTIVES=1``): on CPU every group
is gloo and every tensor is on the host, so a host tensor handed to what is an NCCL group in
production (it raises at the first such collective on a GPU) passes unseen. In this mode
:func:`install_strict_collectives` records, for every process group, the kind it has in
production (a group asked for with ``backend="gloo"`` is a host group; the default group and
every other group are accelerator groups) and wraps torch.distributed's collectives so that
they refuse a tensor on the wrong side: on a GPU by its device; on CPU by where the tensor
WOULD be on a GPU, which a torch function mode tracks (a tensor made by a torch factory
without ``device=`` or with ``device="cpu"`` is a host tensor, one made on a CUDA device or on
:func:`megatron_dapo.distributed.collective_device` of an accelerator group, ``cpu:0`` in
this mode, an accelerator tensor; results of ops follow their inputs; ``.to``/``.cuda``/
``.cpu`` move them). Tensors the mode did not see made (autograd's, ``torch.from_numpy``'s)
are let through.

Nothing in this module is imported by ``import megatron_dapo``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import weakref

import torch
from torch.overrides import TorchFunctionMode

_APPLIED = False
_MODE_CLS = None  # the class of patch 1's mode (strict or not)

STRICT_ENV = "MEGATRON_DAPO_STRICT_COLLECTIVES"


def strict_collectives() -> bool:
    """Whether the strict-collectives test mode is asked for (``MEGATRON_DAPO_STRICT_COLLECTIVES``)."""
    return os.environ.get(STRICT_ENV, "").strip() not in ("", "0")


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
            return (
                name.replace("torch.", "torch.cuda.", 1) if name.startswith("torch.") and ".cuda." not in name else name
            )
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs = dict(kwargs, device=_CPU)
        if func in _TO_FUNCS and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], _CPU) + tuple(args[2:])
        if kwargs.get("pin_memory"):
            kwargs = dict(kwargs, pin_memory=False)
        return func(*args, **kwargs)


# ------------------------------------------------------------------ strict collectives ----
ACCELERATOR, HOST = "accelerator", "host"
ACCELERATOR_MARK = torch.device("cpu", 0)  # collective_device(accelerator group) on CPU in strict mode
_TAGS: dict = {}  # id(tensor) -> (side, origin, weakref): where the tensor would live on a GPU
_MOVES = {torch.Tensor.to: None, torch.Tensor.cuda: ACCELERATOR, torch.Tensor.cpu: HOST}
# The factories whose device defaults to the host (a tensor made without device= lands there on
# a GPU machine). Others (torch.from_file: a mapped file, used on CPU-only paths) are not tracked.
_FACTORIES = {
    getattr(torch, n)
    for n in (
        "tensor",
        "as_tensor",
        "asarray",
        "scalar_tensor",
        "zeros",
        "ones",
        "empty",
        "full",
        "empty_strided",
        "arange",
        "range",
        "linspace",
        "logspace",
        "eye",
        "rand",
        "randn",
        "randint",
        "randperm",
        "tril_indices",
        "triu_indices",
        "sparse_coo_tensor",
    )
    if hasattr(torch, n)
}
_HERE = os.path.abspath(__file__)
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


class _TagRef(weakref.ref):
    pass


def _drop_tag(ref) -> None:
    entry = _TAGS.get(ref.key)
    if entry is not None and entry[2] is ref:
        del _TAGS[ref.key]


def _set_tag(t, side, origin) -> None:
    ref = _TagRef(t, _drop_tag)
    ref.key = id(t)
    _TAGS[ref.key] = (side, origin, ref)


def tensor_side(t) -> tuple:
    """``(side, origin)``: where ``t`` would live on a GPU machine (:data:`HOST` or
    :data:`ACCELERATOR`) and what made it, as the strict mode tracked it; ``(None, None)``
    when the mode did not see it made."""
    entry = _TAGS.get(id(t))
    if entry is None or entry[2]() is not t:
        return None, None
    return entry[0], entry[1]


def _short(path: str) -> str:
    for mark in ("megatron_dapo" + os.sep, "site-packages" + os.sep, "tests" + os.sep):
        i = path.rfind(mark)
        if i >= 0:
            return path[i + (len(mark) if mark.startswith("site") else 0) :]
    return path


def caller_location(skip: int = 1) -> str:
    """``file:line`` of the first frame above the caller outside torch and this module."""
    f = sys._getframe(skip + 1)
    while f is not None:
        name = f.f_code.co_filename
        if not (name.startswith(_TORCH_DIR) or name == _HERE or name.endswith(os.sep + "functools.py")):
            return f"{_short(name)}:{f.f_lineno}"
        f = f.f_back
    return "?"


UNSAID = "unsaid"  # an explicit device whose production side is unknown: torch.device("cpu") is
# also what ``x.device`` gives on CPU for any x (megatron's ``torch.empty(..., device=x.device)``)


@functools.lru_cache(maxsize=64)
def _side_of_device_str(d: str):
    try:
        dev = torch.device(d)
    except (RuntimeError, ValueError):
        return None
    if dev.type == "cpu" and dev.index is None:
        return HOST  # the literal "cpu"
    return _side_of_device(dev)


def _side_of_device(d):
    """The side a ``device=`` argument puts a tensor on in production (None: not said)."""
    if d is None or isinstance(d, bool):
        return None
    if isinstance(d, torch.device):
        if d.type == "cuda":
            return ACCELERATOR
        if d.type == "cpu":
            return UNSAID if d.index is None else ACCELERATOR  # cpu:0 = ACCELERATOR_MARK
        return None
    if isinstance(d, int):
        return ACCELERATOR  # a CUDA ordinal
    if isinstance(d, str):
        return _side_of_device_str(d)
    if isinstance(d, torch.Tensor):  # tensor.to(other)
        return tensor_side(d)[0]
    return None


def _input_sides(args, kwargs) -> tuple:
    """(any accelerator input, the first host input's origin, any untracked input, any tensor)."""
    accel = False
    host = None
    unknown = False
    seen = False
    for group in (args, kwargs.values()):
        for a in group:
            if isinstance(a, (list, tuple)):
                items = a
            else:
                items = (a,)
            for x in items:
                if isinstance(x, torch.Tensor):
                    seen = True
                    e = _TAGS.get(id(x))
                    if e is None:
                        unknown = True
                    elif e[0] is ACCELERATOR:
                        accel = True
                    elif host is None:
                        host = e[1]
    return accel, host, unknown, seen


class _StrictCudaToCpuMode(_CudaToCpuMode):
    """Patch 1 plus the strict mode's bookkeeping: every tensor made in the mode is tagged
    with the side it would be on on a GPU machine (see the module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        asked = None
        if "device" in kwargs:
            asked = _side_of_device(kwargs["device"])
        elif func in _MOVES:
            asked = _MOVES[func]
            if asked is None and len(args) > 1 and not isinstance(args[1], torch.dtype):
                asked = _side_of_device(args[1])
        out = super().__torch_function__(func, types, args, kwargs)
        if isinstance(out, torch.Tensor):
            outs = (out,)
        elif isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
            outs = out
        else:
            return out
        if asked is UNSAID:  # said, but not which side: the result is not tracked
            if args and out is args[0] and id(out) in _TAGS and not isinstance(out, torch.nn.Parameter):
                out = out.view_as(out)
            return out
        if asked is not None:
            if args and out is args[0]:  # a move that is a no-op on CPU
                if _TAGS.get(id(out), (None,))[0] is asked:
                    return out
                if not isinstance(out, torch.nn.Parameter):  # module.cuda() retags its params
                    out = out.view_as(out)
                    outs = (out,)
            origin = None
            if asked is HOST:
                origin = f"{getattr(func, '__name__', func)}(device=cpu) at {caller_location()}"
            for o in outs:
                if isinstance(o, torch.Tensor):
                    _set_tag(o, asked, origin)
            return out
        accel, host, unknown, seen = _input_sides(args, kwargs)
        if not seen:
            if func not in _FACTORIES:
                return out
            side, origin = HOST, f"torch.{getattr(func, '__name__', func)}() without device= at {caller_location()}"
        elif accel:
            side, origin = ACCELERATOR, None
        elif host is not None and not unknown:
            side, origin = HOST, host
        else:
            return out
        for o in outs:
            if isinstance(o, torch.Tensor) and id(o) not in _TAGS:
                _set_tag(o, side, origin)
        return out


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
    global _MODE_CLS
    _MODE_CLS = _StrictCudaToCpuMode if strict_collectives() else _CudaToCpuMode
    mode = _MODE_CLS()
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
    _patch_recompute_rng()
    _APPLIED = True
    return True


def _patch_recompute_rng() -> None:
    """Patch 9: activation recompute (``tensor_parallel.CheckpointFunction``, what
    ``--recompute-granularity`` runs) saves and restores the device RNG state with
    ``torch.cuda.get_rng_state`` / ``_set_cuda_rng_state`` (``tensor_parallel/random.py``:
    ``_get_all_rng_states``, ``_set_all_rng_states``); on the CPU the device generator is the
    CPU one, whose state is what they save and restore. Its backward runs inside patch 1's mode."""
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda new_state, *a, **k: torch.set_rng_state(new_state)
    # its backward re-runs the forward with torch function modes off (as patch 8's all-to-all)
    bwd = mrandom.CheckpointFunction.__dict__["backward"]
    if not getattr(bwd, "_megatron_dapo_cpu_mode", False):
        mrandom.CheckpointFunction.backward = staticmethod(_in_cpu_mode(bwd.__func__))
        mrandom.CheckpointFunction.backward._megatron_dapo_cpu_mode = True


def apply_moe_cpu_patches() -> bool:
    """Patch 8 (megatron-core's MoE layer on the CPU). On a CUDA machine only the missing
    ``te_general_gemm`` name is defined, and only where transformer_engine does not import
    (the local spec on a GPU without TE fails the same way); with TE nothing changes.
    Returns True when the CPU patches are active."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    if cuda_available():
        return False
    apply_cpu_patches()
    from megatron.core.tensor_parallel import mappings
    from megatron.core.transformer.moe import token_dispatcher

    token_dispatcher.maybe_move_tensor_to_cpu = _host_tensor
    fwd = mappings._AllToAll.__dict__["forward"]
    if not getattr(fwd, "_megatron_dapo_cpu_mode", False):
        mappings._AllToAll.forward = staticmethod(_in_cpu_mode(fwd.__func__))
        mappings._AllToAll.forward._megatron_dapo_cpu_mode = True
    return moe_utils.te_general_gemm is None


def _in_cpu_mode(fn):
    """``fn`` run inside patch 1's mode when no torch function mode is active (a custom
    autograd Function's backward runs with the modes off)."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if torch._C._len_torch_function_stack() or _MODE_CLS is None:
            return fn(*args, **kwargs)
        with _MODE_CLS():
            return fn(*args, **kwargs)

    return wrapped


def _host_tensor(tensor, as_numpy: bool = False, record_stream: bool = False):
    """megatron's ``moe_utils.maybe_move_tensor_to_cpu`` as its GPU path behaves: a copy on the
    host, a numpy array when ``as_numpy`` (patch 8)."""
    if torch.is_tensor(tensor):
        tensor = tensor.detach().to("cpu", copy=True)
        if as_numpy:
            tensor = tensor.numpy()
    return tensor


# Collectives the strict mode checks (torch.distributed's names; calls from inside torch, e.g.
# all_gather_object's, are not checked: they pick the right device themselves).
STRICT_COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "_all_gather_base",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
    "all_to_all",
    "all_to_all_single",
    "batch_isend_irecv",
    "broadcast_object_list",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
)
_GROUP_KIND = weakref.WeakKeyDictionary()  # ProcessGroup -> ACCELERATOR / HOST
_STRICT = {"installed": False, "default": ACCELERATOR}


class StrictCollectiveError(RuntimeError):
    """A collective got a tensor on the side its group does not reduce on in production."""


def strict_installed() -> bool:
    return _STRICT["installed"]


def _kind_of_backend(backend) -> str:
    return HOST if backend is not None and str(backend).lower() == "gloo" else ACCELERATOR


def group_kind(group=None) -> str:
    """:data:`ACCELERATOR` (NCCL in production) or :data:`HOST` (gloo) for ``group``: as
    recorded by the strict mode (the backend the caller ASKED for: ``"gloo"`` makes a host
    group), else by the group's backend."""
    import torch.distributed as dist

    if _STRICT["installed"]:
        if group is None:
            return _STRICT["default"]
        kind = _GROUP_KIND.get(group)
        if kind is not None:
            return kind
        try:
            if group is dist.distributed_c10d._get_default_group():
                return _STRICT["default"]
        except Exception:
            pass
        return ACCELERATOR
    return ACCELERATOR if "nccl" in str(dist.get_backend(group)).lower() else HOST


def record_group(group, backend_asked) -> None:
    """Remember the production kind of ``group`` (created with ``backend=backend_asked``)."""
    import torch.distributed as dist

    if isinstance(group, dist.ProcessGroup):
        _GROUP_KIND[group] = _kind_of_backend(backend_asked)


def _refuse(name, kind, what, where) -> None:
    want = (
        "an accelerator (NCCL) group: create it on collective_device(group)"
        if kind == ACCELERATOR
        else "a host (gloo) group: it must be a CPU tensor"
    )
    raise StrictCollectiveError(f"strict collectives: dist.{name} at {where} got {what}, but the group is {want}")


def _check_tensor(name, kind, t, where) -> None:
    if cuda_available():
        if (t.device.type == "cuda") != (kind == ACCELERATOR):
            _refuse(name, kind, f"a tensor on {t.device}", where)
        return
    side, origin = tensor_side(t)
    if side is not None and side != kind:
        what = f"a host tensor (made by {origin})" if side == HOST else "an accelerator tensor"
        _refuse(name, kind, what, where)


def _check_call(name, sig, args, kwargs) -> None:
    try:
        bound = sig.bind(*args, **kwargs).arguments
    except TypeError:
        return  # torch raises its own error
    where = caller_location(2)
    if name == "batch_isend_irecv":
        for op in bound.get("p2p_op_list") or ():
            _check_tensor(name, group_kind(op.group), op.tensor, where)
        return
    kind = group_kind(bound.get("group"))
    if name.endswith("_object_list"):
        dev = bound.get("device")
        side = _side_of_device(dev) if dev is not None else None
        side = HOST if side is UNSAID else side  # the device the objects are moved to
        if side is not None and side != kind:
            _refuse(name, kind, f"device={dev}", where)
        return
    for key, v in bound.items():
        if key == "group":
            continue
        if isinstance(v, torch.Tensor):
            _check_tensor(name, kind, v, where)
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, torch.Tensor):
                    _check_tensor(name, kind, x, where)


def _wrap_collective(name, fn):
    import inspect

    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def strict(*args, **kwargs):
        if not sys._getframe(1).f_code.co_filename.startswith(_TORCH_DIR):  # torch's own calls pick their device
            _check_call(name, sig, args, kwargs)
        return fn(*args, **kwargs)

    strict.__wrapped_collective__ = fn
    return strict


def _wrap_new_group(fn):
    import inspect

    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def strict_new_group(*args, **kwargs):
        group = fn(*args, **kwargs)
        try:
            asked = sig.bind(*args, **kwargs).arguments.get("backend")
        except TypeError:
            asked = None
        record_group(group, asked)
        return group

    strict_new_group.__wrapped_collective__ = fn
    return strict_new_group


def install_strict_collectives(default_backend=None) -> bool:
    """The strict mode's collective side (when :func:`strict_collectives`): wrap
    torch.distributed's collectives and ``new_group``, and take the default group's
    production kind from the backend its creator asked for (None: the accelerator's).
    Called before the default group exists; idempotent. Returns whether the mode is on."""
    if not strict_collectives():
        return False
    _STRICT["default"] = _kind_of_backend(default_backend)
    if _STRICT["installed"]:
        return True
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    for name in STRICT_COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is not None and not hasattr(fn, "__wrapped_collective__"):
            setattr(dist, name, _wrap_collective(name, fn))
    # P2POp accepts only the functions c10d itself names isend/irecv: wrap those names too.
    for name in ("isend", "irecv"):
        c10d.__dict__[name] = getattr(dist, name)
    # new_subgroups* call c10d's new_group: wrap both names.
    wrapped = _wrap_new_group(c10d.new_group)
    dist.new_group = c10d.new_group = wrapped
    _STRICT["installed"] = True
    return True


def in_process_write_results() -> bool:
    """Patch 12: the write-results queue of megatron-core's synchronous checkpoint save is a
    ``queue.Queue`` of this process (before its first save; True when set here)."""
    import queue

    try:
        from megatron.core.dist_checkpointing.strategies import filesystem_async
    except ImportError:  # a release without the module: nothing to do
        return False
    if getattr(filesystem_async, "_results_queue", False) is not None:
        return False  # made already (a save before this call) or no such global
    filesystem_async._results_queue = queue.Queue()
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
