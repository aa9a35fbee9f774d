"""Every generated token carries the weight version that produced it (issue 40): a weight update
between two polls of a running request (what asynchronous training does) leaves the tokens
before it of the old version and those after of the new one; the driver keeps the engine's
stamps. HFEngine's continuous batching, a real (tiny) model, a real weight update."""

from __future__ import annotations

import pytest
import torch

from megatron_dapo.driver.batch import Sample
from megatron_dapo.driver.rollout_manager import extend_sample
from megatron_dapo.rollout import SamplingParams
from megatron_dapo.rollout.base import Request
from megatron_dapo.rollout.hf_engine import HFEngine
from tests.rollout.helpers import PROMPTS, qwen2_config, random_model


@pytest.fixture(scope="module")
def ref():
    return random_model(qwen2_config())


def _greedy(n):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


def test_an_update_mid_request_splits_its_tokens_between_two_versions(ref):
    eng = HFEngine(ref.config, ref.state_dict(), max_running=4)
    eng.set_weight_version(3)
    eng.submit([Request("a", PROMPTS[0], _greedy(10)), Request("b", PROMPTS[1], _greedy(10))])
    for _ in range(4):  # a poll with no time left runs one step: one token per running request
        assert eng.poll(0.0) == []
    # the trainer's next weights, while both requests run: every tensor moved
    new = [(name, t + 0.05 * torch.randn_like(t)) for name, t in ref.state_dict().items()]
    eng.update_weights(new)
    eng.finish_weight_update()
    eng.set_weight_version(4)
    eng.submit([Request("c", PROMPTS[2], _greedy(5))])  # admitted after the update: all of version 4
    got = {}
    while len(got) < 3:
        for f in eng.poll(30.0):
            got[f.rid] = f.output
    for rid in ("a", "b"):
        o = got[rid]
        assert len(o.token_versions) == len(o.output_ids) == 10  # no token unmarked
        assert o.token_versions == [3] * 4 + [4] * 6, o.token_versions
    assert got["c"].token_versions == [4] * 5
    # the stamps are true: the first 4 tokens are the old weights' greedy ones, the rest differ
    old = HFEngine(ref.config, ref.state_dict()).generate([PROMPTS[0]], _greedy(10))[0][0]
    assert got["a"].output_ids[:4] == old.output_ids[:4]
    with pytest.raises(ValueError, match="older than the engine's 4"):
        eng.set_weight_version(3)


def test_an_aborted_prefix_keeps_its_stamps_and_an_engine_never_told_stamps_nothing(ref):
    eng = HFEngine(ref.config, ref.state_dict(), max_running=2)
    eng.submit([Request("x", PROMPTS[0], _greedy(8))])
    eng.poll(0.0)
    eng.poll(0.0)
    (f,) = eng.abort_requests(["x"])
    assert f.output.finish_reason == "abort" and f.output.token_versions is None  # no version was set
    eng.set_weight_version(7)
    eng.submit([Request("y", PROMPTS[1], _greedy(8))])
    eng.poll(0.0)
    eng.poll(0.0)
    (f,) = eng.abort_requests(["y"])
    assert f.output.token_versions == [7, 7] and len(f.output.output_ids) == 2


def test_the_driver_keeps_the_engines_stamps_and_stamps_the_rest_with_its_step(ref):
    eng = HFEngine(ref.config, ref.state_dict())
    eng.set_weight_version(5)
    eng.submit([Request("s", PROMPTS[0], _greedy(6))])
    out = []
    while not out:
        out = eng.poll(30.0)
    s = Sample(0, list(PROMPTS[0]), [1, 2], [-0.1, -0.2], "abort", "4", token_versions=[3, 4])
    extend_sample(s, out[0].output, step=9, max_len=100)
    assert s.token_versions == [3, 4] + [5] * 6  # the engine's, not the driver's step
    out[0].output.token_versions = None  # an engine that does not stamp (SGLang today)
    t = Sample(0, list(PROMPTS[0]), [], [], "abort", "4", token_versions=[])
    extend_sample(t, out[0].output, step=9, max_len=4)
    assert t.token_versions == [9] * 4


