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
from megatron_dapo.rollout.engines import codec_for
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
    b = flat[4096 : 4096 + 64].view(torch.bfloat16)
    w.copy_(torch.arange(1024, dtype=torch.float32).view(32, 32))
    b.fill_(2)
    entries = pl.entries_in(flat, [("w", w), ("b", b)])
    (payload,) = pl.serialize_flat(flat, entries, 1)
    assert len(payload) < 4096 < flat.numel()  # handles and names, no tensor bytes
    want = str(float(w.sum()))
    out = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=payload + "\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [want, "64.0"]
    assert w[0, 0].item() == 1234.5


def _globals_in(payload: str) -> set:
    import pickletools

    ops = list(pickletools.genops(base64.b64decode(payload)))
    out, strings = set(), []
    for op, arg, _ in ops:
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif op.name == "STACK_GLOBAL":
            out.add(".".join(strings[-2:]))
        elif op.name == "GLOBAL":
            out.add(arg.replace(" ", "."))
    return out


def test_shared_cpu_buffer_travels_by_file_name_without_torch_shm_manager():
    """The trainer's CPU bucket buffers: a payload names the /dev/shm file (no torch
    reduction, so no torch_shm_manager socket with its fixed timeout), another process maps
    it by name, sees and writes the sender's bytes; the file goes when the buffer does."""
    import gc

    flat = pl.shared_cpu_buffer(4 * 2**20)
    path = pl._OWN_FILES[flat.untyped_storage().data_ptr()][0]
    assert os.path.exists(path) and os.path.basename(path).startswith(f"megatron_dapo_{os.getpid()}_")
    assert pl.is_shared_cpu_buffer(flat[:8]) and not pl.is_shared_cpu_buffer(torch.zeros(8, dtype=torch.uint8))
    w = flat[:4096].view(torch.float32).view(32, 32)
    b = flat[4096 : 4096 + 64].view(torch.bfloat16)
    w.copy_(torch.arange(1024, dtype=torch.float32).view(32, 32))
    b.fill_(2)
    (payload,) = pl.serialize_flat(flat[:8192], pl.entries_in(flat[:8192], [("w", w), ("b", b)]), 1)
    refs = _globals_in(payload)
    assert "megatron_dapo.rollout.payload.map_shared_file" in refs
    assert not any(r.startswith("torch.multiprocessing") for r in refs), refs
    out = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=payload + "\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(float(torch.arange(1024.0).sum())), "64.0"]
    assert w[0, 0].item() == 1234.5  # written by the other process into this one's buffer
    assert path in pl.shared_memory_files(os.getpid())
    del flat, w, b
    gc.collect()
    assert not os.path.exists(path)  # freed with the buffer


def test_map_shared_file_checks_what_a_payload_names(tmp_path):
    with pytest.raises(ValueError, match="not a megatron_dapo buffer"):
        pl.map_shared_file(str(tmp_path / "x"), 8, 0, 8)
    with pytest.raises(ValueError, match="not a megatron_dapo buffer"):
        pl.map_shared_file("/dev/shm/torch_1_2_3", 8, 0, 8)
    with pytest.raises(ValueError, match="outside"):
        pl.map_shared_file("/dev/shm/megatron_dapo_1_2_ab", 8, 4, 8)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        pl.map_shared_file("/dev/shm/megatron_dapo_1_2_ab", 8, 0, 8)


def test_shared_cpu_buffers_are_unlinked_at_exit_and_swept_after_a_kill():
    code = (
        "import os, signal, sys, torch; from megatron_dapo.rollout import payload as pl; "
        "bufs = [pl.shared_cpu_buffer(1 << 20) for _ in range(2)]; print(os.getpid(), flush=True); "
        "sys.stdin.readline(); os.kill(os.getpid(), signal.SIGKILL if sys.argv[1] == 'kill' else 0)"
    )
    for how in ("exit", "kill"):
        proc = subprocess.Popen(
            [sys.executable, "-c", code, how],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=ROOT),
        )
        try:
            pid = int(proc.stdout.readline())
            assert len(pl.shared_memory_files(pid)) == 2
            proc.stdin.write("\n")
            proc.stdin.flush()
            proc.wait(timeout=60)
        finally:
            proc.kill()
            proc.wait()
        if how == "exit":
            assert pl.shared_memory_files(pid) == []
        else:  # a SIGKILLed process unlinks nothing: the sweep of dead processes' files does
            assert len(pl.shared_memory_files(pid)) == 2
            mine = pl.shared_cpu_buffer(64)  # a live process's file stays
            assert pl.remove_stale_shared_memory_files() >= 2 << 20
            assert pl.shared_memory_files(pid) == [] and pl.is_shared_cpu_buffer(mine)
            assert len(pl.shared_memory_files(os.getpid())) >= 1


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
    from megatron_dapo.rollout.hf_engine import HFEngine
    from tests.hybrid.bodies import hf_config_obj

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
        "sglang": {},
        "sglang.srt": {},
        "sglang.srt.utils": {},
        "sglang.srt.utils.common": {"MultiprocessingSerializer": Serializer},
        "sglang.srt.utils.patch_torch": {"monkey_patch_torch_reductions": lambda: patched.append(1)},
        "sglang.srt.weight_sync": {},
        "sglang.srt.weight_sync.tensor_bucket": {"FlattenedTensorMetadata": Meta},
    }.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))
    ser, meta = codec_for("sglang")
    assert ser is Serializer.serialize and meta is Meta
    # this machine has no GPU: the CUDA reduction patch stays off (under it a CPU tensor does not
    # pickle); where CUDA is, the feeder applies it, as SGLang's receiving side expects
    assert patched == [] and not torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    codec_for("sglang")
    assert patched == [1]
    assert codec_for("hf") == (pl.default_serializer, pl.BucketEntry)
    with pytest.raises(ValueError, match="unknown engine kind"):
        codec_for("vllm")


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


def test_a_copied_buckets_payload_does_not_depend_on_the_process_wide_sharing_strategy():
    """serialize_bucket's CPU buffer is a named /dev/shm file of ours: its payload is the same
    kind of reference (a file name) whatever torch's sharing strategy is, so a receiver loads
    it in any test order (it used to carry a file descriptor under 'file_descriptor')."""
    import torch.multiprocessing as tmp

    before = tmp.get_sharing_strategy()
    bucket = [("w", torch.arange(12, dtype=torch.float32).view(3, 4)), ("b", torch.ones(5, dtype=torch.bfloat16))]
    try:
        for strategy in ("file_descriptor", "file_system"):
            tmp.set_sharing_strategy(strategy)
            payloads, keep = pl.serialize_bucket(bucket, 1)
            raw = base64.b64decode(payloads[0])
            assert b"DupFd" not in raw and b"map_shared_file" in raw, strategy
            flat, meta = pl.load_payload(payloads[0])
            got = dict(pl.reconstruct_bucket(flat, meta))
            assert torch.equal(got["w"], bucket[0][1]) and torch.equal(got["b"], bucket[1][1]), strategy
    finally:
        tmp.set_sharing_strategy(before)
