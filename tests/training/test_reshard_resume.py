"""Resume a trainer checkpoint (model + optimizer + LR schedule) on another layout.

A trainer on 2 gloo ranks (tiny random Qwen2, vocabulary 300: padded to 384 rows at TP1, 512 at
TP2, so a TP change also re-pads the embedding, the output layer and their optimizer state)
trains two DAPO optimizer steps and saves: the plain optimizer at TP1 x DP2, the distributed
one (``fully_reshardable`` state) at TP2 x DP1. Each checkpoint is resumed at three other
layouts of 2 ranks (TP, PP, CP, DP sizes below) and on 1 rank, and the third step's loss and
weights are compared with a resume at the saving layout.

Measured (fp32, lr 1e-3 in its warm-up, CPU): |dloss| <= 2.1e-9 and |dweight| <= 1.2e-7 in every
case; the control (the model only, a fresh optimizer and schedule) moves the weights by 6.7e-4.
Asserted: |dloss| <= 1e-6, |dweight| <= 2e-6, the same learning rate, the control >= 1e-4.
The same-layout resume itself is exact (bitwise: tests/e2e/test_resume.py for the plain
optimizer, ``test_same_layout_resume_is_exact`` here for the distributed one).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from megatron_dapo.checkpoint import dist_ckpt
from tests.tiny import tiny_qwen2_config
from tests.training import reshard_bodies as bodies

pytestmark = [pytest.mark.gloo, pytest.mark.slow]

CFG = tiny_qwen2_config(vocab_size=300)
LOSS_TOL, WEIGHT_TOL = 1e-6, 2e-6

# the saving layout of each optimizer (2 ranks), and the layouts it is resumed at:
# name -> (world size, layout)
SAVED_AT = {"plain": {"tp": 1}, "distributed": {"tp": 2, "dist_opt": True}}
TARGETS = {
    "plain": {
        "TP1xDP2->TP2xDP1": (2, {"tp": 2}),
        "TP1xDP2->PP2xDP1": (2, {"pp": 2}),
        "TP1xDP2->CP2xDP1": (2, {"cp": 2}),
        "TP1xDP2->DP1 (2 ranks -> 1)": (1, {}),
    },
    "distributed": {
        "TP2xDP1->TP1xDP2": (2, {}),
        "TP2xDP1->PP2xDP1": (2, {"pp": 2}),
        "TP2xDP1->CP2xDP1": (2, {"cp": 2}),
        "TP2xDP1->TP1 (2 ranks -> 1)": (1, {}),
    },
}
CASES = [(o, t) for o in TARGETS for t in TARGETS[o]]


def _loss(outs) -> float:
    """The step's policy loss as the driver reduces it: (sum, count) over the DP reporters."""
    s = sum(o["sums"]["pg_loss"][0] for o in outs if o["reporter"])
    c = sum(o["sums"]["pg_loss"][1] for o in outs if o["reporter"])
    return s / c


def _weights(outs) -> dict:
    w = {}
    for o in outs:
        w.update(o["weights"] or {})
    return w


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def saved(gloo, tmp_path_factory):
    """{optimizer: (checkpoint dir, the same-layout resume's outputs)}."""
    root = tmp_path_factory.mktemp("reshard")
    out = {}
    for name, layout in SAVED_AT.items():
        ck = str(root / name)
        gloo(2).run(bodies.save_trained, CFG, layout, ck, timeout=600)
        out[name] = (ck, gloo(2).run(bodies.resume_and_step, CFG, layout, ck))
    return out


def test_layout_is_recorded(saved):
    assert dist_ckpt.read_metadata(saved["plain"][0])["layout"] == {
        "tp": 1,
        "pp": 1,
        "cp": 1,
        "dp": 2,
        "world_size": 2,
        "nodes": 1,
        "distributed_optimizer": False,
        "optimizer_format": "per_parameter",
    }
    assert dist_ckpt.read_metadata(saved["distributed"][0])["layout"] == {
        "tp": 2,
        "pp": 1,
        "cp": 1,
        "dp": 1,
        "world_size": 2,
        "nodes": 1,
        "distributed_optimizer": True,
        "optimizer_format": "fully_reshardable",
    }


