"""HFEngine streaming (continuous batching, rollout/continuous.py) against its blocking
``generate``: the same tokens, each request returned as it ends, waiting requests admitted into
free slots, abort with prefixes, a continuation equal to the uninterrupted generation."""

from __future__ import annotations

import pytest

from megatron_dapo.rollout import SamplingParams
from megatron_dapo.rollout.base import Request, derive_seed
from megatron_dapo.rollout.hf_engine import HFEngine
from tests.rollout.helpers import PROMPTS, CharTokenizer, llama_config, qwen2_config, random_model

MORE = PROMPTS + [[3, 17, 29], [8, 9, 10, 11], [60, 61]]


@pytest.fixture(scope="module")
def ref():
    return random_model(qwen2_config())


def engine(ref, **kw):
    return HFEngine(ref.config, ref.state_dict(), **kw)


def drain(eng, n):
    """Poll until ``n`` requests ended: ({rid: output}, rids in the order they ended, polls per rid)."""
    got, order, when, polls = {}, [], {}, 0
    while len(got) < n:
        polls += 1
        assert polls < 1000
        for f in eng.poll(30.0):
            got[f.rid] = f.output
            order.append(f.rid)
            when[f.rid] = polls
    return got, order, when


@pytest.mark.parametrize("config", [qwen2_config, llama_config])
def test_greedy_stream_equals_blocking_generate_with_admissions_into_free_slots(config):
    model = random_model(config())
    eng = HFEngine(model.config, model.state_dict(), max_running=3)
    lens = [4, 12, 6, 3, 3, 12]
    block = [o[0] for o in eng.generate(MORE, SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True))]
    eng.submit(
        [
            Request(f"r{i}", p, SamplingParams(temperature=0.0, max_new_tokens=lens[i], ignore_eos=True))
            for i, p in enumerate(MORE)
        ]
    )
    got, order, _ = drain(eng, len(MORE))
    for i, b in enumerate(block):
        o = got[f"r{i}"]
        assert o.finish_reason == "length" and o.prompt_ids == MORE[i]
        assert o.output_ids == b.output_ids[: lens[i]], i  # token for token
        assert o.logprobs == pytest.approx(b.logprobs[: lens[i]], abs=1e-4)
    # 3 slots: r0 (4 tokens) ends first, r3 (3 tokens) takes its slot and ends before r1 (12)
    assert order.index("r0") < order.index("r3") < order.index("r1")
    assert len({t for b in block for t in b.output_ids}) > 5  # the paths are not degenerate
    assert eng._stream.outstanding == 0 and eng._stream.cache is None


def test_each_request_returns_as_it_ends(ref):
    eng = engine(ref, max_running=2)
    eng.submit(
        [
            Request("long", MORE[0], SamplingParams(temperature=0.0, max_new_tokens=10, ignore_eos=True)),
            Request("short", MORE[1], SamplingParams(temperature=0.0, max_new_tokens=2, ignore_eos=True)),
            Request("waits", MORE[2], SamplingParams(temperature=0.0, max_new_tokens=3, ignore_eos=True)),
        ]
    )
    first = eng.poll(30.0)
    assert [f.rid for f in first] == ["short"]
    assert len(eng._stream.rows) == 1 and len(eng._stream.waiting) == 1  # 'waits' gets the slot next step
    second = eng.poll(30.0)
    assert [f.rid for f in second] == ["waits"] and len(second[0].output.output_ids) == 3
    third = eng.poll(30.0)
    assert [f.rid for f in third] == ["long"]
    assert first[0].finished_at <= second[0].finished_at <= third[0].finished_at
    assert eng.poll(30.0) == []


def test_seeded_samples_equal_blocking_samples(ref):
    eng = engine(ref, max_running=4)
    n, seed = 3, 1234
    sp = SamplingParams(temperature=1.0, max_new_tokens=10, n=n, seed=seed)
    block = eng.generate(MORE, sp)
    # sample j of a blocking request seeded s = a streamed request seeded derive_seed(s, j)
    eng.submit(
        [
            Request(f"{i}.{j}", p, SamplingParams(temperature=1.0, max_new_tokens=10, seed=derive_seed(seed, j)))
            for i, p in enumerate(MORE)
            for j in range(n)
        ]
    )
    got, _, _ = drain(eng, len(MORE) * n)
    for i, outs in enumerate(block):
        for j, b in enumerate(outs):
            assert got[f"{i}.{j}"].output_ids == b.output_ids and got[f"{i}.{j}"].finish_reason == b.finish_reason
    assert len({tuple(o.output_ids) for o in block[0]}) > 1


