"""Weight-update payloads: ONE serializer for every engine (SGLang's ``flattened_bucket`` form).

A payload is ``serializer({"flattened_tensor": flat, "metadata": [entry, ...]})`` where
``flat`` is a 1-D ``uint8`` tensor and each entry names a tensor inside it by byte offsets
(``name, shape, dtype, start_idx, end_idx, numel``; ``numel`` counts bytes), which is what
SGLang 0.5.23's ``update_weights_from_tensor(load_format="flattened_bucket")`` reads: one
payload per engine TP rank. The serializer is ``ForkingPickler`` (+ base64), so a tensor is
pickled through torch's multiprocessing reductions: a CUDA tensor becomes a CUDA IPC handle,
a CPU tensor a handle to shared memory. No tensor bytes are in the payload; the receiver maps
the sender's memory, so the sender must keep ``flat`` alive and untouched until the receiver
has copied from it (see docs/hybrid.md, "when a buffer may be reused").

Sender side: :func:`serialize_bucket` (copies the tensors into a new flat buffer) or
:func:`entries_in` + :func:`serialize_flat` (the tensors already are views of one flat buffer:
no copy; what the trainer's weight sync does). Receiver side (HFEngine; SGLang has its own):
:func:`load_payload` (a restricted unpickler: tensors, storages and the metadata class only)
and :func:`reconstruct_bucket`.

CPU shared memory: the trainer's bucket buffers are named files in ``/dev/shm`` of our own
(:func:`shared_cpu_buffer`); a payload names the file and the receiver maps it by name
(:func:`map_shared_file`). torch's own strategies do not serve here: file descriptors only
reach a child process, and the ``file_system`` strategy makes every receiver ask the
sender's ``torch_shm_manager`` over a socket with a short fixed timeout ("Shared memory
manager connection has timed out" on a loaded machine). Other CPU tensors still pickle
through torch's reductions (:func:`use_shared_memory_files` selects ``file_system``). GPU: SGLang's ``monkey_patch_torch_reductions`` must run in the sending process (CUDA
IPC handles then carry the device UUID, not the sender's device index); see
:func:`sglang_codec`.
"""

from __future__ import annotations

import atexit
import base64
import functools
import glob
import io
import itertools
import os
import pickle
import secrets
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.multiprocessing as torch_mp  # registers torch's tensor reductions with ForkingPickler

BUCKET_ALIGN_BYTES = 64


@dataclass
class BucketEntry:
    """Our description of one tensor in a flattened bucket (mirrors SGLang's
    FlattenedTensorMetadata: byte offsets into a uint8 buffer; ``numel`` is in bytes)."""

    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


