"""Weight payloads by memory handles (rollout/payload.py) and per-engine feeding (PayloadSink).

Across real OS processes on the CPU: the payload carries handles to the sender's shared
memory, not bytes; the HFEngine loads exactly the payloads SGLang takes; 2 engines x 2 ranks
at TP2 x DP2, PP2 x DP2 and TP2 x PP2, each engine fed by its own group, probe on every
engine; the buffer ring honours the receiver's acknowledgement lag; an engine error raises
on its feeders without a hang.
"""

import base64
import os
import pickle
import subprocess
import sys
import types

import pytest
import torch

from megatron_dapo.rollout import payload as pl
from tests.hybrid import feed_bodies
from tests.tiny import random_hf_model, tiny_qwen2_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CHILD = r"""
import sys
import torch
from megatron_dapo.rollout.payload import load_payload, reconstruct_bucket
flat, meta = load_payload(sys.stdin.readline().strip())
t = dict(reconstruct_bucket(flat, meta))
print(float(t["w"].sum()), float(t["b"].float().sum()), flush=True)
t["w"][0, 0] = 1234.5  # the child writes into the sender's memory: shared, not copied
"""


def test_payload_is_a_handle_to_shared_memory_across_processes():
    pl.use_shared_memory_files()
    flat = torch.zeros(4 * 2**20, dtype=torch.uint8).share_memory_()  # a 4 MiB bucket buffer
    w = flat[:4096].view(torch.float32).view(32, 32)
    b = flat[4096:4096 + 64].view(torch.bfloat16)
    w.copy_(torch.arange(1024, dtype=torch.float32).view(32, 32))
    b.fill_(2)
    entries = pl.entries_in(flat, [("w", w), ("b", b)])
    (payload,) = pl.serialize_flat(flat, entries, 1)
    assert len(payload) < 4096 < flat.numel()  # handles and names, no tensor bytes
    want = str(float(w.sum()))
    out = subprocess.run([sys.executable, "-c", _CHILD], input=payload + "\n", capture_output=True, text=True,
                         cwd=ROOT, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [want, "64.0"]
    assert w[0, 0].item() == 1234.5


def test_entries_in_rejects_views_outside_or_unaligned():
    flat = torch.zeros(1024, dtype=torch.uint8)
    with pytest.raises(ValueError, match="not a contiguous view"):
        pl.entries_in(flat, [("x", torch.zeros(4))])
    with pytest.raises(ValueError, match="not a multiple"):
        pl.entries_in(flat, [("x", flat[4:20].view(torch.float32))])
    with pytest.raises(ValueError, match="not a contiguous view"):
        pl.entries_in(flat, [("x", flat[:256].view(torch.float32).view(8, 8).t())])


def test_load_payload_refuses_foreign_objects():
    evil = base64.b64encode(pickle.dumps({"flattened_tensor": os.getcwd, "metadata": []})).decode()
    with pytest.raises(pickle.UnpicklingError, match="posix.getcwd|not allowed"):
        pl.load_payload(evil)
    not_flat = pl.default_serializer({"flattened_tensor": torch.zeros(3), "metadata": []})
    with pytest.raises(ValueError, match="uint8"):
        pl.load_payload(not_flat)
    flat, entries = pl.flatten_bucket([("x", torch.ones(4))])
    entries[0].end_idx = entries[0].start_idx + 10_000
    entries[0].numel = 10_000
    with pytest.raises(ValueError, match="outside"):
        pl.load_payload(pl.serialize_flat(flat, entries, 1)[0])


def _engine(cfg, seed=99):
    from tests.hybrid.bodies import hf_config_obj

    from megatron_dapo.rollout.hf_engine import HFEngine

    torch.manual_seed(seed)
    return HFEngine(hf_config_obj(cfg))


def test_hf_engine_loads_every_feeders_payload():
    cfg = tiny_qwen2_config()
    sd = random_hf_model(cfg, seed=0).state_dict()
    engine = _engine(cfg)
    bucket = [(n, t) for n, t in sd.items()]
    good, keep = pl.serialize_bucket(bucket, 1)  # the sender keeps its buffers alive
    # a second feeder's copy with every tensor negated: tensor j comes from payload j mod 2
    neg, keep2 = pl.serialize_bucket([(n, -t) for n, t in bucket], 1)
    engine.update_weights_from_payloads([good[0], neg[0]])
    engine.finish_weight_update()
    for j, (n, t) in enumerate(bucket):
        assert torch.equal(engine.get_weight(n), t if j % 2 == 0 else -t), n
    other, keep3 = pl.serialize_bucket(bucket[:-1], 1)
    from megatron_dapo.rollout.base import WeightUpdateError

    with pytest.raises(WeightUpdateError, match="other tensors"):
        engine.update_weights_from_payloads([good[0], other[0]])


def test_sglang_codec_patches_the_senders_reductions(monkeypatch):
    patched = []

    class Meta:
        pass

    class Serializer:
        @staticmethod
        def serialize(obj, output_str=False):
            return "x"

    for name, attrs in {
        "sglang": {}, "sglang.srt": {}, "sglang.srt.utils": {},
        "sglang.srt.utils.common": {"MultiprocessingSerializer": Serializer},
        "sglang.srt.utils.patch_torch": {"monkey_patch_torch_reductions": lambda: patched.append(1)},
        "sglang.srt.weight_sync": {}, "sglang.srt.weight_sync.tensor_bucket": {"FlattenedTensorMetadata": Meta},
    }.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))
    ser, meta = pl.codec_for("sglang")
    assert ser is Serializer.serialize and meta is Meta and patched == [1]
    assert pl.codec_for("hf") == (pl.default_serializer, pl.BucketEntry)
    with pytest.raises(ValueError, match="unknown engine kind"):
        pl.codec_for("vllm")


