"""SGLangEngine on CPU without sglang: the pure translation functions, and the adapter class
driven against a stand-in ``sglang`` package whose Engine answers like SGLang's (dict
outputs with meta_info, flattened-bucket payloads) by running an HFEngine."""

from __future__ import annotations

import asyncio
import base64
import os
import pickle
import sys
import types
from dataclasses import dataclass

import pytest
import torch

from megatron_dapo.rollout import EngineReleasedError, GenerationOutput, SamplingParams, WeightUpdateError
from megatron_dapo.rollout import sglang_engine as se
from megatron_dapo.rollout.base import derive_seed
from megatron_dapo.rollout.hf_engine import HFEngine
from tests.rollout.helpers import PROMPTS, qwen2_config, random_model


# ------------------------------------------------------------------ pure functions ----
def test_sampling_params_translation():
    d = se.to_sglang_sampling_params(
        SamplingParams(
            temperature=0.7,
            top_p=0.9,
            top_k=-1,
            max_new_tokens=33,
            n=4,
            stop_token_ids=[3, 4],
            stop=["</s>"],
            ignore_eos=True,
        ),
        seed=11,
    )
    assert d == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "max_new_tokens": 33,
        "n": 1,
        "ignore_eos": True,
        "stop_token_ids": [3, 4],
        "stop": ["</s>"],
        "sampling_seed": 11,
    }
    g = se.to_sglang_sampling_params(SamplingParams(temperature=0.0, top_k=5))
    assert g["temperature"] == 0.0 and g["top_k"] == 5
    assert "sampling_seed" not in g and "stop" not in g and "stop_token_ids" not in g
    with pytest.raises(ValueError):
        se.to_sglang_sampling_params(SamplingParams(top_p=0))


def test_generate_requests_expand_n_prompt_major_with_seeds():
    ids, sps, index = se.build_generate_requests([[1, 2], [3]], SamplingParams(n=3, seed=5), default_seed=0)
    assert ids == [[1, 2]] * 3 + [[3]] * 3
    assert index == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    seeds = [sp["sampling_seed"] for sp in sps]
    assert seeds == [derive_seed(5, k) for k in range(6)]  # request k = i * n + j
    assert len(set(seeds)) == 6 and all(sp["n"] == 1 for sp in sps)
    _, sps, _ = se.build_generate_requests([[1]], SamplingParams(n=2), default_seed=9)
    assert [sp["sampling_seed"] for sp in sps] == [derive_seed(9, 0), derive_seed(9, 1)]
    with pytest.raises(ValueError):
        se.build_generate_requests([[]], SamplingParams(), default_seed=0)


def _sgl_out(ids, lps, finish):
    return {
        "text": "x",
        "output_ids": ids,
        "meta_info": {
            "id": "r",
            "finish_reason": finish,
            "prompt_tokens": 2,
            "completion_tokens": len(ids),
            "output_token_logprobs": [(lp, t, None) for lp, t in zip(lps, ids)],
        },
    }


def test_from_sglang_output_and_finish_reasons():
    o = se.from_sglang_output(_sgl_out([5, 6], [-0.5, -1.5], {"type": "stop", "matched": 6}), [1, 2])
    assert o == GenerationOutput(
        prompt_ids=[1, 2], output_ids=[5, 6], logprobs=[-0.5, -1.5], finish_reason="stop", text="x"
    )
    assert se.from_sglang_output(_sgl_out([5], [-1.0], {"type": "length", "length": 1}), [1]).finish_reason == "length"
    assert se.from_sglang_output(_sgl_out([], [], {"type": "abort", "message": "x"}), [1]).finish_reason == "abort"
    assert se.parse_finish_reason("stop") == "stop"
    for bad in (None, {"type": "weird"}):
        with pytest.raises(ValueError):
            se.parse_finish_reason(bad)
    broken = _sgl_out([5, 6], [-0.5, -1.5], {"type": "stop"})
    broken["meta_info"]["output_token_logprobs"] = broken["meta_info"]["output_token_logprobs"][:1]
    with pytest.raises(ValueError, match="output_token_logprobs"):
        se.from_sglang_output(broken, [1])
    swapped = _sgl_out([5, 6], [-0.5, -1.5], {"type": "stop"})
    swapped["meta_info"]["output_token_logprobs"][1] = (-1.5, 7, None)
    with pytest.raises(ValueError, match="token 7"):
        se.from_sglang_output(swapped, [1])


