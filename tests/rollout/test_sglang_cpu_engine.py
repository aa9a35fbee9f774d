"""The product's SGLangEngine adapter against the real SGLang 0.5.23 engine, running on the CPU.

One engine for the whole module (a start costs about 20-40 s on 2 cores), in an OS process of its
own (megatron_dapo/rollout/engine_host.py: SGLang kills its parent's process tree when a scheduler dies),
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

from megatron_dapo.hybrid.probe import compare_checksums
from megatron_dapo.hybrid.weight_sync import WeightSyncError
from megatron_dapo.rollout.base import EngineReleasedError, Request, SamplingParams, WeightUpdateError
from megatron_dapo.rollout.checksum import tensor_checksum
from megatron_dapo.rollout.engine_host import SGLANG, EngineHost
from tests.tiny import checkpoint_state_dict, random_hf_model, tiny_qwen2_config, tiny_qwen3_moe_config

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
    host = EngineHost(SGLANG, model["dir"], load_format="dummy", dtype="float32", random_seed=7, log_level="error")
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
    uninterrupted greedy output; the engine keeps serving after the abort. (The request asks for
    far more tokens than it gets before the abort, so that it is still running then; the greedy
    path is compared over the prefix and GREEDY.max_new_tokens more, generated after the abort,
    instead of over all 1200 tokens twice: ~20 s of a loaded 2-core machine.)"""
    long = SamplingParams(temperature=0.0, max_new_tokens=1200, ignore_eos=True)
    engine.submit([Request("long", PROMPTS[1], long)])
    assert engine.poll(0.3) == []  # it has started (a few seconds from its last token on 2 cores)
    (ab,) = engine.abort_requests(["long"])
    assert ab.rid == "long" and ab.output.finish_reason == "abort", ab.output.finish_reason
    prefix = ab.output.output_ids
    assert 0 < len(prefix) < long.max_new_tokens and len(ab.output.logprobs) == len(prefix)
    tail = GREEDY.max_new_tokens
    whole = SamplingParams(temperature=0.0, max_new_tokens=len(prefix) + tail, ignore_eos=True)
    (full,) = engine.generate([PROMPTS[1]], whole)[0]  # the uninterrupted greedy path past the prefix
    assert len(full.output_ids) == len(prefix) + tail
    assert prefix == full.output_ids[: len(prefix)]
    rest = SamplingParams(temperature=0.0, max_new_tokens=tail, ignore_eos=True)
    (cont,) = engine.generate([PROMPTS[1] + prefix], rest)[0]
    assert prefix + cont.output_ids == full.output_ids


def test_a_weight_version_set_mid_request_stamps_every_token_with_sglangs_spans(engine):
    """SGLangEngine.set_weight_version tells SGLang's scheduler too (its update_weight_version,
    requests kept): a request running across the change comes back with every token stamped,
    the old version first and the new one after (GenerationOutput.token_versions, from
    meta_info["weight_versions"]); a request after it is all of the new version."""
    v0 = 1  # (no other test of this module sets a version)
    engine.set_weight_version(v0)
    long = SamplingParams(temperature=0.0, max_new_tokens=300, ignore_eos=True)
    engine.submit([Request("versions", PROMPTS[0], long)])
    assert engine.poll(0.3) == []  # running (about 2.5 s of tokens on 2 cores)
    engine.set_weight_version(v0 + 1)
    done = []
    deadline = time.monotonic() + 120
    while not done and time.monotonic() < deadline:
        done = engine.poll(1.0)
    (f,) = done
    tv = f.output.token_versions
    assert tv is not None and len(tv) == len(f.output.output_ids) == long.max_new_tokens
    assert tv == sorted(tv) and tv[0] == v0 and tv[-1] == v0 + 1, tv  # split once, none unmarked
    (after,) = engine.generate([PROMPTS[1]], GREEDY)[0]
    assert after.token_versions == [v0 + 1] * len(after.output_ids)


def test_an_abort_right_after_submit_ends_only_the_named_request(engine):
    """The adapter lets an aborted request reach the scheduler first (an abort that arrives before
    it would be missed and the request would run to its end), and SGLang aborts every rid that
    *starts with* the aborted one: "1.1" must not take "1.10" with it. Release is refused while
    requests stream, on the CPU as on a GPU."""
    engine.submit([Request("1.1", PROMPTS[0], SamplingParams(temperature=0.0, max_new_tokens=1500, ignore_eos=True))])
    engine.submit([Request("1.10", PROMPTS[1], GREEDY)])
    with pytest.raises(RuntimeError, match="2 streamed requests outstanding"):
        engine.release_memory(["kv_cache"])
    cut = engine.abort_requests(["1.1"])
    assert [f.rid for f in cut] == ["1.1"] and cut[0].output.finish_reason == "abort"
    assert len(cut[0].output.output_ids) < 1500
    rest = []
    deadline = time.monotonic() + 120
    while not rest and time.monotonic() < deadline:
        rest = engine.poll(1.0)
    assert [f.rid for f in rest] == ["1.10"] and rest[0].output.finish_reason == "length"
    assert len(rest[0].output.output_ids) == GREEDY.max_new_tokens


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


