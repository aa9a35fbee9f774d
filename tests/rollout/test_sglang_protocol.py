"""SGLangEngine against the pinned sglang 0.5.23's OWN code, run on the CPU.

sglang does not import here, so tests/rollout/sglang_wheel.py cuts the pieces out of the
cached wheel (see test_sglang_api.py for how it is fetched) and runs them unmodified:
``MultiprocessingSerializer`` / ``SafeUnpickler`` and the payload normalisation,
``Engine._serialize_tensors_per_rank``, ``tp_worker.deserialize_own_rank``, the scheduler's
``SchedulerWeightUpdaterManager`` (the weight-update session rule, release/resume by memory
tag), the model runner's flattened-bucket loader with ``FlattenedTensorBucket``, the
communicator's result merge, and the input-logprob post-processing.

``WheelEngine`` is a stand-in for ``sglang.Engine`` built from those pieces; generation runs
on an HFEngine. Its model applies weight copies the way a GPU does: ``load_weights`` only
enqueues them (the call returns before the copy ran) and they run at the engine's next call,
reading the sender's buffer then; a buffer the sender has freed by that time is read as
garbage (NaN), which is what reusing freed CUDA memory does.
"""

from __future__ import annotations

import asyncio
import functools
import math
import sys
import threading
import types

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from megatron_dapo.rollout import sglang_engine as se
from megatron_dapo.rollout.base import (
    CUDA_GRAPH,
    KV_CACHE,
    MEMORY_TAGS,
    WEIGHTS,
    EngineReleasedError,
    SamplingParams,
    WeightUpdateError,
)
from megatron_dapo.rollout.hf_engine import HFEngine
from tests.rollout import sglang_wheel as sw
from tests.rollout.helpers import PROMPTS, qwen2_config, random_model


# ------------------------------------------------------------------ the wheel's code ----
@pytest.fixture(scope="module")
def src():
    return sw.wheel()


@pytest.fixture
def wheel_modules(src, monkeypatch):
    """The wheel's tensor_bucket (importable by name: SafeUnpickler resolves classes through
    sys.modules) and constants modules, plus the serializer namespace; undone after the test."""
    for name in ("sglang", "sglang.srt", "sglang.srt.weight_sync"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    name = "sglang.srt.weight_sync.tensor_bucket"
    mod = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, mod)
    mod.__dict__.update(vars(sw.exec_module(src, name)))
    for cls in (mod.FlattenedTensorMetadata, mod.FlattenedTensorBucket):
        cls.__module__ = name
    consts = sw.exec_module(src, "sglang.srt.constants")
    yield types.SimpleNamespace(
        tensor_bucket=mod, constants=consts, ser=sw.serializer_namespace(src), checks=sw.check_weights_io_namespace(src)
    )
    from multiprocessing import resource_sharer

    resource_sharer.stop()  # the fd-passing thread our in-process CPU payloads started


class DeferredModel:
    """The engine's weights on a pretend device. ``load_weights`` enqueues the copies and
    keeps only weak references to their sources (a CUDA IPC mapping does not stop the sender
    from freeing and reusing its memory); ``run_pending`` executes them."""

    def __init__(self, hf: HFEngine):
        self.hf = hf
        self.model = hf.model
        self.pending = []
        self.sources = []  # weak refs to every source buffer ever loaded
        self.garbage_reads = 0

    def named_buffers(self):
        return self.hf.model.named_buffers()

    def load_weights(self, named_tensors):
        for name, t in named_tensors:
            ref = StorageWeakRef(t.untyped_storage())
            self.sources.append(ref)
            self.pending.append((name, ref, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype))

    def run_pending(self):
        todo, self.pending = self.pending, []
        for name, ref, off, shape, stride, dtype in todo:
            if ref.expired():
                self.garbage_reads += 1
                src = torch.full(shape, math.nan, dtype=dtype)
            else:
                storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
                src = torch.empty(0, dtype=dtype).set_(storage, off, shape, stride).clone()
            self.hf._load_bucket([(name, src)])


class _ThreadGather:
    """torch.distributed.all_gather_object over in-process TP ranks (one thread per rank)."""

    def __init__(self, n: int):
        self.n, self.slots = n, {}
        self.barrier = threading.Barrier(n, timeout=60)

    def __call__(self, rank, out, obj):
        self.slots[rank] = obj
        self.barrier.wait()
        out[:] = [self.slots[r] for r in range(self.n)]
        self.barrier.wait()


