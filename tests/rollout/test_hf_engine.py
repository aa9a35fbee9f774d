"""HFEngine: sampling, logprobs, weight updates, memory release (tiny random models, CPU)."""

from __future__ import annotations

import threading

import pytest
import torch

from megatron_dapo.rollout import EngineReleasedError, SamplingParams, WeightUpdateError
from megatron_dapo.rollout.hf_engine import HFEngine
from tests.rollout.helpers import EOS, PROMPTS, CharTokenizer, llama_config, qwen2_config, random_model


@pytest.fixture
def ref():
    return random_model(qwen2_config())


@pytest.fixture
def engine(ref):
    return HFEngine(ref.config, ref.state_dict())


def hf_greedy(model, prompt, max_new_tokens, eos=None):
    ids = torch.tensor([prompt])
    kw = dict(do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=0, attention_mask=torch.ones_like(ids))
    if eos is None:
        kw.update(min_new_tokens=max_new_tokens, eos_token_id=None)
    else:
        kw.update(eos_token_id=eos)
    with torch.no_grad():
        out = model.generate(ids, **kw)
    return out[0, len(prompt) :].tolist()


def direct_logprobs(model, seq):
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0].float()
    return torch.log_softmax(logits, -1)


# ---------------------------------------------------------------------------- sampling
def test_greedy_equals_transformers_generate(ref, engine):
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True))
    assert len(outs) == len(PROMPTS)
    for p, o in zip(PROMPTS, outs):
        assert len(o) == 1 and o[0].prompt_ids == p
        assert o[0].output_ids == hf_greedy(ref, p, 12)
        assert o[0].finish_reason == "length"
    # the greedy paths are not degenerate (the test would be weak otherwise)
    assert len({t for o in outs for t in o[0].output_ids}) > 5


def test_greedy_with_eos_equals_transformers_generate(ref):
    # pick an EOS that greedy decoding actually reaches for prompt 0 but not at once
    free = HFEngine(ref.config, ref.state_dict(), eos_token_ids=[])
    path = free.generate([PROMPTS[0]], SamplingParams(temperature=0, max_new_tokens=12))[0][0].output_ids
    eos = path[4]
    eng = HFEngine(ref.config, ref.state_dict(), eos_token_ids=[eos])
    out = eng.generate([PROMPTS[0]], SamplingParams(temperature=0, max_new_tokens=12))[0][0]
    cut = path.index(eos)
    assert out.output_ids == path[: cut + 1] == hf_greedy(ref, PROMPTS[0], 12, eos=eos)
    assert out.finish_reason == "stop" and out.output_ids[-1] == eos
    assert len(out.logprobs) == len(out.output_ids)


def test_stop_token_ids_and_ignore_eos(ref, engine):
    path = engine.generate([PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True))[0][0]
    stop = path.output_ids[3]
    out = engine.generate([PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=10, stop_token_ids=[stop]))[0][0]
    first = path.output_ids.index(stop)
    assert out.output_ids == path.output_ids[: first + 1] and out.finish_reason == "stop"
    # ignore_eos keeps explicit stop_token_ids
    out2 = engine.generate(
        [PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=10, stop_token_ids=[stop], ignore_eos=True)
    )[0][0]
    assert out2.output_ids == out.output_ids


def test_config_eos_stops_sampling(ref, engine):
    assert engine.eos_token_ids == [EOS]
    # a high temperature makes the distribution nearly uniform: some of ~900 draws hit EOS
    outs = engine.generate(PROMPTS, SamplingParams(temperature=5.0, max_new_tokens=100, n=3, seed=1))
    stopped = [o for group in outs for o in group if o.finish_reason == "stop"]
    assert stopped, "no sample reached EOS"
    for group in outs:
        for o in group:
            assert EOS not in o.output_ids[:-1]
            assert (o.output_ids[-1] == EOS) == (o.finish_reason == "stop")
            assert o.finish_reason == "stop" or len(o.output_ids) == 100


def test_max_new_tokens_and_length(engine):
    outs = engine.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=7, n=2, ignore_eos=True, seed=0))
    for group in outs:
        for o in group:
            assert len(o.output_ids) == 7 == len(o.logprobs)
            assert o.finish_reason == "length"
    zero = engine.generate(PROMPTS, SamplingParams(max_new_tokens=0, n=2))
    assert all(o.output_ids == [] and o.finish_reason == "length" for g in zero for o in g)


