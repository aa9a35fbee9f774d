"""An engine of TP k is fed by k trainer ranks, and EVERY one of them speaks the engine's protocol.

Two real feeder processes (gloo ranks 0 and 1, the product's ``EngineFeeding`` /
``PayloadSink`` / ``WeightSync``) sync a trained model in many buckets into a TP-2 SGLang
engine built from the pinned sglang 0.5.23 wheel's own code (tests/hybrid/sglang_feed_bodies.py):
each engine TP rank decodes its own feeder's payload with the wheel's ``deserialize_own_rank``
and ``SafeUnpickler``. Before the fix the second feeder serialized with our metadata class
(refused by SafeUnpickler) and ran a ring of 2 buffers while the first ran 3, so from the
third bucket on the two waited in different collectives (a hang).
"""

from __future__ import annotations

import pytest
import torch

from tests.hybrid import sglang_feed_bodies as bodies
from tests.tiny import tiny_qwen2_config


@pytest.fixture(scope="module")
def wheel():
    from tests.rollout import sglang_wheel as sw

    return sw.wheel()  # fetched (or found cached) once, before the pool's ranks read it


@pytest.mark.gloo
@pytest.mark.parametrize("tp", [1, 2])
def test_tp2_sglang_engine_decodes_every_feeders_payload(gloo, wheel, tp):
    outs = gloo(2).run(bodies.sglang_tp2_feed, tiny_qwen2_config(), tp, 16 * 1024, timeout=240)
    leader = outs[0]
    ref = leader["ref"]
    assert ref, "rank 0 holds the reference HF weights"
    for o in outs:
        # every feeder took SGLang's protocol (lag 1, SGLang's serializer and metadata class)
        assert all(p == outs[0]["protocols"][0] for p in o["protocols"]), o["protocols"]
        kind, lag, codec = o["protocols"][0]
        assert kind == "sglang" and lag == 1
        assert codec[0].endswith("MultiprocessingSerializer.serialize") and codec[1].endswith("FlattenedTensorMetadata")
        # on this CPU machine no feeder applies SGLang's CUDA reduction patch: under it a CPU
        # tensor does not pickle (rollout/payload.sglang_codec; a GPU machine applies it)
        assert o["patched"] == 0, f"rank {o['rank']} applied SGLang's CUDA reduction patch on a CPU machine"
        assert all(s["buckets"] >= 6 for s in o["stats"]), o["stats"]  # the ring wrapped around twice
    assert leader["finished"] and leader["sent"] == sum(s["buckets"] for s in leader["stats"])
    assert leader["metadata_types"] == ["FlattenedTensorMetadata"]
    assert leader["torn"] == [], "a feeder rewrote a buffer SGLang could still read"
    for r in range(2):  # engine TP rank r loaded the full model from trainer rank r's payloads
        got = leader["weights"][r]
        assert set(got) == set(ref), (r, sorted(set(ref) ^ set(got))[:5])
        for n, t in ref.items():
            assert got[n].dtype == t.dtype and torch.equal(got[n], t), (r, n)


@pytest.mark.gloo
def test_feeders_that_disagree_on_the_protocol_fail_instead_of_hanging(gloo):
    outs = gloo(2).run(bodies.disagreeing_feeders, tiny_qwen2_config(), 4096, timeout=120)
    for o in outs:
        assert o is not None and "feeders of engine 0 disagree on its protocol" in o, o
        assert "rank 0: kind hf, lag 1" in o and "rank 1: kind hf, lag 0" in o


def test_every_rank_of_an_engine_gets_its_protocol_only_the_first_its_calls(monkeypatch):
    from megatron_dapo.driver import actors
    from megatron_dapo.hybrid import weight_sync as ws

    made = []
    monkeypatch.setattr(
        ws.EngineProtocol, "for_engine", classmethod(lambda cls, kind: made.append(kind) or cls(kind=kind, lag=7))
    )
    handles = ["engine-0", None, "engine-2"]  # engine 1 is not synced this time
    args = [actors.feeder_args(r, 2, handles, "sglang", make_calls=lambda h, k: (h, k)) for r in range(6)]
    assert [a["engine_calls"] for a in args] == [("engine-0", "sglang"), None, None, None, ("engine-2", "sglang"), None]
    assert [a["engine_protocol"] is not None for a in args] == [True, True, False, False, True, True]
    assert all(a["engine_protocol"].lag == 7 for a in args if a["engine_protocol"] is not None)
    assert made == ["sglang"] * 4  # in every feeder process: SGLang's codec and its reduction patch
    assert [a["skip_engine"] for a in args] == [False, False, True, True, False, False]
    assert all(a["active_feeders"] == [0, 1, 4, 5] for a in args)
