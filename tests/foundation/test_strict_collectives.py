"""The strict-collectives test mode (megatron_dapo/platform.py, on for the suite by
tests/conftest.py): a collective refuses a tensor on the side its group does not reduce on in
production. On CPU everything is gloo and on the host, so without it a host tensor handed to
what is an NCCL group on a GPU (it raises there at the first such call) passes every test."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    os.environ.get("MEGATRON_DAPO_STRICT_COLLECTIVES", "").strip() in ("", "0"),
    reason="strict collectives turned off (MEGATRON_DAPO_STRICT_COLLECTIVES=0)",
)


def _refusal(fn) -> str:
    from megatron_dapo.platform import StrictCollectiveError

    try:
        fn()
    except StrictCollectiveError as e:
        return str(e)
    return ""


def _groups_body():
    """On every rank: what the mode refuses and lets through, on the default group, a group
    asked for without a backend, megatron's TP and gloo DP groups and an explicit gloo group."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from megatron_dapo import platform
    from megatron_dapo.distributed import collective_device, init_parallel

    assert platform.strict_installed()
    init_parallel(tensor_model_parallel_size=2)
    rank = dist.get_rank()
    acc = dist.new_group([0, 1])
    host = dist.new_group([0, 1], backend="gloo")
    tp, dp_gloo = ps.get_tensor_model_parallel_group(), ps.get_data_parallel_group_gloo()
    out = {
        "kinds": [platform.group_kind(g) for g in (None, acc, tp, host, dp_gloo)],
        "devices": [str(collective_device(g)) for g in (None, acc, tp, host, dp_gloo)],
        # refused: factory-made host tensors (and what is computed from them) on accelerator groups
        "factory": _refusal(lambda: dist.all_reduce(torch.tensor([rank + 1.0]))),
        "derived": _refusal(lambda: dist.all_reduce(torch.tensor([rank + 1]).float() * 2, group=acc)),
        "cpu_literal": _refusal(
            lambda: dist.all_gather(
                [torch.zeros(1, device=collective_device(tp)) for _ in range(2)], torch.zeros(1, device="cpu"), group=tp
            )
        ),
        "object_on_cpu": _refusal(lambda: dist.broadcast_object_list([rank], src=0, device=torch.device("cpu"))),
        # refused: an accelerator tensor on a host group
        "accel_to_host": _refusal(lambda: dist.all_reduce(torch.zeros(1, device=collective_device(acc)), group=host)),
        "cuda_to_gloo": _refusal(lambda: dist.broadcast(torch.zeros(1, device="cuda"), src=0, group=dp_gloo)),
    }
    # accepted: created on collective_device(group), moved there, or a host tensor on a gloo group
    t = torch.tensor([rank + 1.0], device=collective_device())
    dist.all_reduce(t)
    u = torch.tensor([rank + 1.0]).to(collective_device(tp))
    dist.all_reduce(u, group=tp)
    v = torch.tensor([rank + 1], dtype=torch.int64)
    dist.broadcast(v, src=1, group=host)
    w = torch.full((1,), rank + 1.0, device=collective_device(tp)) * 3
    dist.all_reduce(w, op=dist.ReduceOp.MAX, group=tp)
    out["accepted"] = [float(t), float(u), int(v), float(w)]
    return out


def test_strict_mode_refuses_host_tensors_on_accelerator_groups(gloo):
    from megatron_dapo import platform

    for r in gloo(2).run(_groups_body):
        A, H = platform.ACCELERATOR, platform.HOST
        assert r["kinds"] == [A, A, A, H, H]
        assert r["devices"] == ["cpu:0", "cpu:0", "cpu:0", "cpu", "cpu"]
        here = "tests/foundation/test_strict_collectives.py:"
        assert re.search(
            r"dist\.all_reduce at tests/foundation/test_strict_collectives\.py:\d+ got a host tensor "
            r"\(made by torch\.tensor\(\) without device= at tests/foundation/test_strict_collectives\.py:\d+\)"
            r", but the group is an accelerator \(NCCL\) group",
            r["factory"],
        ), r["factory"]
        assert "got a host tensor" in r["derived"] and here in r["derived"]
        assert "dist.all_gather" in r["cpu_literal"] and "zeros(device=cpu)" in r["cpu_literal"]
        assert "dist.broadcast_object_list" in r["object_on_cpu"] and "device=cpu" in r["object_on_cpu"]
        for key in ("accel_to_host", "cuda_to_gloo"):
            assert "got an accelerator tensor, but the group is a host (gloo) group" in r[key], r[key]
        assert r["accepted"] == [3.0, 3.0, 2, 6.0]