def test_n_samples_per_prompt_seeded_and_reproducible(engine):
    sp = SamplingParams(temperature=1.5, max_new_tokens=10, n=4, seed=123, ignore_eos=True)
    a = engine.generate(PROMPTS, sp)
    assert [len(g) for g in a] == [4] * len(PROMPTS)
    for p, g in zip(PROMPTS, a):
        assert all(o.prompt_ids == p for o in g)
        assert len({tuple(o.output_ids) for o in g}) == 4, "n samples of a prompt should differ"
    b = engine.generate(PROMPTS, sp)
    assert [[o.output_ids for o in g] for g in a] == [[o.output_ids for o in g] for g in b]
    c = engine.generate(PROMPTS, SamplingParams(temperature=1.5, max_new_tokens=10, n=4, seed=124, ignore_eos=True))
    assert [[o.output_ids for o in g] for g in a] != [[o.output_ids for o in g] for g in c]


def test_seeded_request_independent_of_batch_composition(engine):
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, n=2, seed=7, ignore_eos=True)
    alone = engine.generate([PROMPTS[1]], sp)[0]
    # different batch, different padding (PROMPTS[2] is longer), different position in batch
    mixed = engine.generate([PROMPTS[2], PROMPTS[0], PROMPTS[1]], sp)[2]
    assert [o.output_ids for o in alone] == [o.output_ids for o in mixed]
    for x, y in zip(alone, mixed):
        # padding / batch size change fp32 reduction order: ~1e-6 relative noise only
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    # an unseeded call still samples (does not crash, differs between calls in general)
    engine.generate([PROMPTS[1]], SamplingParams(temperature=1.0, max_new_tokens=4))


def test_raw_logprobs_equal_direct_forward(ref, engine):
    sp = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=8, n=2, seed=5, ignore_eos=True)
    for p, group in zip(PROMPTS, engine.generate(PROMPTS, sp)):
        for o in group:
            seq = p + o.output_ids
            lp = direct_logprobs(ref, seq)
            want = [lp[len(p) - 1 + k, t].item() for k, t in enumerate(o.output_ids)]
            # batched + left-padded vs one unpadded forward: fp32 noise (a temperature-scaled
            # logprob would be off by far more than this)
            assert o.logprobs == pytest.approx(want, abs=1e-4)


def test_processed_logprobs_are_temperature_scaled(ref):
    eng = HFEngine(ref.config, ref.state_dict(), logprobs_mode="processed")
    T = 0.5
    o = eng.generate([PROMPTS[0]], SamplingParams(temperature=T, max_new_tokens=6, seed=2, ignore_eos=True))[0][0]
    with torch.no_grad():
        logits = ref(torch.tensor([PROMPTS[0] + o.output_ids])).logits[0].float()
    lp = torch.log_softmax(logits / T, -1)
    want = [lp[len(PROMPTS[0]) - 1 + k, t].item() for k, t in enumerate(o.output_ids)]
    assert o.logprobs == pytest.approx(want, abs=1e-5)
    with pytest.raises(ValueError):
        HFEngine(ref.config, None, logprobs_mode="bogus")


def test_top_k_one_and_tiny_top_p_are_greedy(engine):
    greedy = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True))
    k1 = engine.generate(PROMPTS, SamplingParams(temperature=1.3, top_k=1, max_new_tokens=8, ignore_eos=True, seed=1))
    p0 = engine.generate(
        PROMPTS, SamplingParams(temperature=1.3, top_p=1e-6, max_new_tokens=8, ignore_eos=True, seed=1)
    )
    for g, a, b in zip(greedy, k1, p0):
        assert g[0].output_ids == a[0].output_ids == b[0].output_ids