class WheelEngine:
    """``sglang.Engine`` (offline API) assembled from the wheel's own weight-update code and
    weight checker (reached through the tokenizer manager's ``check_weights``)."""

    instances = []
    src = None
    wheel = None

    def __init__(self, **kwargs):
        from transformers import AutoConfig

        self.kwargs = kwargs
        self.calls = []
        tp = int(kwargs.get("tp_size", 1))
        cfg = AutoConfig.from_pretrained(kwargs["model_path"])
        # load_format="dummy": random weights, the first sync fills them
        self.hf = HFEngine(cfg) if kwargs.get("load_format") == "dummy" else HFEngine(kwargs["model_path"])
        self.model = DeferredModel(self.hf)
        self._paused = [set() for _ in range(tp)]  # each TP rank's memory saver
        w, src = WheelEngine.wheel, WheelEngine.src
        ser = w.ser
        self._normalize = ser["normalize_serialized_named_tensor_payloads"]
        self._serialize_per_rank = sw.engine_serialize_function(src, ser, tp)
        self._merge = sw.merge_results_function(src)
        fns = sw.runner_weight_updater_functions(src, w.tensor_bucket)
        runner_check = sw.model_runner_check_weights(src)
        gather = _ThreadGather(tp)
        self.managers = []
        for rank in range(tp):
            ns = sw.session_manager_namespace(
                src, rank, tp, w.constants, barrier=lambda r: None, gather=gather, io_ns=w.checks
            )
            runner_wu = types.SimpleNamespace(
                get_model=lambda: self.model,
                _assert_weight_cache_inactive=lambda op: None,
                begin_weight_update=lambda: self.calls.append(("runner.begin",)),
                end_weight_update=lambda run_post_load: self.calls.append(("runner.end", run_post_load)),
            )
            runner_wu._update_weights_from_flattened_bucket = lambda wu=runner_wu, **kw: fns[
                "_update_weights_from_flattened_bucket"
            ](wu, **kw)
            runner_wu.update_weights_from_tensor = lambda wu=runner_wu, **kw: fns["update_weights_from_tensor"](
                wu, **kw
            )
            own = sw.deserialize_own_rank_function(src, ser, rank, tp)
            # the model runner: its weight updater and its WeightChecker (the wheel's, on this rank)
            checker = sw.weight_checker_namespace(src, rank, tp)["WeightChecker"](get_model=lambda: self.hf.model)
            runner = types.SimpleNamespace(weight_updater=runner_wu, _weight_checker=checker)
            runner.check_weights = lambda runner=runner, **kw: runner_check(runner, **kw)
            tp_worker = types.SimpleNamespace(
                weight_update_runners=lambda runner=runner: [("target", runner)],
                deserialize_own_rank=lambda payloads, own=own: own(None, payloads),
                model_runner=types.SimpleNamespace(model=self.model),
            )
            saver = types.SimpleNamespace(
                pause=lambda tag, r=rank: self._pause(r, tag), resume=lambda tag, r=rank: self._resume(r, tag)
            )
            scheduler = types.SimpleNamespace(
                _engine_paused=False, disaggregation_mode="null", record_weight_version_change=lambda new_version: None
            )
            self.managers.append(
                ns["SchedulerWeightUpdaterManager"](
                    tp_worker=tp_worker,
                    draft_worker=None,
                    memory_saver_adapter=saver,
                    flush_cache=lambda empty_cache=True: True,
                    is_fully_idle=lambda ignore_waiting=False: True,
                    scheduler=scheduler,
                )
            )
        tm = types.SimpleNamespace(
            abort_request=lambda rid="", abort_all=False: self.calls.append(("abort", abort_all)),
            auto_create_handle_loop=lambda: None,
            check_weights_communicator=self._check_weights_fan_out,
        )
        tm_check = sw.tokenizer_check_weights(src)
        tm.check_weights = lambda obj, request=None: tm_check(tm, obj, request)
        self.tokenizer_manager = tm
        self.loop = asyncio.new_event_loop()
        WheelEngine.instances.append(self)

    # memory saver: a paused region's contents are undefined after resume
    @property
    def paused(self):
        return set().union(*self._paused)

    def _pause(self, rank, tag):
        if tag in self._paused[rank]:
            raise AssertionError(f"memory saver: {tag} paused twice")
        self._paused[rank].add(tag)

    def _resume(self, rank, tag):
        self._paused[rank].remove(tag)
        if tag == "weights":
            with torch.no_grad():
                for p in self.hf.model.parameters():
                    p.fill_(math.nan)

    def _tick(self):
        self.model.run_pending()  # the device ran everything enqueued before this call

    async def _check_weights_fan_out(self, req):
        """The tokenizer manager's check_weights communicator: every TP rank's scheduler runs
        the request (they all-gather checksums over the TP group, hence one thread each); only
        the entry rank (TP rank 0) answers, as in SGLang (the others' sender has no socket)."""
        self._tick()
        self.calls.append(("check_weights", req.action, req.selector))
        outs = [None] * len(self.managers)

        def one(r):
            outs[r] = self.managers[r].check_weights(req)

        threads = [threading.Thread(target=one, args=(r,)) for r in range(len(self.managers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert all(o is not None for o in outs), "a TP rank did not answer check_weights"
        self.answers = outs
        return [outs[0]]

    # --- the Engine API ---------------------------------------------------------------
    def begin_weight_update(self, selector: str = "all"):
        self._tick()
        self.calls.append(("begin_weight_update",))
        req = types.SimpleNamespace(selector=selector)
        return self._merge([m.begin_weight_update(req) for m in self.managers])

    def end_weight_update(self):
        self._tick()
        self.calls.append(("end_weight_update",))
        return self._merge([m.end_weight_update(types.SimpleNamespace()) for m in self.managers])

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        self._tick()
        self.calls.append(("update_weights_from_tensor", load_format, flush_cache, len(named_tensors)))
        serialized = self._normalize(self._serialize_per_rank(self, named_tensors, load_format))
        req = types.SimpleNamespace(
            serialized_named_tensors=serialized,
            load_format=load_format,
            flush_cache=flush_cache,
            abort_all_requests=False,
            weight_version=None,
            selector="all",
            torch_empty_cache=False,
        )
        return self._merge([m.update_weights_from_tensor(req) for m in self.managers])

    def release_memory_occupation(self, tags=None):
        self._tick()
        self.calls.append(("release", tuple(tags)))
        for m in self.managers:
            m.release_memory_occupation(types.SimpleNamespace(tags=tags))

    def resume_memory_occupation(self, tags=None):
        self._tick()
        self.calls.append(("resume", tuple(tags)))
        for m in self.managers:
            m.resume_memory_occupation(types.SimpleNamespace(tags=tags))

    def flush_cache(self):
        self._tick()
        self.calls.append(("flush_cache",))
        return types.SimpleNamespace(success=True, message="")

    def generate(self, input_ids=None, sampling_params=None, return_logprob=False, logprob_start_len=None):
        self._tick()
        if self.paused:
            raise AssertionError(f"generate while {sorted(self.paused)} released: SGLang would crash")
        self.calls.append(("generate", len(input_ids)))
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
            ours = SamplingParams(
                temperature=sp["temperature"],
                top_p=sp["top_p"],
                top_k=sp["top_k"],
                max_new_tokens=sp["max_new_tokens"],
                ignore_eos=sp["ignore_eos"],
                seed=sp.get("sampling_seed"),
            )
            o = self.hf.generate([ids], ours)[0][0]
            outs.append(
                {
                    "text": None,
                    "output_ids": o.output_ids,
                    "meta_info": {
                        "finish_reason": {"type": o.finish_reason},
                        "output_token_logprobs": [(lp, t, None) for lp, t in zip(o.logprobs, o.output_ids)],
                    },
                }
            )
        return outs

    def get_server_info(self):
        return {"version": "wheel"}

    def shutdown(self):
        self.calls.append(("shutdown",))


@pytest.fixture
def wheel_sglang(src, wheel_modules, monkeypatch):
    """``import sglang`` inside the adapter finds WheelEngine and the wheel's serializer."""
    ser = wheel_modules.ser

    def mod(name, **attrs):
        m = sys.modules.get(name) or types.ModuleType(name)
        for k, v in attrs.items():
            setattr(m, k, v)
        monkeypatch.setitem(sys.modules, name, m)

    mod("sglang", Engine=WheelEngine)
    mod("sglang.srt.utils")
    mod("sglang.srt.utils.common", MultiprocessingSerializer=ser["MultiprocessingSerializer"])
    mod("sglang.srt.utils.patch_torch", monkey_patch_torch_reductions=lambda: None)
    mod("sglang.srt.managers")
    mod("sglang.srt.managers.io_struct", CheckWeightsReqInput=wheel_modules.checks["CheckWeightsReqInput"])
    monkeypatch.delenv(se.RAW_LOGPROB_ENV, raising=False)
    monkeypatch.setattr(WheelEngine, "src", src)
    monkeypatch.setattr(WheelEngine, "wheel", wheel_modules)
    monkeypatch.setattr(WheelEngine, "instances", [])
    return wheel_modules


@pytest.fixture
def model_dir(tmp_path):
    random_model(qwen2_config()).save_pretrained(tmp_path)
    return tmp_path


def _new_weights(seed=3):
    new = random_model(qwen2_config(), seed=seed)
    return new, [(k, v) for k, v in new.state_dict().items() if k != "lm_head.weight"]


def _assert_engine_has(fake, model):
    for name, t in model.state_dict().items():
        if name != "lm_head.weight":
            assert torch.equal(fake.hf.get_weight(name), t), name


# ------------------------------------------------------- the payload through the wheel ----
def _wheel_serializer(ns):
    """The wheel's MultiprocessingSerializer.serialize: what an SGLang engine's feeders use
    (``rollout.engines.codec_for("sglang")``)."""
    return ns.ser["MultiprocessingSerializer"].serialize


def test_wheel_serializer_and_bucket_decode_our_payload(src, wheel_modules):
    tb, ser = wheel_modules.tensor_bucket, wheel_modules.ser
    g = torch.Generator().manual_seed(0)
    tensors = [
        ("a.bf16", torch.randn(3, 5, generator=g).to(torch.bfloat16)),
        ("b.f32", torch.randn(7, generator=g)),
        ("c.i64", torch.arange(3)),
        ("d.empty", torch.zeros(0, 4)),
        ("e.noncontig", torch.randn(4, 6, generator=g).t()),
    ]
    payloads, flat = se.serialize_bucket(
        tensors, 2, metadata_cls=tb.FlattenedTensorMetadata, serializer=ser["MultiprocessingSerializer"].serialize
    )
    # our serializer writes a pickle of the same protocol (a CPU buffer of ours travels by file
    # name; the SGLang feeders use SGLang's serializer: rollout.engines.codec_for)
    ours, _ = se.serialize_bucket(tensors[:1], 1, metadata_cls=tb.FlattenedTensorMetadata)
    assert isinstance(ours[0], str) and ser["normalize_serialized_named_tensor_payload"](ours[0])[:2] == b"\x80\x04"
    raw = ser["normalize_serialized_named_tensor_payloads"](payloads)  # Engine + TokenizerManager
    for rank in range(2):
        own = sw.deserialize_own_rank_function(src, ser, rank, 2)(None, raw)
        assert set(own) == {"flattened_tensor", "metadata"}
        assert all(type(m) is tb.FlattenedTensorMetadata for m in own["metadata"])
        back = tb.FlattenedTensorBucket(
            flattened_tensor=own["flattened_tensor"], metadata=own["metadata"]
        ).reconstruct_tensors()
        for (n, t), (m, r) in zip(tensors, back):
            assert n == m and r.dtype == t.dtype and r.shape == t.shape and torch.equal(r, t)
    del flat


def test_wheel_unpickler_refuses_a_metadata_class_of_ours(wheel_modules):
    # Why the adapter sends SGLang's FlattenedTensorMetadata and never our BucketEntry.
    ser = wheel_modules.ser
    payloads, flat = se.serialize_bucket(
        [("x", torch.ones(2))], 1, metadata_cls=se.BucketEntry, serializer=ser["MultiprocessingSerializer"].serialize
    )
    with pytest.raises(RuntimeError, match="Blocked unsafe global.*BucketEntry"):
        ser["MultiprocessingSerializer"].deserialize(payloads[0])
    del flat


def test_wheel_session_rule_refuses_updates_outside_a_session(wheel_sglang, model_dir):
    fake = WheelEngine(model_path=str(model_dir), tp_size=1, load_format="dummy")
    _, sd = _new_weights()
    payloads, flat = se.serialize_bucket(
        sd[:2],
        1,
        metadata_cls=wheel_sglang.tensor_bucket.FlattenedTensorMetadata,
        serializer=_wheel_serializer(wheel_sglang),
    )
    ok, msg = fake.update_weights_from_tensor(named_tensors=payloads, load_format="flattened_bucket", flush_cache=False)
    assert not ok and "begin_weight_update" in msg
    assert fake.end_weight_update()[0] is False
    assert fake.begin_weight_update() == (True, "Success")
    assert fake.begin_weight_update()[0] is False  # one session at a time
    del flat


# ---------------------------------------------------------- the adapter, end to end ----
def test_adapter_runs_every_update_in_a_session(wheel_sglang, model_dir):
    eng = se.SGLangEngine(str(model_dir), device="cuda", tp_size=2)
    fake = WheelEngine.instances[0]
    new, sd = _new_weights()
    eng.release_memory(MEMORY_TAGS)
    eng.resume_memory([WEIGHTS])
    eng.update_weights(sd[:5])  # opens the session lazily
    eng.update_weights(sd[5:])
    eng.finish_weight_update()
    names = [c[0] for c in fake.calls]
    i = names.index("begin_weight_update")
    assert [n for n in names[i:] if not n.startswith("runner.")] == [
        "begin_weight_update",
        "update_weights_from_tensor",
        "update_weights_from_tensor",
        "end_weight_update",
        "flush_cache",
    ]
    ups = [c for c in fake.calls if c[0] == "update_weights_from_tensor"]
    assert ups == [("update_weights_from_tensor", "flattened_bucket", False, 2)] * 2  # one payload per TP rank
    assert fake.model.garbage_reads == 0
    _assert_engine_has(fake, new)
    # an explicit begin, then a second sync
    eng.begin_weight_update()
    eng.update_weights(sd)
    eng.finish_weight_update()
    assert [c[0] for c in fake.calls].count("begin_weight_update") == 2


def test_adapter_keeps_buffers_until_sglang_loaded_them(wheel_sglang, model_dir, monkeypatch):
    released = []
    monkeypatch.setattr(se, "release_cached_memory", lambda devices: released.append(set(devices)))
    eng = se.SGLangEngine(str(model_dir), device="cuda")
    fake = WheelEngine.instances[0]
    new, sd = _new_weights()
    for k in range(0, len(sd), 3):  # several buckets: each copy runs during the next call
        eng.update_weights(sd[k : k + 3])
    assert released == []  # the allocator cache is emptied once per session, at its end
    eng.finish_weight_update()
    assert released == [{torch.device("cpu")}]
    assert fake.model.garbage_reads == 0, "a bucket's buffer was freed before SGLang copied from it"
    _assert_engine_has(fake, new)
    # ... and none is kept after the session ended
    assert fake.model.sources and all(ref.expired() for ref in fake.model.sources)


def test_failed_update_ends_the_session_and_names_the_call(wheel_sglang, model_dir):
    eng = se.SGLangEngine(str(model_dir), device="cuda")
    fake = WheelEngine.instances[0]
    _, sd = _new_weights()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fake, "update_weights_from_tensor", lambda **kw: (False, "boom"))
        with pytest.raises(RuntimeError, match="update_weights_from_tensor failed: boom"):
            eng.update_weights(sd[:2])
    engine_calls = [c for c in fake.calls if not c[0].startswith("runner.")]
    assert engine_calls[-1] == ("end_weight_update",)  # not left open: the next sync can begin
    assert not any(m._session for m in fake.managers)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fake, "begin_weight_update", lambda selector="all": (False, "nope"))
        with pytest.raises(RuntimeError, match="begin_weight_update failed: nope"):
            eng.update_weights(sd[:2])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fake, "end_weight_update", lambda: (False, "late"))
        eng.update_weights(sd)
        with pytest.raises(RuntimeError, match="end_weight_update failed: late"):
            eng.finish_weight_update()
    fake.end_weight_update()  # (the failed end above left the wheel's session open)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fake, "flush_cache", lambda: types.SimpleNamespace(success=False, message="busy"))
        eng.update_weights(sd)
        with pytest.raises(RuntimeError, match="flush_cache failed: busy"):
            eng.finish_weight_update()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fake, "release_memory_occupation", lambda tags=None: {"unexpected": 1})
        with pytest.raises(RuntimeError, match="release_memory_occupation returned an unexpected"):
            eng.release_memory([KV_CACHE])