def flatten_bucket(
    named_tensors: List[Tuple[str, torch.Tensor]], align: int = BUCKET_ALIGN_BYTES, shared_cpu: bool = False
) -> Tuple[torch.Tensor, List[BucketEntry]]:
    """Pack tensors (any dtypes) into one uint8 buffer on their device (on the CPU with
    ``shared_cpu``: a :func:`shared_cpu_buffer`, which :func:`default_serializer` sends by name).

    Each tensor starts at a multiple of ``align`` bytes so that SGLang's
    ``flat[start:end].view(dtype)`` is legal for every dtype (SGLang's own
    FlattenedTensorBucket packs without padding).
    """
    if not named_tensors:
        raise ValueError("cannot flatten an empty bucket")
    device = named_tensors[0][1].device
    entries, offset = [], 0
    for name, t in named_tensors:
        if t.device != device:
            raise ValueError(f"bucket mixes devices: {name!r} on {t.device}, first on {device}")
        nbytes = t.numel() * t.element_size()
        entries.append(BucketEntry(name, torch.Size(t.shape), t.dtype, offset, offset + nbytes, nbytes))
        offset += -(-nbytes // align) * align if nbytes else 0
    flat = (
        shared_cpu_buffer(max(offset, 1))
        if shared_cpu and device.type == "cpu"
        else torch.zeros(max(offset, 1), dtype=torch.uint8, device=device)
    )
    for e, (_, t) in zip(entries, named_tensors):
        if e.numel:
            flat[e.start_idx : e.end_idx].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
    return flat, entries


def entries_in(
    flat: torch.Tensor, named_views: Sequence[Tuple[str, torch.Tensor]], align: int = BUCKET_ALIGN_BYTES
) -> List[BucketEntry]:
    """Entries describing ``named_views``, contiguous views that already live inside ``flat``
    (a 1-D uint8 tensor): no copy. Raises ValueError for a view outside ``flat``, a
    non-contiguous view or a start not aligned to ``align`` bytes."""
    if flat.dim() != 1 or flat.dtype != torch.uint8:
        raise ValueError(f"flat must be a 1-D uint8 tensor, got {flat.dtype} of shape {tuple(flat.shape)}")
    base, size = flat.data_ptr(), flat.numel()
    out = []
    for name, t in named_views:
        nbytes = t.numel() * t.element_size()
        start = t.data_ptr() - base
        if t.device != flat.device or not t.is_contiguous() or start < 0 or start + nbytes > size:
            raise ValueError(f"{name!r} is not a contiguous view inside the flat buffer")
        if start % align:
            raise ValueError(f"{name!r} starts at byte {start}, not a multiple of {align}")
        out.append(BucketEntry(name, torch.Size(t.shape), t.dtype, start, start + nbytes, nbytes))
    return out


def reconstruct_bucket(flat: torch.Tensor, metadata) -> List[Tuple[str, torch.Tensor]]:
    """What SGLang's FlattenedTensorBucket.reconstruct_tensors does: views of ``flat``."""
    return [(m.name, flat[m.start_idx : m.end_idx].view(m.dtype).reshape(m.shape)) for m in metadata]


@functools.lru_cache(maxsize=None)
def _forking_pickler():
    class _Pickler(ForkingPickler):
        def reducer_override(self, obj):
            """A view of one of this process's :func:`shared_cpu_buffer` files pickles as its
            file name and range; everything else as ForkingPickler does."""
            if (
                isinstance(obj, torch.Tensor)
                and obj.device.type == "cpu"
                and obj.dtype == torch.uint8
                and obj.dim() == 1
                and obj.is_contiguous()
            ):
                known = _OWN_FILES.get(obj.untyped_storage().data_ptr())
                if known is not None:
                    return map_shared_file, (known[0], known[1], obj.storage_offset(), obj.numel())
            return NotImplemented

    return _Pickler


def default_serializer(obj, output_str: bool = True):
    """ForkingPickler [+ base64], the bytes of SGLang's MultiprocessingSerializer.serialize,
    except that a view of a :func:`shared_cpu_buffer` travels as its file name."""
    buf = io.BytesIO()
    _forking_pickler()(buf).dump(obj)
    data = buf.getvalue()
    return base64.b64encode(data).decode("utf-8") if output_str else data


def serialize_flat(
    flat: torch.Tensor,
    entries: Sequence[Any],
    copies: int,
    *,
    metadata_cls: Optional[Callable[..., Any]] = None,
    serializer: Callable[..., Any] = default_serializer,
) -> List[Any]:
    """``copies`` payloads (one per engine TP rank) of one flat buffer and its entries."""
    make = metadata_cls or BucketEntry
    metadata = [
        make(name=e.name, shape=e.shape, dtype=e.dtype, start_idx=e.start_idx, end_idx=e.end_idx, numel=e.numel)
        for e in entries
    ]
    payload = {"flattened_tensor": flat, "metadata": metadata}
    return [serializer(payload, output_str=True) for _ in range(int(copies))]


def serialize_bucket(
    named_tensors: List[Tuple[str, torch.Tensor]],
    tp_size: int,
    *,
    metadata_cls: Optional[Callable[..., Any]] = None,
    serializer: Callable[..., Any] = default_serializer,
) -> Tuple[List[Any], torch.Tensor]:
    """One payload per TP rank for ``update_weights_from_tensor(load_format="flattened_bucket")``.

    Each payload is ``serializer({"flattened_tensor": flat, "metadata": [metadata_cls(...)]})``.
    SGLang's unpickler only admits its own FlattenedTensorMetadata, so the adapter passes that
    class; tests pass a stand-in. Returns (payloads, flat): keep ``flat`` alive until SGLang
    has loaded the bucket (CUDA IPC handles point into it).
    """
    # our serializer sends a view of a shared_cpu_buffer by its file name (no dependence on torch's
    # process-wide sharing strategy); another serializer (SGLang's) pickles tensors its own way
    flat, entries = flatten_bucket(named_tensors, shared_cpu=serializer is default_serializer)
    payloads = serialize_flat(flat, entries, tp_size, metadata_cls=metadata_cls, serializer=serializer)
    return payloads, flat


# ------------------------------------------------------------------ receiver side ----
# What a payload of ours may reference: torch's tensor/storage rebuild functions, storage and
# dtype classes, and the metadata class. Anything else is refused (a payload is code).
_ALLOWED = {
    "torch.multiprocessing.reductions": {
        "rebuild_tensor",
        "rebuild_storage_filename",
        "rebuild_storage_fd",
        "rebuild_storage_empty",
        "rebuild_typed_storage",
        "rebuild_typed_storage_child",
        "rebuild_cuda_tensor",
        "rebuild_event",
        "rebuild_nested_tensor",
    },
    "torch._utils": {"_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_parameter"},
    "torch.storage": {"UntypedStorage", "TypedStorage", "_LegacyStorage"},
    "torch": {"Size", "UntypedStorage", "TypedStorage", "Tensor", "device"},
    "torch._tensor": {"Tensor"},
    "collections": {"OrderedDict"},
    "builtins": {"slice"},
    __name__: {"BucketEntry", "map_shared_file"},
}


class _PayloadUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if name in _ALLOWED.get(module, ()) or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"weight payload refers to {module}.{name}, which is not allowed")