def test_top_k_and_top_p_restrict_support(ref, engine):
    sp = SamplingParams(temperature=2.0, top_k=3, max_new_tokens=10, n=3, seed=9, ignore_eos=True)
    for p, group in zip(PROMPTS, engine.generate(PROMPTS, sp)):
        for o in group:
            lp = direct_logprobs(ref, p + o.output_ids)
            for k, t in enumerate(o.output_ids):
                top3 = torch.topk(lp[len(p) - 1 + k], 3).indices.tolist()
                assert t in top3
    sp = SamplingParams(temperature=1.0, top_p=0.5, max_new_tokens=10, n=3, seed=9, ignore_eos=True)
    for p, group in zip(PROMPTS, engine.generate(PROMPTS, sp)):
        for o in group:
            lp = direct_logprobs(ref, p + o.output_ids)
            for k, t in enumerate(o.output_ids):
                probs = lp[len(p) - 1 + k].exp()
                better = probs[probs > probs[t]].sum().item()
                assert better < 0.5 + 1e-6, "token outside the top-p nucleus"


def test_invalid_sampling_params(engine):
    for bad in (dict(temperature=-1), dict(top_p=0.0), dict(top_k=0), dict(n=0), dict(max_new_tokens=-1)):
        with pytest.raises(ValueError):
            engine.generate(PROMPTS, SamplingParams(**bad))
    with pytest.raises(ValueError):
        engine.generate([[]], SamplingParams())


def test_stop_strings(ref):
    tok = CharTokenizer()
    eng = HFEngine(ref.config, ref.state_dict(), tokenizer=tok, eos_token_ids=[])
    path = eng.generate([PROMPTS[0]], SamplingParams(temperature=0, max_new_tokens=12))[0][0]
    full = tok.decode(path.output_ids)
    assert path.text == full and path.finish_reason == "length"
    # a stop string made of the tail of token 3's piece and the head of token 4's piece
    pieces = [tok.pieces[t] for t in path.output_ids]
    start = sum(len(x) for x in pieces[:3]) + len(pieces[3]) - 1
    stop = full[start : start + 2]
    first = full.find(stop)
    out = eng.generate([PROMPTS[0]], SamplingParams(temperature=0, max_new_tokens=12, stop=[stop, "zzzzzzzzz"]))[0][0]
    assert out.finish_reason == "stop"
    assert out.text == full[:first]
    # output ids end with the token that completes the first occurrence of the stop string
    ends = [sum(len(x) for x in pieces[: k + 1]) for k in range(len(pieces))]
    k_done = next(k for k, e in enumerate(ends) if e >= first + len(stop))
    assert out.output_ids == path.output_ids[: k_done + 1]
    assert len(out.logprobs) == len(out.output_ids)
    with pytest.raises(ValueError, match="tokenizer"):
        HFEngine(ref.config, ref.state_dict()).generate([PROMPTS[0]], SamplingParams(stop=["a"]))


def test_abort_finishes_with_abort(engine):
    steps = []

    def hook(step):
        steps.append(step)
        if step == 3:
            engine.abort()

    engine._step_hook = hook
    outs = engine.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=1000, ignore_eos=True, seed=0))
    assert all(o.finish_reason == "abort" and len(o.output_ids) == 3 for g in outs for o in g)
    engine._step_hook = None
    # abort does not stick to the next call
    again = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True))
    assert all(o.finish_reason == "length" for g in again for o in g)


def test_abort_from_another_thread(engine):
    started = threading.Event()
    engine._step_hook = lambda step: started.set()
    result = {}
    th = threading.Thread(
        target=lambda: result.setdefault(
            "o", engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=100000, ignore_eos=True, seed=0))
        )
    )
    th.start()
    assert started.wait(30)
    engine.abort()
    th.join(60)
    assert not th.is_alive()
    assert result["o"][0][0].finish_reason == "abort"


# ------------------------------------------------------------------------------ score
def test_score_equals_direct_forward(ref, engine):
    seqs = [PROMPTS[0] + [20, 21, 22], PROMPTS[1] + [3], PROMPTS[2] + [60, 61]]
    plens = [len(PROMPTS[0]), 1, len(PROMPTS[2])]
    got = engine.score(seqs, plens)
    for s, p, g in zip(seqs, plens, got):
        lp = direct_logprobs(ref, s)
        want = [lp[k - 1, s[k]].item() for k in range(p, len(s))]
        assert g == pytest.approx(want, abs=1e-5)
    assert engine.score([PROMPTS[0]], [len(PROMPTS[0])]) == [[]]
    with pytest.raises(ValueError):
        engine.score([PROMPTS[0]], [0])