def test_weights_undefined_until_first_sync(wheel_sglang, model_dir):
    eng = se.SGLangEngine(str(model_dir), device="cuda", tokenizer_path="/tok")
    fake = WheelEngine.instances[0]
    assert fake.kwargs["load_format"] == "dummy" and fake.kwargs["tokenizer_path"] == "/tok"
    se.SGLangEngine(str(model_dir), device="cuda")
    assert WheelEngine.instances[-1].kwargs["tokenizer_path"] == str(model_dir)
    sp = SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True)
    with pytest.raises(EngineReleasedError, match="weight update"):
        eng.generate(PROMPTS, sp)
    with pytest.raises(EngineReleasedError, match="weight update"):
        eng.score([[1, 2, 3]], [1])
    new, sd = _new_weights()
    eng.update_weights(sd)
    eng.finish_weight_update()
    ref = HFEngine(new.config, new.state_dict())
    assert [g[0].output_ids for g in eng.generate(PROMPTS, sp)] == [g[0].output_ids for g in ref.generate(PROMPTS, sp)]
    # resumed weights are undefined again until the next complete sync
    eng.release_memory([WEIGHTS])
    eng.resume_memory([WEIGHTS])
    with pytest.raises(EngineReleasedError, match="weight update"):
        eng.generate(PROMPTS, sp)