def test_group_outputs():
    outs = [GenerationOutput([1], [i], [0.0], "length") for i in range(4)]
    grouped = se.group_outputs(outs, [(0, 0), (0, 1), (1, 0), (1, 1)], 2)
    assert [[o.output_ids[0] for o in g] for g in grouped] == [[0, 1], [2, 3]]
    with pytest.raises(ValueError):
        se.group_outputs(outs[:3], [(0, 0), (0, 1), (1, 0), (1, 1)], 2)


def test_score_requests_and_output():
    ids, sps, starts = se.build_score_requests([[1, 2, 3, 4], [5, 6]], [2, 1])
    assert starts == [1, 0] and all(sp["max_new_tokens"] == 0 for sp in sps)
    # SGLang: entries for ids[start:], the first one None
    out = {"meta_info": {"input_token_logprobs": [(None, 2, None), (-0.3, 3, None), (-0.4, 4, None)]}}
    assert se.from_sglang_score_output(out, [1, 2, 3, 4], 2) == [-0.3, -0.4]
    with pytest.raises(ValueError):
        se.from_sglang_score_output(out, [1, 2, 9, 4], 2)
    with pytest.raises(ValueError):
        se.build_score_requests([[1]], [0])


def test_flatten_bucket_mixed_dtypes_roundtrip():
    g = torch.Generator().manual_seed(0)
    tensors = [
        ("a.bf16", torch.randn(3, 5, generator=g).to(torch.bfloat16)),  # 30 bytes: unaligned end
        ("b.f32", torch.randn(7, generator=g)),
        ("c.i64", torch.arange(3)),
        ("d.empty", torch.zeros(0, 4)),
        ("e.noncontig", torch.randn(4, 6, generator=g).t()),
    ]
    flat, entries = se.flatten_bucket(tensors)
    assert flat.dtype == torch.uint8
    assert all(e.start_idx % se.BUCKET_ALIGN_BYTES == 0 for e in entries)
    assert [e.end_idx - e.start_idx for e in entries] == [t.numel() * t.element_size() for _, t in tensors]
    back = se.reconstruct_bucket(flat, entries)
    for (n, t), (m, r) in zip(tensors, back):
        assert n == m and r.dtype == t.dtype and r.shape == t.shape and torch.equal(r, t)
    with pytest.raises(ValueError):
        se.flatten_bucket([])


@dataclass
class StandInMetadata:
    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


def test_serialize_bucket_payload_like_sglang_reads_it():
    tensors = [("x", torch.randn(4, 4)), ("y", torch.ones(3, dtype=torch.bfloat16))]
    payloads, flat = se.serialize_bucket(tensors, tp_size=2, metadata_cls=StandInMetadata)
    assert len(payloads) == 2 and all(isinstance(p, str) for p in payloads)
    for p in payloads:
        obj = pickle.loads(base64.b64decode(p))  # what MultiprocessingSerializer.deserialize does
        assert set(obj) == {"flattened_tensor", "metadata"}
        assert all(isinstance(m, StandInMetadata) for m in obj["metadata"])
        back = dict(se.reconstruct_bucket(obj["flattened_tensor"], obj["metadata"]))
        for n, t in tensors:
            assert torch.equal(back[n], t)
    raw = se.default_serializer({"a": 1}, output_str=False)
    assert pickle.loads(raw) == {"a": 1}