def _save_load_body(tmp: str):
    """A TP2 save and load of a tiny model (both all-reduce the padded vocabulary)."""
    from megatron_dapo.checkpoint.dist_ckpt import checkpoint_metadata, load_checkpoint, read_metadata, save_checkpoint
    from megatron_dapo.models import ModelBuildOptions, build_gpt_model
    from tests.checkpoint.bodies import allow_children
    from tests.foundation.bodies import build_from_hf
    from tests.tiny import tiny_qwen2_config

    allow_children()  # dist_checkpointing.save starts writer processes
    cfg = tiny_qwen2_config(vocab_size=300)
    _, model, arch, _ = build_from_hf(cfg, tp=2, pp=1)
    save_checkpoint(model, tmp, checkpoint_metadata(cfg))
    fresh, arch, _ = build_gpt_model(cfg, ModelBuildOptions())
    load_checkpoint(fresh, tmp, arch)
    same = all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), fresh.state_dict().values())
        if isinstance(a, torch.Tensor)
    )
    return read_metadata(tmp)["padded_vocab_size"], same


def test_checkpoint_save_and_load_pass_the_strict_mode(gloo, tmp_path):
    """The padded vocabulary used to be all-reduced as a host tensor over the default group
    (NCCL on a GPU: the first checkpoint raised); refused here on that code."""
    for vocab, same in gloo(2).run(_save_load_body, str(tmp_path / "ckpt")):
        assert vocab == 512 and same  # 300 padded to a multiple of 128 x TP2


# Every module of megatron_dapo that calls a torch.distributed collective, and the tests that
# run it under the strict mode (or why they cannot). A new module with collectives fails here
# until it is listed: check it hands each group a tensor on collective_device(group).
COLLECTIVE_MODULES = {
    "megatron_dapo/hybrid/weight_broadcast.py": "tests/rollout/test_sglang_cpu_engine.py (a gloo group with the real engine)",
    "megatron_dapo/rollout/hf_engine.py": "tests/rollout/test_version_stamps.py (the receiving side of a gloo broadcast; CPU tensors, the engine's own device)",
    "megatron_dapo/checkpoint/dist_ckpt.py": "tests/checkpoint/test_roundtrip.py, this file",
    "megatron_dapo/checkpoint/hf_export.py": "tests/training/test_export_hf.py (object collectives, barriers)",
    "megatron_dapo/checkpoint/model_io.py": "tests/checkpoint/test_roundtrip.py (TP export gather)",
    "megatron_dapo/distributed.py": "barrier; dp_token_counts: tests/training/test_trainer_device.py, tests/training",
    "megatron_dapo/hybrid/bucket_gather.py": "tests/hybrid/test_weight_sync.py (TP gathers), tests/moe/test_moe_sync.py (experts)",
    "megatron_dapo/hybrid/bucket_sinks.py": "tests/hybrid/test_transport.py, tests/hybrid/test_sglang_feeders.py",
    "megatron_dapo/hybrid/weight_sync.py": "tests/hybrid/test_weight_sync.py, tests/hybrid/test_transport.py",
    "megatron_dapo/models/attention.py": "tests/foundation/test_models.py (CP attention)",
    "megatron_dapo/training/dapo_step.py": "tests/training, tests/e2e",
    "megatron_dapo/training/logprobs.py": "tests/foundation/test_parallel_logits.py, tests/training",
    "megatron_dapo/training/routing_replay.py": "tests/moe/test_routing_replay.py (routing stats over TP/CP/PP)",
    "megatron_dapo/training/worker.py": "tests/e2e (barrier only)",
    "megatron_dapo/training/lora_export.py": "tests/training/test_lora.py (the adapters' TP all-gather on the "
    "params' device, the world's object gather: the adapter sync at TP 2)",
}
_COLLECTIVE = re.compile(
    r"\bdist\.(all_reduce|broadcast|all_gather|all_gather_into_tensor|reduce_scatter|reduce_scatter_tensor|reduce|"
    r"gather|scatter|send|recv|isend|irecv|barrier|all_to_all|all_to_all_single|batch_isend_irecv|"
    r"all_gather_object|broadcast_object_list|gather_object|scatter_object_list|send_object_list|recv_object_list)\("
)


def test_every_module_with_collectives_is_listed():
    found = set()
    for path in sorted((ROOT / "megatron_dapo").rglob("*.py")):
        if _COLLECTIVE.search(path.read_text()):
            found.add(str(path.relative_to(ROOT)))
    assert found == set(COLLECTIVE_MODULES), (
        f"modules with collectives not listed: {sorted(found - set(COLLECTIVE_MODULES))}; "
        f"listed without collectives: {sorted(set(COLLECTIVE_MODULES) - found)}"
    )