def test_full_memory_tag_cycle(wheel_sglang, model_dir):
    eng = se.SGLangEngine(str(model_dir), device="cuda")
    fake = WheelEngine.instances[0]
    new, sd = _new_weights()
    sp = SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True)
    eng.release_memory(MEMORY_TAGS)
    assert set(fake.managers[0].offload_tags) == set(wheel_sglang.constants.GPU_MEMORY_ALL_TYPES)
    assert fake.paused == {"weights", "kv_cache", "cuda_graph"}
    eng.resume_memory([WEIGHTS])
    eng.update_weights(sd)
    eng.finish_weight_update()
    eng.resume_memory([KV_CACHE])
    with pytest.raises(EngineReleasedError, match="cuda_graph"):
        eng.generate(PROMPTS, sp)
    eng.resume_memory([CUDA_GRAPH])
    assert not fake.paused and not fake.managers[0].offload_tags
    ref = HFEngine(new.config, new.state_dict())
    assert [g[0].output_ids for g in eng.generate(PROMPTS, sp)] == [g[0].output_ids for g in ref.generate(PROMPTS, sp)]


def test_hf_engine_accepts_the_same_tag_cycle():
    new, sd = _new_weights()
    eng = HFEngine(new.config, new.state_dict())
    sp = SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True)
    want = [g[0].output_ids for g in eng.generate(PROMPTS, sp)]
    eng.release_memory(MEMORY_TAGS)
    assert eng.param_storage_bytes() == 0
    eng.resume_memory([WEIGHTS])
    eng.begin_weight_update()
    eng.update_weights(sd)
    eng.finish_weight_update()
    eng.resume_memory([KV_CACHE, CUDA_GRAPH])
    assert [g[0].output_ids for g in eng.generate(PROMPTS, sp)] == want