def test_checkpoint_weight_shapes(tmp_path):
    model = random_model(qwen2_config())
    model.save_pretrained(tmp_path)
    shapes = se.checkpoint_weight_shapes(tmp_path)
    sd = {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert shapes == sd
    assert se.tied_embeddings(tmp_path)
    with pytest.raises(FileNotFoundError):
        se.checkpoint_weight_shapes(tmp_path / "nope")


def test_engine_kwargs():
    kw = se.build_engine_kwargs("/m", tp_size=2, mem_fraction_static=0.4, base_gpu_id=3)
    assert kw["model_path"] == "/m" and kw["tp_size"] == 2 and kw["mem_fraction_static"] == 0.4
    assert kw["base_gpu_id"] == 3 and kw["enable_memory_saver"] is True
    assert kw["load_format"] == "dummy" and kw["tokenizer_path"] == "/m"
    assert "random_seed" not in kw and "port" not in kw
    kw = se.build_engine_kwargs("/m", tokenizer_path="/t", load_format=None)
    assert kw["tokenizer_path"] == "/t" and "load_format" not in kw


def test_missing_sglang_gives_install_hint(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "sglang", None)  # import sglang -> ImportError
    monkeypatch.delenv(se.RAW_LOGPROB_ENV, raising=False)
    with pytest.raises(ImportError, match=r"pip install megatron-dapo\[gpu\]"):
        se.SGLangEngine(str(tmp_path), device="cuda")


# --------------------------------------------------- the adapter against a stand-in ----
class FakeTokenizerManager:
    def __init__(self, engine):
        self.engine = engine

    def abort_request(self, rid: str = "", abort_all: bool = False):
        self.engine.calls.append(("abort_request", abort_all))


class FakeSGLEngine:
    """Answers like sglang.Engine (offline API, token ids), computing with an HFEngine."""

    instances = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls = []
        # SGLang's sampler: log_softmax(logits / T) unless SGLANG_RETURN_ORIGINAL_LOGPROB is set
        raw = os.environ.get(se.RAW_LOGPROB_ENV) == "1"
        self.hf = HFEngine(kwargs["model_path"], logprobs_mode="raw" if raw else "processed")
        self.tokenizer_manager = FakeTokenizerManager(self)
        self.loop = asyncio.new_event_loop()
        FakeSGLEngine.instances.append(self)

    def generate(self, input_ids=None, sampling_params=None, return_logprob=False, logprob_start_len=None):
        self.calls.append(("generate", len(input_ids)))
        assert return_logprob is True
        outs = []
        for k, (ids, sp) in enumerate(zip(input_ids, sampling_params)):
            if sp["max_new_tokens"] == 0:
                start = logprob_start_len[k]
                lps = self.hf.score([ids], [start + 1])[0]
                entries = [(None, ids[start], None)] + [(lp, t, None) for lp, t in zip(lps, ids[start + 1 :])]
                outs.append(
                    {
                        "output_ids": [],
                        "meta_info": {
                            "finish_reason": {"type": "length", "length": 0},
                            "input_token_logprobs": entries,
                        },
                    }
                )
                continue
            assert sp["n"] == 1
            ours = SamplingParams(
                temperature=sp["temperature"],
                top_p=sp["top_p"],
                top_k=sp["top_k"],
                max_new_tokens=sp["max_new_tokens"],
                ignore_eos=sp["ignore_eos"],
                stop_token_ids=sp.get("stop_token_ids", []),
                seed=sp.get("sampling_seed"),
            )
            o = self.hf.generate([ids], ours)[0][0]
            fr = {"type": o.finish_reason}
            outs.append(
                {
                    "text": None,
                    "output_ids": o.output_ids,
                    "meta_info": {
                        "finish_reason": fr,
                        "output_token_logprobs": [(lp, t, None) for lp, t in zip(o.logprobs, o.output_ids)],
                    },
                }
            )
        return outs

    def begin_weight_update(self):
        self.calls.append(("begin_weight_update",))
        return True, "Success"

    def end_weight_update(self):
        self.calls.append(("end_weight_update",))
        return True, "Success"

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        self.calls.append(("update_weights_from_tensor", load_format, flush_cache, len(named_tensors)))
        assert load_format == "flattened_bucket"
        data = pickle.loads(base64.b64decode(named_tensors[0]))  # rank 0's payload
        tensors = se.reconstruct_bucket(data["flattened_tensor"], data["metadata"])
        self.hf._load_bucket(tensors)
        return True, "Success"

    def release_memory_occupation(self, tags=None):
        self.calls.append(("release", tuple(tags)))

    def resume_memory_occupation(self, tags=None):
        self.calls.append(("resume", tuple(tags)))

    def flush_cache(self):
        self.calls.append(("flush_cache",))

    def get_server_info(self):
        return {"version": "fake"}

    def shutdown(self):
        self.calls.append(("shutdown",))


@pytest.fixture
def fake_sglang(monkeypatch):
    def mod(name, **attrs):
        m = types.ModuleType(name)
        for k, v in attrs.items():
            setattr(m, k, v)
        monkeypatch.setitem(sys.modules, name, m)
        return m

    class MultiprocessingSerializer:
        @staticmethod
        def serialize(obj, output_str: bool = False):
            return se.default_serializer(obj, output_str=output_str)

    patched = []
    mod("sglang", Engine=FakeSGLEngine)
    mod("sglang.srt")
    mod("sglang.srt.utils")
    mod("sglang.srt.utils.common", MultiprocessingSerializer=MultiprocessingSerializer)
    mod("sglang.srt.utils.patch_torch", monkey_patch_torch_reductions=lambda: patched.append(1))
    mod("sglang.srt.weight_sync")
    mod("sglang.srt.weight_sync.tensor_bucket", FlattenedTensorMetadata=StandInMetadata)
    monkeypatch.delenv(se.RAW_LOGPROB_ENV, raising=False)
    FakeSGLEngine.instances = []
    return patched


@pytest.fixture
def model_dir(tmp_path):
    model = random_model(qwen2_config())
    model.save_pretrained(tmp_path)
    return tmp_path


def test_adapter_start_generate_score(fake_sglang, model_dir):
    eng = se.SGLangEngine(
        str(model_dir),
        tp_size=1,
        mem_fraction_static=0.3,
        base_gpu_id=2,
        random_seed=4,
        load_format="auto",
        device="cuda",
    )  # the checkpoint's weights: generate at once
    fake = FakeSGLEngine.instances[0]
    assert fake.kwargs["enable_memory_saver"] is True and fake.kwargs["base_gpu_id"] == 2
    assert fake.kwargs["mem_fraction_static"] == 0.3 and fake.kwargs["random_seed"] == 4
    assert se.RAW_LOGPROB_ENV not in os.environ and fake_sglang == [1]  # processed: tempered logprobs
    ref = HFEngine(str(model_dir), logprobs_mode="processed")
    sp = SamplingParams(temperature=0.8, max_new_tokens=6, n=3, seed=8, ignore_eos=True)
    got = eng.generate(PROMPTS, sp)
    for i, g in enumerate(got):  # request k = i * n + j was seeded with derive_seed(8, k)
        for j, a in enumerate(g):
            one = SamplingParams(temperature=0.8, max_new_tokens=6, seed=derive_seed(8, i * 3 + j), ignore_eos=True)
            b = ref.generate([PROMPTS[i]], one)[0][0]
            assert a.output_ids == b.output_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert all(o.prompt_ids == p for p, g in zip(PROMPTS, got) for o in g)
    seqs = [p + [1, 2, 3] for p in PROMPTS]
    plens = [len(p) for p in PROMPTS]
    for a, b in zip(eng.score(seqs, plens), ref.score(seqs, plens)):
        assert a == pytest.approx(b, abs=1e-4)
    assert eng.health()
    eng.abort()
    assert ("abort_request", True) in fake.calls
    eng.shutdown()
    assert ("shutdown",) in fake.calls and not eng.health()


def test_adapter_weight_update_and_memory_order(fake_sglang, model_dir):
    eng = se.SGLangEngine(str(model_dir), device="cuda")
    fake = FakeSGLEngine.instances[0]
    new = random_model(qwen2_config(), seed=3)
    sd = [(k, v) for k, v in new.state_dict().items() if k != "lm_head.weight"]
    sp = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)

    eng.release_memory()
    assert fake.calls[-1] == ("release", ("weights", "kv_cache", "cuda_graph"))
    with pytest.raises(EngineReleasedError):
        eng.generate(PROMPTS, sp)
    with pytest.raises(EngineReleasedError):
        eng.update_weights(sd[:2])
    assert not any(c[0] in ("generate", "update_weights_from_tensor") for c in fake.calls)
    eng.resume_memory(["weights"])
    assert fake.calls[-1] == ("resume", ("weights",))
    eng.update_weights(sd[:5])
    eng.update_weights(sd[5:])
    eng.finish_weight_update()
    ups = [c for c in fake.calls if c[0] == "update_weights_from_tensor"]
    assert ups == [("update_weights_from_tensor", "flattened_bucket", False, 1)] * 2
    assert [c[0] for c in fake.calls[-5:]] == [
        "begin_weight_update",
        "update_weights_from_tensor",
        "update_weights_from_tensor",
        "end_weight_update",
        "flush_cache",
    ]
    eng.resume_memory(["kv_cache", "cuda_graph"])
    ref = HFEngine(new.config, new.state_dict())
    assert [g[0].output_ids for g in eng.generate(PROMPTS, sp)] == [g[0].output_ids for g in ref.generate(PROMPTS, sp)]