# --------------------------------------------------------------------- weight updates
def _buckets(state_dict, bucket_numel):
    bucket, size = [], 0
    for name, t in state_dict.items():
        bucket.append((name, t))
        size += t.numel()
        if size >= bucket_numel:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


@pytest.mark.parametrize("bucket_numel", [1, 3000, 10**9])
def test_update_weights_stream_matches_loaded_model(ref, bucket_numel):
    eng = HFEngine(ref.config, ref.state_dict())
    sp = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)
    before = eng.generate(PROMPTS, sp)
    new = random_model(ref.config, seed=1)
    sd = {k: v for k, v in new.state_dict().items() if k != "lm_head.weight"}  # tied: embed only
    for b in _buckets(sd, bucket_numel):
        eng.update_weights(b)
    eng.finish_weight_update()
    after = eng.generate(PROMPTS, sp)
    assert [g[0].output_ids for g in before] != [g[0].output_ids for g in after]
    for p, g in zip(PROMPTS, after):
        assert g[0].output_ids == hf_greedy(new, p, 8)
    for name, t in new.state_dict().items():
        assert torch.equal(eng.get_weight(name), t), name
    seq = PROMPTS[0] + after[0][0].output_ids
    lp = direct_logprobs(new, seq)
    want = [lp[k - 1, seq[k]].item() for k in range(len(PROMPTS[0]), len(seq))]
    assert eng.score([seq], [len(PROMPTS[0])])[0] == pytest.approx(want, abs=1e-6)


def test_tied_lm_head_alias_and_bf16_cast(ref):
    eng = HFEngine(ref.config, ref.state_dict())
    assert "lm_head.weight" not in eng.expected_weight_names()
    new = random_model(ref.config, seed=2).state_dict()
    bucket = [(k, v.to(torch.bfloat16)) for k, v in new.items()]  # carries lm_head.weight too
    eng.update_weights(bucket)
    eng.finish_weight_update()
    assert torch.equal(eng.model.lm_head.weight, eng.model.model.embed_tokens.weight)
    assert torch.equal(eng.get_weight("lm_head.weight"), new["model.embed_tokens.weight"].to(torch.bfloat16).float())
    # lm_head.weight counts as the (shared) embedding; everything else is still missing
    eng.update_weights([("lm_head.weight", new["lm_head.weight"])])
    with pytest.raises(WeightUpdateError, match="missing"):
        eng.finish_weight_update()


def test_untied_llama_needs_lm_head(tmp_path):
    ref = random_model(llama_config())
    ref.save_pretrained(tmp_path)
    eng = HFEngine(str(tmp_path))
    assert "lm_head.weight" in eng.expected_weight_names()
    sp = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)
    assert [g[0].output_ids for g in eng.generate(PROMPTS, sp)] == [hf_greedy(ref, p, 6) for p in PROMPTS]
    sd = {k: v for k, v in ref.state_dict().items() if k != "lm_head.weight"}
    eng.update_weights(list(sd.items()))
    with pytest.raises(WeightUpdateError, match="lm_head.weight"):
        eng.finish_weight_update()


def test_update_errors_name_the_tensor(ref, engine):
    w = engine.get_weight("model.norm.weight").clone()
    with pytest.raises(WeightUpdateError, match="model.layers.0.bogus.weight"):
        engine.update_weights(
            [("model.norm.weight", torch.zeros_like(w)), ("model.layers.0.bogus.weight", torch.zeros(3))]
        )
    # the bucket was validated before anything was copied
    assert torch.equal(engine.get_weight("model.norm.weight"), w)
    with pytest.raises(WeightUpdateError, match=r"model\.layers\.1\.self_attn\.q_proj\.weight.*\(32, 31\)"):
        engine.update_weights([("model.layers.1.self_attn.q_proj.weight", torch.zeros(32, 31))])
    with pytest.raises(WeightUpdateError, match="not a tensor"):
        engine.update_weights([("model.norm.weight", [1.0])])
    engine.update_weights([("model.norm.weight", w)])
    with pytest.raises(WeightUpdateError) as ei:
        engine.finish_weight_update()
    msg = str(ei.value)
    assert "missing" in msg and "model.embed_tokens.weight" in msg and "model.norm.weight" not in msg
    # after a finish (even a failed one) the bookkeeping starts over
    engine.update_weights(list(ref.state_dict().items()))
    engine.finish_weight_update()


