"""Weights broadcast over a collective group that the engines join (the sender's side).

The colocated sync hands each engine memory handles (hybrid/weight_sync.py). Engines on GPUs of
their own (asynchronous training, issue #40) are fed instead over a process group that the
trainer's sync rank and every engine's TP ranks form: the sender is rank 0, engine e's TP rank k
is rank ``offset_e + k``. The engine side is ``SGLangEngine.init_weights_update_group`` /
``update_weights_from_distributed`` (SGLang 0.5.23's own calls); this module is the sender's:

- :func:`open_weight_update_group`: the sender's member of the group. It must be made with
  SGLang's ``init_custom_process_group`` (a group of its own with its own store, apart from the
  trainer's world): a plain ``torch.distributed.init_process_group`` on the trainer's side
  hangs against the engines' members.
- :func:`bucket_entries` / :func:`broadcast_bucket`: one bucket, announced to the engines as
  (name, dtype, shape) entries and then broadcast tensor by tensor in that order. The engine's
  call blocks until it received them all, so the caller starts it (a Ray call, a thread) before
  broadcasting.

- :class:`BroadcastSink`: the weight sync's sink on the trainer's rank 0 when the engines have
  GPUs of their own (``--rollout-placement disaggregated``): each bucket is announced to every
  engine and broadcast once to all of them.

"gloo" runs it on CPUs (the tests, tests/rollout/test_sglang_cpu_engine.py), "nccl" on GPUs.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .bucket_sinks import BucketSink

Entry = Tuple[str, str, List[int]]


def open_weight_update_group(master_address: str, master_port: int, world_size: int, group_name: str, backend: str):
    """The sender's (rank 0's) member of the weight-update group; returns once every member joined."""
    from sglang.srt.utils.common import init_custom_process_group  # sglang: imported by a sender only

    return init_custom_process_group(
        backend=backend,
        init_method=f"tcp://{master_address}:{int(master_port)}",
        world_size=int(world_size),
        rank=0,
        group_name=group_name,
    )


def bucket_entries(bucket: Sequence[Tuple[str, torch.Tensor]]) -> List[Entry]:
    """(name, dtype name, shape) of each tensor: what the engines allocate to receive it."""
    return [(name, str(t.dtype).replace("torch.", ""), list(t.shape)) for name, t in bucket]


def broadcast_bucket(group, bucket: Sequence[Tuple[str, torch.Tensor]]) -> int:
    """Broadcast the bucket's tensors from rank 0 of ``group``, in order; returns the bytes sent."""
    sent = 0
    for _, t in bucket:
        t = t.detach().contiguous()
        dist.broadcast(t, src=0, group=group)
        sent += t.numel() * t.element_size()
    return sent


class BroadcastSink(BucketSink):
    """Rank 0's sink of a disaggregated sync: bucket ``i`` is announced to the engines
    (``receive(entries)`` starts their ``update_weights_from_distributed`` calls and returns
    what ``resolve`` waits on), broadcast over ``group``, and acknowledged before the buffer is
    reused (the engines copied it: ``lag`` 0). ``finish`` ends the engines' update. An error is
    kept and raised by ``finish`` (the broadcasts of the remaining buckets still run, so no
    member of the group waits forever)."""

    def __init__(
        self,
        group,
        receive: Callable[[List[Entry]], Any],
        resolve: Callable[[Any], Any],
        finish: Callable[[], Any],
        naming: Optional[str] = None,
    ):
        self.group, self.receive, self.resolve, self._finish = group, receive, resolve, finish
        self.naming = naming
        self.bytes = 0
        self.error: Optional[BaseException] = None

    def submit(self, index, views, flat):
        pending = self.receive(bucket_entries(views))
        self.bytes += broadcast_bucket(self.group, views)
        try:
            self.resolve(pending)
        except Exception as exc:  # noqa: BLE001 - reported by finish
            if self.error is None:
                self.error = exc

    def finish(self):
        if self.error is not None:
            raise self.error
        self._finish()