def test_adapter_weight_update_checks(fake_sglang, model_dir):
    eng = se.SGLangEngine(str(model_dir), device="cuda")
    fake = FakeSGLEngine.instances[0]
    with pytest.raises(WeightUpdateError, match="model.bogus"):
        eng.update_weights([("model.bogus", torch.zeros(2))])
    with pytest.raises(WeightUpdateError, match="model.norm.weight"):
        eng.update_weights([("model.norm.weight", torch.zeros(3))])
    assert not any(c[0] == "update_weights_from_tensor" for c in fake.calls)
    eng.update_weights([("model.norm.weight", torch.ones(32)), ("lm_head.weight", torch.zeros(97, 32))])
    with pytest.raises(WeightUpdateError, match="model.embed_tokens.weight"):
        eng.finish_weight_update()
    with pytest.raises(TypeError, match="USED_API"):
        se.SGLangEngine(str(model_dir), device="cuda", not_a_server_arg=1)


def test_adapter_logprob_env_conflict(fake_sglang, model_dir, monkeypatch):
    monkeypatch.setenv(se.RAW_LOGPROB_ENV, "1")
    with pytest.raises(RuntimeError, match="processed"):
        se.SGLangEngine(str(model_dir), device="cuda")  # the default mode: tempered logprobs
    se.SGLangEngine(str(model_dir), device="cuda", logprobs_mode="raw")
    monkeypatch.setenv(se.RAW_LOGPROB_ENV, "0")
    with pytest.raises(RuntimeError, match="raw"):
        se.SGLangEngine(str(model_dir), device="cuda", logprobs_mode="raw")
    se.SGLangEngine(str(model_dir), device="cuda", logprobs_mode="processed")