@pytest.mark.parametrize("optimizer,target", CASES, ids=[f"{o}-{t}" for o, t in CASES])
def test_resume_on_another_layout_matches_the_same_layout(gloo, saved, optimizer, target):
    ck, ref = saved[optimizer]
    world, layout = TARGETS[optimizer][target]
    got = gloo(world).run(bodies.resume_and_step, CFG, dict(layout, dist_opt=optimizer == "distributed"), ck)
    dloss, dw = abs(_loss(got) - _loss(ref)), _max_diff(_weights(got), _weights(ref))
    print(f"[reshard] {optimizer} optimizer {target}: |dloss| {dloss:.2e} |dweight| {dw:.2e}")
    assert got[0]["lr"] == ref[0]["lr"]  # the LR schedule resumed (mid warm-up)
    assert got[0]["grad_norm"] == pytest.approx(ref[0]["grad_norm"], rel=1e-6)
    assert dloss <= LOSS_TOL and dw <= WEIGHT_TOL, (dloss, dw)


def test_without_the_optimizer_state_the_weights_differ(gloo, saved):
    """The control: the tolerance is far below what a lost optimizer state and schedule do."""
    ck, ref = saved["plain"]
    got = gloo(2).run(bodies.resume_and_step, CFG, {}, ck, load_optimizer=False)
    assert _max_diff(_weights(got), _weights(ref)) >= 1e-4
    assert got[0]["lr"] < ref[0]["lr"]  # a fresh warm-up


def test_same_layout_resume_is_exact(gloo, saved):
    """The distributed optimizer's resume at the saving layout equals three steps without a
    checkpoint, bitwise (megatron-core gave every parameter ONE shared Adam step tensor: 2 -> 18)."""
    ck, ref = saved["distributed"]
    straight = gloo(2).run(bodies.train_straight, CFG, SAVED_AT["distributed"])
    assert _max_diff(_weights(straight), _weights(ref)) == 0.0


def test_old_checkpoint_without_layout_loads_at_its_layout(gloo, saved, tmp_path):
    """A checkpoint written before the layout was recorded resumes at its layout, exactly."""
    ck, ref = saved["plain"]
    old = str(tmp_path / "old")
    shutil.copytree(ck, old)
    path = os.path.join(old, dist_ckpt.METADATA_FILE)
    with open(path) as f:
        meta = json.load(f)
    del meta["layout"]
    with open(path, "w") as f:
        json.dump(meta, f)
    got = gloo(2).run(bodies.resume_and_step, CFG, {}, old)
    assert _max_diff(_weights(got), _weights(ref)) == 0.0


def test_switching_the_distributed_optimizer_is_refused(gloo, saved):
    errs = gloo(2).run(bodies.load_error, CFG, {"dist_opt": True}, saved["plain"][0])  # saved without it
    for e in errs:
        assert e and "cannot resume" in e and "distributed optimizer off" in e and "--use-distributed-optimizer" in e, e


# ---------------------------------------------------------------- incomplete checkpoints


def _copy(src, dst) -> str:
    shutil.copytree(src, dst)
    return str(dst)