def test_update_from_ready_payloads(wheel_sglang, model_dir):
    eng = se.SGLangEngine(str(model_dir), device="cuda", tp_size=2)
    fake = WheelEngine.instances[0]
    new, sd = _new_weights()
    meta = wheel_sglang.tensor_bucket.FlattenedTensorMetadata
    bucket = functools.partial(se.serialize_bucket, metadata_cls=meta, serializer=_wheel_serializer(wheel_sglang))
    keep = []
    for k in range(0, len(sd), 4):
        payloads, flat = bucket(sd[k : k + 4], 2)
        keep.append(flat)  # the feeder owns its buffers
        eng.update_weights_from_payloads(payloads)  # names and shapes come from the metadata
    eng.finish_weight_update()
    assert fake.model.garbage_reads == 0
    _assert_engine_has(fake, new)
    payloads, flat = bucket(sd[:1], 2)
    with pytest.raises(ValueError, match="one payload per TP rank"):
        eng.update_weights_from_payloads(payloads[:1])
    with pytest.raises(WeightUpdateError, match="differ"):
        eng.update_weights_from_payloads(payloads, ["model.norm.weight"])
    bogus, bflat = bucket([("model.bogus", torch.ones(2))], 2)
    with pytest.raises(WeightUpdateError, match="model.bogus"):
        eng.update_weights_from_payloads(bogus)
    wrong, wflat = bucket([("model.norm.weight", torch.ones(3))], 2)
    with pytest.raises(WeightUpdateError, match="shape mismatch"):
        eng.update_weights_from_payloads(wrong)
    assert not any(c[0] == "update_weights_from_tensor" for c in fake.calls[-3:])
    eng.update_weights_from_payloads(payloads, [sd[0][0]])
    with pytest.raises(WeightUpdateError, match="missing"):
        eng.finish_weight_update()
    del flat, keep, bflat, wflat