def test_engine_feeders_layout():
    from megatron_dapo.hybrid.weight_sync import engine_feeders

    assert engine_feeders(4, 2) == [[0, 1], [2, 3]]
    assert engine_feeders(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="must divide"):
        engine_feeders(6, 4)


@pytest.mark.gloo
@pytest.mark.parametrize("lag", [0, 1])
def test_buffer_ring_waits_for_the_receivers_lag(gloo, lag):
    out = gloo(1).run(feed_bodies.buffer_lifetime, tiny_qwen2_config(), lag, 4096)[0]
    assert out["buckets"] >= 8 and out["sent"] == out["buckets"]
    assert out["violations"] == []  # no buffer rewritten while the receiver may read it
    assert out["max_in_flight"] >= 1  # the next bucket is prepared while one is in flight
    assert out["finished"] and out["resolved"] == out["buckets"] - 1


@pytest.mark.gloo
@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2), (2, 2)])
def test_two_engines_fed_by_their_own_ranks(gloo, tp, pp):
    cfg = tiny_qwen2_config()
    buckets = [2**30, 16 * 1024]  # one bucket per stage / many buckets
    outs = gloo(4).run(feed_bodies.feed_engines, cfg, tp, pp, 2, buckets, 1e-5)
    assert [o["engine"] for o in outs] == [0, 0, 1, 1] and [o["leader"] for o in outs] == [0, 0, 2, 2]
    ref = {}
    for o in outs:
        if o["ref"] is not None:
            ref.update(o["ref"])
    model_bytes = sum(t.numel() * t.element_size() for t in ref.values())
    for o in outs:
        for s in o["syncs"]:
            assert s["diff"] < 1e-5, s  # the probe passes on every engine
            assert s["bytes"] == model_bytes  # every feeder held the whole model, bucket by bucket
        if o["rank"] != o["leader"]:
            continue
        assert set(o["weights"]) == set(ref)
        for n, t in o["weights"].items():
            assert torch.equal(t, ref[n]), n
        for s in o["syncs"]:  # per feeder: a handle per bucket and a name per tensor, no tensor bytes
            assert s["crossed"] < 2 * 1024 * (len(ref) + s["buckets"]) < model_bytes, s


@pytest.mark.gloo
def test_engine_error_raises_on_its_feeders(gloo):
    outs = gloo(4).run(feed_bodies.failing_engine, tiny_qwen2_config(), 2, 1)
    assert "engine 0 failed to load the weights" in outs[0] and "refused bucket 1" in outs[0]
    assert "engine 0 failed" in outs[1]
    assert outs[2] is None and outs[3] is None  # the other replica's engine loaded fine