def test_a_probe_syncs_checksums_match_the_trainers_through_sglangs_checker(engine, model):
    """The checksum half of --check-weight-sync-every for SGLang: after an armed sync every HF
    tensor is vouched for by SGLang's own hash of the parameter it was loaded into (fused
    q/k/v and gate/up, float32 here); the engine's parameters overwritten behind the sync's back
    are named, as is a tensor changed on its way."""
    reference = {n: tensor_checksum(t) for n, t in model["weights"].items()}
    engine.arm_weight_checksums()
    _sync(engine, model["weights"])
    got = engine.weight_checksums()
    assert compare_checksums(reference, [got]) == {"compared": len(reference), "skipped": 0}
    with pytest.raises(NotImplementedError, match="not armed"):
        engine.weight_checksums()  # one check per armed sync
    engine.arm_weight_checksums()
    _sync(engine, model["weights"])
    engine.check_weights("reset_tensors")  # every parameter random, the adapter not told
    with pytest.raises(WeightSyncError, match=f"{len(reference)} different from what the trainer sent") as e:
        compare_checksums(reference, [engine.weight_checksums()])
    assert "model.layers.0.self_attn.q_proj.weight" in str(e.value)  # the first 20 are named
    assert "engine holds SGLang's lm_head.weight holds other bytes than the HF tensors received give" in str(e.value)
    name = "model.layers.0.mlp.down_proj.weight"
    engine.arm_weight_checksums()
    _sync(engine, dict(model["weights"], **{name: model["weights"][name] * 2}))
    with pytest.raises(WeightSyncError, match=f"1 different from what the trainer sent: {name}"):
        compare_checksums(reference, [engine.weight_checksums()])
    _sync(engine, model["weights"])  # leave the engine whole for what follows


def test_a_tiny_qwen3_moe_synced_into_a_dummy_engine_is_greedy_identical(tmp_path):
    """Qwen3-MoE (8 experts, top-2, q/k norms): the checkpoint's per-expert tensors, synced in
    buckets into a dummy-loaded engine, give transformers' greedy output (its own engine: a
    second start, ended here)."""
    hf = random_hf_model(tiny_qwen3_moe_config(initializer_range=0.3), seed=5)
    hf.save_pretrained(tmp_path)
    host = EngineHost(SGLANG, str(tmp_path), load_format="dummy", dtype="float32", log_level="error")
    try:
        weights = checkpoint_state_dict(hf)
        assert any(".mlp.experts.7.down_proj." in n for n in weights)
        _sync(host, weights)
        outs = host.generate(PROMPTS, GREEDY)
        for prompt, (out,) in zip(PROMPTS, outs):
            want, want_lp = _hf_greedy(hf, prompt, GREEDY.max_new_tokens)
            assert out.output_ids == want, (prompt, out.output_ids, want)
            assert max(abs(a - b) for a, b in zip(out.logprobs, want_lp)) < FP32_LOGPROB_ATOL
    finally:
        host.close()


def test_weights_broadcast_over_gloo_by_a_trainer_sync_rank_reach_the_engine(engine, model, tmp_path):
    """SGLang's update_weights_from_distributed, the path asynchronous training will feed busy
    engines by: the trainer's sync rank (a process of its own, hybrid/weight_broadcast.py) and
    the engine form a gloo group; every tensor of the engine is first overwritten with random
    values, then two buckets are broadcast: the engine's greedy output is the checkpoint's again."""
    import threading

    from megatron_dapo.hybrid.weight_broadcast import bucket_entries
    from megatron_dapo.ports import free_port
    from tests.rollout.broadcast_sender import Sender

    port = free_port()

    def receive(bucket, out):
        try:
            engine.update_weights_from_distributed(bucket_entries(bucket), "mdapo-test")
            out.append("ok")
        except Exception as e:  # noqa: BLE001 - asserted below
            out.append(e)

    with Sender(port, 2, "mdapo-test") as sender:
        engine.init_weights_update_group("127.0.0.1", port, 1, 2, "mdapo-test", "gloo")  # rank 1 of 2
        sender.joined()
        engine.check_weights("reset_tensors")  # nothing of the checkpoint is left in the engine
        items = list(model["weights"].items())
        for k, bucket in enumerate((items[: len(items) // 2], items[len(items) // 2 :])):
            torch.save(bucket, tmp_path / f"bucket{k}.pt")
            got: list = []
            t = threading.Thread(target=receive, args=(bucket, got))
            t.start()  # the engine's call returns once the tensors arrived
            sender.send(tmp_path / f"bucket{k}.pt")
            sender.sent()
            t.join(timeout=120)
            assert got == ["ok"], got
        engine.finish_weight_update()
        outs = engine.generate(PROMPTS, GREEDY)
        for prompt, (out,) in zip(PROMPTS, outs):
            assert out.output_ids == _hf_greedy(model["hf"], prompt, GREEDY.max_new_tokens)[0]
        engine.destroy_weights_update_group("mdapo-test")