class _Boom:
    def __reduce__(self):
        return (sys.exit, ("a tensor was rebuilt",))


def test_payload_metadata_is_read_without_rebuilding_tensors(wheel_modules):
    import base64
    import pickle

    meta = wheel_modules.tensor_bucket.FlattenedTensorMetadata
    entry = meta(name="w", shape=torch.Size([2, 3]), dtype=torch.bfloat16, start_idx=0, end_idx=12, numel=12)
    payload = base64.b64encode(pickle.dumps({"flattened_tensor": _Boom(), "metadata": [entry]})).decode()
    assert se.payload_entries(payload) == [("w", (2, 3))]
    with pytest.raises(WeightUpdateError, match="flattened-bucket payload"):
        se.payload_entries(pickle.dumps([1, 2]))


def test_release_cached_memory_only_for_device_buffers(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    se.release_cached_memory([torch.device("cpu")])
    assert calls == []
    se.release_cached_memory([torch.device("cpu"), torch.device("cuda", 1), torch.device("cuda", 1)])
    assert calls == [1]


# ---------------------------------------------------------------------- sampling seeds ----
def test_seeds_distinct_per_prompt_and_sample():
    prompts = [[1, 2], [1, 2], [3]]  # a repeated prompt must not repeat its samples
    for params, default in ((SamplingParams(n=3, seed=5), 99), (SamplingParams(n=3), 99)):
        _, sps, index = se.build_generate_requests(prompts, params, default_seed=default)
        seeds = [sp["sampling_seed"] for sp in sps]
        assert len(set(seeds)) == len(seeds) == 9
        assert all(0 <= s < 2**63 for s in seeds)  # SGLang's SamplingParams range
        again = [sp["sampling_seed"] for sp in se.build_generate_requests(prompts, params, default_seed=default)[1]]
        assert again == seeds
    with_seed = [
        sp["sampling_seed"]
        for sp in se.build_generate_requests(prompts, SamplingParams(n=3, seed=5), default_seed=1)[1]
    ]
    assert with_seed == [
        sp["sampling_seed"]
        for sp in se.build_generate_requests(prompts, SamplingParams(n=3, seed=5), default_seed=2)[1]
    ]  # the request's seed wins


def test_wheel_sampling_params_accept_our_requests(src):
    SglSamplingParams = sw.sampling_params_class(src)
    top_k_all = 1 << 30
    cases = [
        SamplingParams(temperature=1.0, n=4, seed=2**62 + 5, max_new_tokens=8),
        SamplingParams(temperature=0.7, top_p=0.9, top_k=5, stop=["\n"], stop_token_ids=[3], n=2),
        SamplingParams(temperature=0.0, max_new_tokens=0, ignore_eos=True),
    ]
    for params in cases:
        _, sps, _ = se.build_generate_requests([[1, 2], [3]], params, default_seed=2**63 - 1)
        for d in sps:
            sp = SglSamplingParams(**d)
            sp.verify(vocab_size=97)  # raises on anything SGLang refuses (e.g. a seed out of range)
            assert sp.sampling_seed == d["sampling_seed"] and sp.n == 1
            if params.temperature == 0:
                assert sp.top_k == 1  # SGLang's greedy
            else:
                assert sp.temperature == params.temperature
                assert sp.top_k == (top_k_all if params.top_k == -1 else params.top_k)
    _, sps, _ = se.build_score_requests([[1, 2, 3]], [1])
    SglSamplingParams(**sps[0]).verify(vocab_size=97)


def test_adapter_seeds_every_request_and_passes_deterministic_flag(wheel_sglang, model_dir):
    eng = se.SGLangEngine(str(model_dir), device="cuda", enable_deterministic_inference=True, random_seed=7)
    fake = WheelEngine.instances[0]
    assert fake.kwargs["enable_deterministic_inference"] is True and fake.kwargs["random_seed"] == 7
    seen = []
    fake.generate = lambda input_ids=None, sampling_params=None, **kw: (
        seen.extend(sp["sampling_seed"] for sp in sampling_params)
        or [
            {"output_ids": [], "meta_info": {"finish_reason": {"type": "length"}, "output_token_logprobs": []}}
            for _ in input_ids
        ]
    )
    _, sd = _new_weights()
    eng.update_weights(sd)
    eng.finish_weight_update()
    eng.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=1))
    eng.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=1))
    assert len(seen) == 12 and len(set(seen)) == 12  # no seed repeats, across calls too
    seen_first = seen[:6]
    seen.clear()
    eng2 = se.SGLangEngine(str(model_dir), device="cuda", random_seed=7)
    WheelEngine.instances[-1].generate = fake.generate
    eng2.update_weights(sd)
    eng2.finish_weight_update()
    eng2.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=1))
    assert seen == seen_first  # reproducible from random_seed


