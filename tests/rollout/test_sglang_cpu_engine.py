"""The product's SGLangEngine adapter against the real SGLang 0.5.23 engine, running on the CPU.

One engine for the whole module (a start costs about 20-40 s on 2 cores), in an OS process of its
own (tests/rollout/sglang_host.py: SGLang kills its parent's process tree when a scheduler dies),
launched as a rollout engine is: ``load_format="dummy"`` (random weights) until the first
weight sync fills them. The tests run in file order (the suite hands a file whole to one worker):
the first one sees the engine before any sync.

The model is a tiny random Qwen2 (tests/tiny.py) with spread-out next-token distributions, in
float32 on both sides, so greedy paths are decided by margins far above float32 rounding.
"""

from __future__ import annotations

import time

import pytest
import torch

from megatron_dapo.rollout.base import EngineReleasedError, Request, SamplingParams, WeightUpdateError
from tests.rollout.sglang_host import SGLangHost
from tests.tiny import checkpoint_state_dict, random_hf_model, tiny_qwen2_config

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

PROMPTS = [[1, 17, 33, 90], [1, 5, 9], [1, 200, 201, 202, 203, 7]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)
#: |logp_sglang - logp_transformers| in float32: two implementations of the same float32 forward
#: (other kernels and reduction orders) over 4 layers of width 64 differ by a few float32 ulps of
#: the logits (|logit| < 30 here), far below this
FP32_LOGPROB_ATOL = 1e-3


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    cfg = tiny_qwen2_config(initializer_range=0.3, max_position_embeddings=2048)
    hf = random_hf_model(cfg, seed=3)
    d = tmp_path_factory.mktemp("qwen2")
    hf.save_pretrained(d)
    return {"dir": str(d), "hf": hf, "weights": checkpoint_state_dict(hf)}


@pytest.fixture(scope="module")
def engine(model):
    host = SGLangHost(model["dir"], load_format="dummy", dtype="float32", random_seed=7, log_level="error")
    try:
        yield host
    finally:
        host.close()


def _sync(engine, weights, skip=()):
    items = [(n, t) for n, t in weights.items() if n not in skip]
    half = len(items) // 2
    engine.update_weights(items[:half])  # two buckets: one weight-update session
    engine.update_weights(items[half:])
    engine.finish_weight_update()


@torch.no_grad()
def _hf_greedy(hf, prompt, n):
    """transformers' greedy continuation of ``prompt`` and the raw logprob of each chosen token."""
    ids, lps = list(prompt), []
    for _ in range(n):
        logits = hf(torch.tensor([ids])).logits[0, -1].float()
        tok = int(logits.argmax())
        lps.append(float(torch.log_softmax(logits, -1)[tok]))
        ids.append(tok)
    return ids[len(prompt) :], lps


def test_a_dummy_engine_runs_on_the_cpu_and_refuses_to_generate_before_a_sync(engine):
    info = engine.attr("cpu_driver")
    # this machine has no CUDA driver library: the stub was built and loaded, in the engine's process only
    assert info["driver"] == "stub" and info["path"].endswith("libcuda.so.1"), info
    assert engine.attr("on_cpu") is True
    with pytest.raises(EngineReleasedError, match="before a complete weight update"):
        engine.generate(PROMPTS[:1], GREEDY)


def test_the_adapters_weight_sync_reproduces_the_checkpoints_greedy_output(engine, model):
    """Before the fix the adapter applied SGLang's CUDA reduction patch in the engine's process,
    and pickling the bucket's CPU buffer raised IndexError (patch_torch._modify_tuple)."""
    _sync(engine, model["weights"])
    outs = engine.generate(PROMPTS, GREEDY)
    for prompt, (out,) in zip(PROMPTS, outs):
        want, want_lp = _hf_greedy(model["hf"], prompt, GREEDY.max_new_tokens)
        assert out.output_ids == want, (prompt, out.output_ids, want)
        assert out.finish_reason == "length"
        assert max(abs(a - b) for a, b in zip(out.logprobs, want_lp)) < FP32_LOGPROB_ATOL


def test_score_gives_the_checkpoints_logprobs(engine, model):
    seq = PROMPTS[0] + [40, 41, 42, 43, 44, 45]
    (got,) = engine.score([seq], [len(PROMPTS[0])])
    with torch.no_grad():
        logp = torch.log_softmax(model["hf"](torch.tensor([seq])).logits[0].float(), -1)
    want = [float(logp[i - 1, seq[i]]) for i in range(len(PROMPTS[0]), len(seq))]
    assert len(got) == len(want)
    assert max(abs(a - b) for a, b in zip(got, want)) < FP32_LOGPROB_ATOL