def test_a_broadcast_into_a_generating_engine_keeps_its_requests_and_stamps_every_token(ref, tmp_path):
    """The asynchronous path's update: the trainer's sync rank (a process of its own,
    hybrid/weight_broadcast.py, over gloo) broadcasts new weights into an HFEngine whose two
    requests are half-way and keep decoding while it arrives: the tensors are held aside until
    ``finish_weight_update``, so every token before it is the old weights' (version 3, the old
    greedy path), those after are decoded by the new weights (version 4), none unmarked; the
    requests are kept, not aborted; a request admitted after the update is exactly what an engine built on the
    broadcast weights generates."""
    import threading

    from megatron_dapo.hybrid.weight_broadcast import bucket_entries
    from megatron_dapo.ports import free_port
    from tests.rollout.broadcast_sender import Sender

    eng = HFEngine(ref.config, ref.state_dict(), max_running=4)
    eng.set_weight_version(3)
    port = free_port()
    with Sender(port, 2, "stamps-test") as sender:
        eng.init_weights_update_group("127.0.0.1", port, 1, 2, "stamps-test", "gloo")
        sender.joined()
        eng.submit([Request("a", PROMPTS[0], _greedy(10)), Request("b", PROMPTS[1], _greedy(10))])
        for _ in range(4):  # four decode steps: four tokens of version 3 each
            assert eng.poll(0.0) == []
        gen = torch.Generator().manual_seed(4)
        new = {n: t + 0.05 * torch.randn(t.shape, generator=gen) for n, t in ref.state_dict().items()}
        bucket = list(new.items())
        torch.save(bucket, tmp_path / "bucket.pt")
        got: list = []

        def receive():
            try:
                eng.update_weights_from_distributed(bucket_entries(bucket), "stamps-test")
                got.append("ok")
            except Exception as e:  # noqa: BLE001 - asserted below
                got.append(e)

        t = threading.Thread(target=receive)
        t.start()  # the engine's call returns once every tensor arrived
        sender.send(tmp_path / "bucket.pt")
        for _ in range(2):  # the engine keeps decoding while the broadcast arrives, with the old weights
            assert eng.poll(0.0) == []
        sender.sent()
        t.join(timeout=120)
        assert got == ["ok"], got
        assert eng.poll(0.0) == []  # received, held aside: still the old weights
        eng.finish_weight_update()  # loaded here, between two decode steps
        eng.set_weight_version(4)
        eng.submit([Request("c", PROMPTS[2], _greedy(6))])  # admitted after the update
        outs = {}
        while len(outs) < 3:
            for f in eng.poll(30.0):
                outs[f.rid] = f.output
        eng.destroy_weights_update_group("stamps-test")
    assert {o.finish_reason for o in outs.values()} == {"length"}  # kept through the update, not aborted
    # the weights that arrived are exactly the broadcast ones: a request admitted after the
    # update is the greedy output of an engine built on them
    fresh = HFEngine(ref.config, new)
    assert outs["c"].token_versions == [4] * 6
    assert outs["c"].output_ids == fresh.generate([PROMPTS[2]], _greedy(6))[0][0].output_ids
    old_engine = HFEngine(ref.config, ref.state_dict())
    for rid, prompt in (("a", PROMPTS[0]), ("b", PROMPTS[1])):
        o = outs[rid]
        assert o.token_versions == [3] * 7 + [4] * 3, o.token_versions
        before = old_engine.generate([prompt], _greedy(10))[0][0].output_ids
        assert o.output_ids[:7] == before[:7]  # the old weights' tokens, also while the broadcast arrived
        # after it the new weights decode (over the prefix's cache, kept from the old ones)
        assert o.output_ids[7:] != before[7:], (rid, o.output_ids, before)