# ---------------------------------------------------------------------------- memory
def test_release_frees_storage_and_blocks_use(ref, engine):
    sp = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)
    before = engine.generate(PROMPTS, sp)
    full = engine.param_storage_bytes()
    assert full == sum(p.numel() * 4 for p in ref.parameters())
    engine.release_memory()
    assert engine.is_released("weights") and engine.is_released("kv_cache")
    assert engine.param_storage_bytes() == 0
    assert all(p.untyped_storage().nbytes() == 0 for p in engine.model.parameters())
    for call in (
        lambda: engine.generate(PROMPTS, sp),
        lambda: engine.score([PROMPTS[0]], [1]),
        lambda: engine.update_weights(list(ref.state_dict().items())),
    ):
        with pytest.raises(RuntimeError, match="released"):
            call()
    assert issubclass(EngineReleasedError, RuntimeError)
    engine.release_memory()  # idempotent
    engine.resume_memory(["weights"])
    assert engine.param_storage_bytes() == full
    assert not engine.is_released("weights") and engine.is_released("kv_cache")
    engine.update_weights(list(ref.state_dict().items()))
    engine.finish_weight_update()
    with pytest.raises(EngineReleasedError, match="kv_cache"):
        engine.generate(PROMPTS, sp)
    engine.resume_memory(["kv_cache"])
    assert [g[0].output_ids for g in engine.generate(PROMPTS, sp)] == [g[0].output_ids for g in before]


def test_resumed_weights_are_undefined_until_updated(ref, engine):
    engine.release_memory(["weights"])
    engine.resume_memory(["weights"])
    with pytest.raises(EngineReleasedError, match="weight update"):
        engine.generate(PROMPTS, SamplingParams(max_new_tokens=2))
    engine.update_weights(list(ref.state_dict().items())[:3])
    with pytest.raises(WeightUpdateError):
        engine.finish_weight_update()
    with pytest.raises(EngineReleasedError):
        engine.score([PROMPTS[0]], [1])
    engine.update_weights(list(ref.state_dict().items()))
    engine.finish_weight_update()
    engine.score([PROMPTS[0]], [1])


def test_kv_cache_release_only(engine, ref):
    engine.release_memory(["kv_cache"])
    assert not engine.is_released("weights")
    engine.update_weights(list(ref.state_dict().items()))  # allowed: weights are resident
    engine.finish_weight_update()
    with pytest.raises(EngineReleasedError):
        engine.generate(PROMPTS, SamplingParams(max_new_tokens=2))
    engine.resume_memory("kv_cache")
    engine.generate(PROMPTS, SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError):
        engine.release_memory(["bogus"])


def test_health_and_shutdown(engine):
    assert engine.health()
    engine.flush_cache()
    engine.shutdown()
    assert not engine.health()
    with pytest.raises(RuntimeError, match="shutdown"):
        engine.generate(PROMPTS, SamplingParams(max_new_tokens=2))


def _char_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = ["<pad>", "<s>", "</s>", "<unk>"] + list("abcdefghijklmnopqrstuvwxyz .,!?")
    tok = Tokenizer(models.WordLevel(vocab={c: i for i, c in enumerate(chars)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="</s>")


def test_stop_strings_with_a_real_tokenizer():
    tok = _char_tokenizer()
    ref = random_model(qwen2_config(vocab_size=len(tok), eos_token_id=2))
    eng = HFEngine(ref.config, ref.state_dict(), tokenizer=tok)
    prompt = tok.encode("hello world", add_special_tokens=False)
    path = eng.generate([prompt], SamplingParams(temperature=0, max_new_tokens=16, ignore_eos=True))[0][0]
    text = tok.decode(path.output_ids)
    assert path.text == text
    stop = text[5:7]
    k = next(k for k in range(len(path.output_ids)) if stop in tok.decode(path.output_ids[: k + 1]))
    out = eng.generate([prompt], SamplingParams(temperature=0, max_new_tokens=16, ignore_eos=True, stop=[stop]))[0][0]
    assert out.finish_reason == "stop"
    assert out.output_ids == path.output_ids[: k + 1]
    assert out.text == text[: text.find(stop)]