def test_streamed_requests_equal_the_blocking_call(engine):
    blocking = engine.generate(PROMPTS, GREEDY)
    engine.submit([Request(f"r{i}", p, GREEDY) for i, p in enumerate(PROMPTS)])
    done = {}
    deadline = time.monotonic() + 120
    while len(done) < len(PROMPTS) and time.monotonic() < deadline:
        for f in engine.poll(1.0):
            done[f.rid] = f.output
    assert sorted(done) == ["r0", "r1", "r2"]
    for i, (want,) in enumerate(blocking):
        assert done[f"r{i}"].output_ids == want.output_ids
        assert done[f"r{i}"].finish_reason == "length"


def test_an_aborted_request_returns_its_prefix_and_its_continuation_completes_the_greedy_path(engine):
    """Partial rollout: the prefix of an aborted request, continued as a new request, gives the
    uninterrupted greedy output; the engine keeps serving after the abort."""
    long = SamplingParams(temperature=0.0, max_new_tokens=1200, ignore_eos=True)
    (full,) = engine.generate([PROMPTS[1]], long)[0]
    engine.submit([Request("long", PROMPTS[1], long)])
    assert engine.poll(0.3) == []  # it has started (a few seconds from its last token on 2 cores)
    (ab,) = engine.abort_requests(["long"])
    assert ab.rid == "long" and ab.output.finish_reason == "abort", ab.output.finish_reason
    prefix = ab.output.output_ids
    assert 0 < len(prefix) < long.max_new_tokens and len(ab.output.logprobs) == len(prefix)
    assert prefix == full.output_ids[: len(prefix)]
    rest = SamplingParams(temperature=0.0, max_new_tokens=long.max_new_tokens - len(prefix), ignore_eos=True)
    (cont,) = engine.generate([PROMPTS[1] + prefix], rest)[0]
    assert prefix + cont.output_ids == full.output_ids


def test_memory_release_on_the_cpu_is_a_recorded_no_op_that_keeps_the_protocol(engine, model):
    engine.release_memory()
    with pytest.raises(EngineReleasedError, match="released"):
        engine.generate(PROMPTS[:1], GREEDY)
    engine.resume_memory(["weights"])
    with pytest.raises(EngineReleasedError, match="kv_cache"):
        engine.generate(PROMPTS[:1], GREEDY)
    engine.resume_memory()
    with pytest.raises(EngineReleasedError, match="before a complete weight update"):
        engine.generate(PROMPTS[:1], GREEDY)  # as on a GPU: resumed weights need a sync
    _sync(engine, model["weights"])
    assert engine.generate(PROMPTS[:1], GREEDY)[0][0].output_ids == _hf_greedy(model["hf"], PROMPTS[0], 24)[0]
    noops = engine.attr("memory_noops")
    assert ("release", "weights") in noops and ("resume", "kv_cache") in noops and ("release", "cuda_graph") in noops


def test_the_engines_weight_checker_names_what_a_sync_did_not_restore(engine, model):
    """--check-weight-sync-init through SGLang's own checker: snapshot, random fill, sync,
    compare. A full sync restores every parameter exactly; a sync that misses one tensor
    leaves the fused parameter it belongs to random, named with its HF sources."""
    assert engine.check_weights("snapshot") == []
    engine.check_weights("reset_tensors")
    with pytest.raises(EngineReleasedError, match="before a complete weight update"):
        engine.generate(PROMPTS[:1], GREEDY)
    _sync(engine, model["weights"])
    assert engine.check_weights("compare") == []
    assert engine.check_weights("snapshot") == []
    engine.check_weights("reset_tensors")
    with pytest.raises(WeightUpdateError, match="model.layers.1.self_attn.k_proj.weight"):
        _sync(engine, model["weights"], skip=("model.layers.1.self_attn.k_proj.weight",))
    lines = engine.check_weights("compare")
    assert len(lines) == 1 and lines[0].startswith("model.layers.1.self_attn.qkv_proj.weight"), lines
    assert "model.layers.1.self_attn.k_proj.weight" in lines[0]
    _sync(engine, model["weights"])  # leave the engine whole for what follows