def test_the_device_follows_torch_and_only_a_gpu_patches_the_reductions(fake_sglang, model_dir, monkeypatch):
    """``SGLangEngine(device=None)``: cuda where torch sees a GPU (SGLang's CUDA reduction patch,
    the memory saver, nothing of the CPU settings), else the CPU engine's settings, without the
    patch (under it a CPU tensor does not pickle). The CPU process preparation (driver stub,
    environment) is stood in for here: it is process-wide (tests/rollout/test_sglang_cpu_stub.py)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = se.SGLangEngine(str(model_dir), load_format="auto")
    kw = FakeSGLEngine.instances[-1].kwargs
    assert gpu.device == "cuda" and not gpu.on_cpu and gpu.cpu_driver is None and fake_sglang == [1]
    assert "device" not in kw and kw["enable_memory_saver"] is True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(se, "prepare_cpu_engine_process", lambda: {"driver": "stub", "path": "stood-in"})
    cpu = se.SGLangEngine(str(model_dir), load_format="auto")
    kw = FakeSGLEngine.instances[-1].kwargs
    assert cpu.device == "cpu" and cpu.on_cpu and cpu.cpu_driver["driver"] == "stub" and fake_sglang == [1]
    assert kw["device"] == "cpu" and kw["attention_backend"] == "torch_native" and kw["sleep_on_idle"] is True
    assert kw["enable_memory_saver"] is False and kw["disable_cuda_graph"] is True