def test_truncated_distcp_is_one_checkpoint_error(gloo, saved, tmp_path):
    ck = _copy(saved["plain"][0], tmp_path / "cut")
    shard = sorted(n for n in os.listdir(ck) if n.endswith(".distcp"))[-1]
    size = os.path.getsize(os.path.join(ck, shard))
    with open(os.path.join(ck, shard), "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(dist_ckpt.CheckpointError) as e:
        dist_ckpt.verify_checkpoint_files(ck)
    msg = str(e.value)
    assert msg.startswith(f"{ck}: incomplete checkpoint") and f"{shard} truncated ({size // 2} of {size} bytes)" in msg
    assert "--load" in msg and "\n" not in msg
    errs = gloo(2).run(bodies.load_error, CFG, {}, ck)  # the trainer's load: the same error on every rank
    assert errs == [msg, msg], errs


def test_missing_metadata_is_one_checkpoint_error(gloo, saved, tmp_path):
    ck = _copy(saved["plain"][0], tmp_path / "nometa")
    os.remove(os.path.join(ck, ".metadata"))
    errs = gloo(2).run(bodies.load_error, CFG, {}, ck)
    for e in errs:
        assert e and e.startswith(f"{ck}: incomplete checkpoint, .metadata") and "is missing" in e and "--load" in e, e


# ---------------------------------------------------------------- megatron-core versions


def _installed_release() -> tuple:
    return dist_ckpt._release(dist_ckpt.megatron_core_version())


def test_a_checkpoint_records_the_megatron_core_version_that_wrote_it(saved):
    from importlib.metadata import version

    meta = dist_ckpt.read_metadata(saved["plain"][0])
    assert meta["megatron_core_version"] == version("megatron-core")
    want = "inline" if _installed_release() >= dist_ckpt.INLINE_COMMON_STATE_SINCE else "common.pt"
    assert dist_ckpt.common_state_layout(saved["plain"][0]) == want


def test_missing_common_state_is_one_checkpoint_error(saved, tmp_path):
    ck = _copy(saved["plain"][0], tmp_path / "nocommon")
    if dist_ckpt.common_state_layout(ck) != "common.pt":
        pytest.skip("the installed megatron-core keeps the common state inside the .distcp files")
    os.remove(os.path.join(ck, "common.pt"))
    with pytest.raises(dist_ckpt.CheckpointError) as e:
        dist_ckpt.verify_checkpoint_files(ck)
    msg = str(e.value)
    assert msg.startswith(f"{ck}: incomplete checkpoint, common.pt (the non-tensor state) is missing"), msg
    assert "--load" in msg and "\n" not in msg


def _in_the_019_layout(src: str, dst: str, written_by: str) -> str:
    """``src`` rewritten the way megatron-core 0.19 lays a checkpoint out: every entry of its
    ``.metadata`` index plus the common state as one ``common_state`` sharded object in the
    ``.distcp`` files (0.19's ``load_common_state_dict`` reads ``torch.load(bytes)[0]``), no
    ``common.pt``; our metadata names ``written_by``."""
    import io

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    md = dcp.FileSystemReader(src).read_metadata()
    sd = {
        k: io.BytesIO() if isinstance(m, BytesStorageMetadata) else torch.empty(m.size, dtype=m.properties.dtype)
        for k, m in md.state_dict_metadata.items()
    }
    dcp.load(sd, storage_reader=dcp.FileSystemReader(src), no_dist=True)
    buf = io.BytesIO()
    torch.save([torch.load(os.path.join(src, "common.pt"), weights_only=False)], buf)
    sd[dist_ckpt.INLINE_COMMON_STATE_KEY] = buf
    os.makedirs(dst)
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(dst), no_dist=True)
    shutil.copy(os.path.join(src, "metadata.json"), dst)
    with open(os.path.join(src, dist_ckpt.METADATA_FILE)) as f:
        meta = json.load(f)
    with open(os.path.join(dst, dist_ckpt.METADATA_FILE), "w") as f:
        json.dump({**meta, "megatron_core_version": written_by}, f)
    return dst


def test_a_checkpoint_in_megatron_core_019s_layout(gloo, saved, tmp_path):
    """Read by the layout's own index: found as "inline"; on a megatron-core before 0.19 (which
    reads only common.pt) one line naming both releases, the same on every rank of the
    trainer's load, instead of a FileNotFoundError from inside megatron-core."""
    src = saved["plain"][0]
    if not os.path.exists(os.path.join(src, "common.pt")):
        pytest.skip("the installed megatron-core writes the 0.19 layout itself")
    ck = _in_the_019_layout(src, str(tmp_path / "mc019"), "0.19.2")
    assert not os.path.exists(os.path.join(ck, "common.pt"))
    assert dist_ckpt.common_state_layout(ck) == "inline"
    if _installed_release() >= dist_ckpt.INLINE_COMMON_STATE_SINCE:
        dist_ckpt.verify_checkpoint_files(ck)  # readable here
        return
    with pytest.raises(dist_ckpt.CheckpointError) as e:
        dist_ckpt.verify_checkpoint_files(ck)
    msg = str(e.value)
    here = dist_ckpt.megatron_core_version()
    assert msg.startswith(f"{ck}: written by megatron-core 0.19.2") and f"megatron-core {here} here" in msg, msg
    assert "megatron-core >= 0.19" in msg and "\n" not in msg
    errs = gloo(2).run(bodies.load_error, CFG, {}, ck)  # the trainer's load: the same line on every rank
    assert errs == [msg, msg], errs