def test_stop_tokens_and_stop_strings_like_blocking(ref):
    tok = CharTokenizer()
    eng = engine(ref, tokenizer=tok, max_running=2)
    free = [o[0] for o in eng.generate(MORE, SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True))]
    stop_tok = free[1].output_ids[2]
    stop_str = tok.decode(free[3].output_ids[3:5])
    params = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=[stop_tok], stop=[stop_str])
    block = [o[0] for o in eng.generate(MORE, params)]
    eng.submit([Request(f"r{i}", p, params) for i, p in enumerate(MORE)])
    got, _, _ = drain(eng, len(MORE))
    assert any(b.finish_reason == "stop" for b in block)
    for i, b in enumerate(block):
        o = got[f"r{i}"]
        assert (o.output_ids, o.finish_reason, o.text) == (b.output_ids, b.finish_reason, b.text), i


def test_abort_returns_prefixes_and_a_continuation_equals_the_uninterrupted_greedy_output(ref):
    eng = engine(ref, max_running=4)
    L = 12
    greedy = SamplingParams(temperature=0.0, max_new_tokens=L, ignore_eos=True)
    full = [o[0] for o in eng.generate(MORE, greedy)]
    eng.submit([Request(f"r{i}", p, greedy) for i, p in enumerate(MORE)])
    for _ in range(3):
        assert eng.poll(0.0) == []  # poll(0) runs one decode step
    cut = {f.rid: f.output for f in eng.abort_requests()}
    assert set(cut) == {f"r{i}" for i in range(len(MORE))} and eng._stream.outstanding == 0
    assert all(o.finish_reason == "abort" for o in cut.values())
    assert sorted(len(o.output_ids) for o in cut.values()) == [0, 0, 3, 3, 3, 3]  # 2 never got a slot
    for i, _p in enumerate(MORE):
        o = cut[f"r{i}"]
        assert o.output_ids == full[i].output_ids[: len(o.output_ids)]
        assert len(o.logprobs) == len(o.output_ids)
    eng.submit(
        [
            Request(
                f"c{i}",
                p + cut[f"r{i}"].output_ids,
                SamplingParams(temperature=0.0, max_new_tokens=L - len(cut[f"r{i}"].output_ids), ignore_eos=True),
            )
            for i, p in enumerate(MORE)
        ]
    )
    tail, _, _ = drain(eng, len(MORE))
    for i, f in enumerate(full):
        assert cut[f"r{i}"].output_ids + tail[f"c{i}"].output_ids == f.output_ids
        assert cut[f"r{i}"].logprobs + tail[f"c{i}"].logprobs == pytest.approx(f.logprobs, abs=1e-4)


def test_abort_some_keeps_the_others_running(ref):
    eng = engine(ref, max_running=4)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
    full = [o[0] for o in eng.generate(MORE[:3], greedy)]
    eng.submit([Request(f"r{i}", p, greedy) for i, p in enumerate(MORE[:3])])
    eng.poll(0.0)
    cut = eng.abort_requests(["r1", "unknown"])
    assert [f.rid for f in cut] == ["r1"] and cut[0].output.output_ids == full[1].output_ids[:1]
    got, _, _ = drain(eng, 2)
    assert got["r0"].output_ids == full[0].output_ids and got["r2"].output_ids == full[2].output_ids


def test_requests_are_checked_and_release_waits_for_them(ref):
    eng = engine(ref)
    with pytest.raises(ValueError, match="n=1"):
        eng.submit([Request("a", [1, 2], SamplingParams(n=2))])
    with pytest.raises(ValueError, match="empty prompt"):
        eng.submit([Request("a", [], SamplingParams())])
    with pytest.raises(ValueError, match="stop strings need"):
        eng.submit([Request("a", [1, 2], SamplingParams(stop=["x"]))])
    eng.submit([Request("a", [1, 2], SamplingParams(max_new_tokens=0)), Request("b", [1, 2], SamplingParams())])
    with pytest.raises(ValueError, match="already outstanding"):
        eng.submit([Request("b", [3], SamplingParams())])
    with pytest.raises(RuntimeError, match="2 streamed requests outstanding"):
        eng.release_memory(["kv_cache"])
    done = eng.poll(30.0)
    assert [(f.rid, f.output.output_ids, f.output.finish_reason) for f in done][:1] == [("a", [], "length")]
    eng.abort_requests()
    eng.release_memory(["kv_cache"])
    from megatron_dapo.rollout import EngineReleasedError

    with pytest.raises(EngineReleasedError):
        eng.submit([Request("c", [1, 2], SamplingParams())])


def test_rows_with_different_sampling_settings_share_the_batch(ref):
    eng = engine(ref, max_running=4)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=9, ignore_eos=True)
    hot = SamplingParams(temperature=1.3, max_new_tokens=9, ignore_eos=True, seed=99)
    want = {f"g{i}": eng.generate([p], greedy)[0][0].output_ids for i, p in enumerate(MORE[:3])}
    want.update({f"h{i}": eng.generate([p], hot)[0][0].output_ids for i, p in enumerate(MORE[:3])})
    eng.submit(
        [Request(f"{k}{i}", p, params) for i, p in enumerate(MORE[:3]) for k, params in (("g", greedy), ("h", hot))]
    )
    got, _, _ = drain(eng, 6)
    assert {k: o.output_ids for k, o in got.items()} == want