def load_payload(payload) -> Tuple[torch.Tensor, list]:
    """A payload (base64 str or raw bytes) -> (flat tensor mapped from the sender, metadata)."""
    data = base64.b64decode(payload) if isinstance(payload, str) else bytes(payload)
    obj = _PayloadUnpickler(io.BytesIO(data)).load()
    if not isinstance(obj, dict) or set(obj) != {"flattened_tensor", "metadata"}:
        raise ValueError("weight payload is not a {'flattened_tensor', 'metadata'} dict")
    flat = obj["flattened_tensor"]
    if not isinstance(flat, torch.Tensor) or flat.dtype != torch.uint8 or flat.dim() != 1:
        raise ValueError("weight payload's flattened_tensor is not a 1-D uint8 tensor")
    for m in obj["metadata"]:
        if not (0 <= m.start_idx <= m.end_idx <= flat.numel()) or m.end_idx - m.start_idx != m.numel:
            raise ValueError(f"weight payload entry {m.name!r} lies outside the flat buffer")
    return flat, list(obj["metadata"])


def use_shared_memory_files() -> None:
    """Make CPU tensors pickle as named shared-memory files (any process of the node can open
    them), not as file descriptors (only a child process can receive those). Process-wide."""
    if torch_mp.get_sharing_strategy() != "file_system":
        torch_mp.set_sharing_strategy("file_system")