# --------------------------------------------------------------- scoring at vocab's end ----
def test_score_tolerates_ids_clipped_at_the_end_of_the_vocabulary(src):
    vocab = 97
    process, detok = sw.input_logprob_functions(src)
    seq = [3, vocab - 1, 7, vocab - 1, vocab - 2]
    prompt_len = 2
    start = prompt_len - 1
    raw = [-0.1 * (k + 1) for k in range(len(seq) - start)]  # per position, last one is the sampled token's
    req = types.SimpleNamespace(origin_input_ids=seq, logprob_start_len=start, logprob=types.SimpleNamespace())
    me = types.SimpleNamespace(
        model_config=types.SimpleNamespace(vocab_size=vocab), _uses_scoring_positions=lambda r: False
    )
    process(me, req, raw)
    entries = detok(None, req.logprob.input_token_logprobs_val, req.logprob.input_token_logprobs_idx, False)
    # [None] + lp[:-1]; the last id of the vocabulary comes back as 0
    assert entries[0][0] is None and [e[1] for e in entries] == [0, 7, 0, vocab - 2]
    out = {"meta_info": {"input_token_logprobs": entries}}
    assert se.from_sglang_score_output(out, seq, prompt_len, vocab_size=vocab) == raw[:3]
    # a real mismatch is still caught, and 0 is accepted only for ids SGLang clips
    bad = {"meta_info": {"input_token_logprobs": [entries[0], (entries[1][0], 8, None)] + entries[2:]}}
    with pytest.raises(ValueError, match="token 7"):
        se.from_sglang_score_output(bad, seq, prompt_len, vocab_size=vocab)
    clipped = {"meta_info": {"input_token_logprobs": [entries[0], entries[1], entries[2], (entries[3][0], 0, None)]}}
    with pytest.raises(ValueError, match="token 95"):
        se.from_sglang_score_output(clipped, seq, prompt_len, vocab_size=vocab)


# ---------------------------------------------------------------------------- logprobs ----
def test_logprobs_are_the_tempered_distribution_by_default(wheel_sglang, model_dir, monkeypatch):
    import os

    se.SGLangEngine(str(model_dir), device="cuda")
    assert se.RAW_LOGPROB_ENV not in os.environ  # SGLang then returns log_softmax(logits / T)
    monkeypatch.setenv(se.RAW_LOGPROB_ENV, "1")
    with pytest.raises(RuntimeError, match="processed"):
        se.SGLangEngine(str(model_dir), device="cuda")