SHM_DIR = "/dev/shm"
SHM_PREFIX = "megatron_dapo"
_OWN_FILES: dict = {}  # storage data_ptr -> (path, nbytes) of this process's shared buffers
_COUNTER = itertools.count()
_MAPPED: "OrderedDict[tuple, torch.Tensor]" = OrderedDict()  # receiver: (path, nbytes) -> mapping
_MAPPED_KEEP = 16


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def shared_cpu_buffer(nbytes: int) -> torch.Tensor:
    """A 1-D uint8 CPU tensor of ``nbytes`` in a new file ``/dev/shm/megatron_dapo_<pid>_*``
    (``MAP_SHARED``), which any process of the node maps by name (:func:`map_shared_file`);
    payloads of views of it carry the name (:func:`default_serializer`). The file is unlinked
    when the tensor is freed or the process exits; ``Cluster.shutdown`` removes those of
    killed trainer processes (:func:`remove_shared_memory_files`)."""
    nbytes = max(int(nbytes), 1)
    path = os.path.join(SHM_DIR, f"{SHM_PREFIX}_{os.getpid()}_{next(_COUNTER)}_{secrets.token_hex(4)}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)
    t = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
    ptr = t.untyped_storage().data_ptr()
    _OWN_FILES[ptr] = (path, nbytes)
    weakref.finalize(t, _release_own, ptr, path)
    return t


def _release_own(ptr: int, path: str) -> None:
    _OWN_FILES.pop(ptr, None)
    _unlink(path)


@atexit.register
def _unlink_own_files() -> None:
    for path, _ in list(_OWN_FILES.values()):
        _unlink(path)


def is_shared_cpu_buffer(t: torch.Tensor) -> bool:
    """Whether ``t`` lives in one of this process's :func:`shared_cpu_buffer` files."""
    return t.device.type == "cpu" and t.untyped_storage().data_ptr() in _OWN_FILES


def map_shared_file(path: str, nbytes: int, offset: int, numel: int) -> torch.Tensor:
    """Receiver: bytes ``[offset, offset + numel)`` of the sender's buffer file ``path``, mapped
    (no copy, the sender's writes are visible). The last few mappings are kept, so the next
    bucket in the same buffer maps nothing new."""
    if os.path.dirname(os.path.abspath(path)) != SHM_DIR or not os.path.basename(path).startswith(SHM_PREFIX + "_"):
        raise ValueError(f"weight payload names {path!r}, not a megatron_dapo buffer in {SHM_DIR}")
    if not (0 <= offset <= offset + numel <= nbytes):
        raise ValueError(f"weight payload range [{offset}, {offset + numel}) lies outside {path} ({nbytes} bytes)")
    key = (path, int(nbytes))
    t = _MAPPED.get(key)
    if t is None:
        if not os.path.exists(path):
            raise FileNotFoundError(f"weight payload buffer {path} does not exist (its sender freed it or exited)")
        t = torch.from_file(path, shared=True, size=int(nbytes), dtype=torch.uint8)
        _MAPPED[key] = t
        while len(_MAPPED) > _MAPPED_KEEP:
            _MAPPED.popitem(last=False)
    else:
        _MAPPED.move_to_end(key)
    return t[offset : offset + numel]


def shared_memory_files(pid: int) -> List[str]:
    """The named shared-memory files of process ``pid`` on this node: its bucket buffers
    (``/dev/shm/megatron_dapo_<pid>_*``) and torch's ``file_system`` files (``torch_<pid>_*``)."""
    return sorted(
        glob.glob(os.path.join(SHM_DIR, f"torch_{int(pid)}_*"))
        + glob.glob(os.path.join(SHM_DIR, f"{SHM_PREFIX}_{int(pid)}_*"))
    )


def remove_shared_memory_files(pids: Sequence[int]) -> int:
    """Unlink the shared-memory files of ``pids`` (trainer processes that are being shut down);
    returns the bytes freed. Mappings that still exist stay valid; the name is what goes.

    A killed process unlinks nothing (nor does torch's ``torch_shm_manager``, which Ray kills
    with a worker), and the files (a bucket ring per feeder, the model's size each) would
    then hold the node's RAM until reboot."""

    freed = 0
    for pid in pids:
        for f in shared_memory_files(pid):
            try:
                size = os.path.getsize(f)
                os.unlink(f)
                freed += size
            except FileNotFoundError:
                pass
    return freed


def remove_stale_shared_memory_files() -> int:
    """Unlink the buffer files (``megatron_dapo_<pid>_*``) of processes of this node that no
    longer exist (a run that was SIGKILLed, driver and all); returns the bytes freed. Called
    when a cluster starts."""
    dead = set()
    for f in glob.glob(os.path.join(SHM_DIR, f"{SHM_PREFIX}_*")):
        pid = os.path.basename(f)[len(SHM_PREFIX) + 1 :].split("_", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            dead.add(int(pid))
    return remove_shared_memory_files(sorted(dead))


def sglang_codec():
    """(serializer, metadata class) of the pinned SGLang, for payloads SGLang will accept; on a
    GPU machine also patches this process's CUDA reductions the way SGLang's receiving side
    expects (CUDA IPC handles carry device UUIDs). Not on a CPU one: the patch rewrites every
    tensor reduction for CUDA tensors, and a CPU tensor no longer pickles under it."""
    from sglang.srt.utils.common import MultiprocessingSerializer  # sglang: imported by feeders only
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata

    if torch.cuda.is_available():
        monkey_patch_torch_reductions()
    return MultiprocessingSerializer.serialize, FlattenedTensorMetadata
