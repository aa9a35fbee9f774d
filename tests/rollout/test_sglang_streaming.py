"""SGLangEngine's streaming on a GPU's code path, where the CPU cannot go: what the real engine
covers on the CPU (streamed requests, aborts before and during generation, rids that are
prefixes of others, continuations: tests/rollout/test_sglang_cpu_engine.py) is not repeated here.
Left: the release refused while requests stream on the GPU path, the seeds of a streamed request,
and the wheel's abort rule itself, against the pinned sglang 0.5.23's own
``TokenizerManager.abort_request`` (cut out of the wheel, tests/rollout/sglang_wheel.py) and a
stand-in for the rest of the offline Engine:

``async_generate`` registers the request in ``rid_to_state`` at once (as the wheel's
``TokenizerManager._init_req_state``), marks it dispatched to the scheduler at the next turn
of the loop, then produces one token per 2 ms (the tokens of an HFEngine's blocking
generation with the same sampling settings); the scheduler aborts every *dispatched* request
whose rid starts with the aborted one (the wheel's ``Scheduler.abort_request`` rule, checked
below) and answers it with finish type "abort" and the tokens so far, as SGLang does.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import sys
from types import SimpleNamespace

import pytest

from megatron_dapo.rollout import sglang_engine as se
from megatron_dapo.rollout.base import Request, SamplingParams
from tests.rollout import sglang_wheel as sw
from tests.rollout.test_sglang_protocol import WheelEngine, model_dir, src, wheel_modules, wheel_sglang  # noqa: F401


def wheel_abort_request(src):
    """The wheel's TokenizerManager.abort_request, unmodified."""
    module = "sglang.srt.managers.tokenizer_manager"
    ns = dict(
        logger=logging.getLogger("wheel"),
        get_serving=lambda: SimpleNamespace(tokenizer_worker_num=1),
        AbortReq=lambda rid="", abort_all=False: SimpleNamespace(rid=rid, abort_all=abort_all),
        __name__=module,
    )
    return sw.run(
        sw.extract(src, module, ["abort_request"], cls="TokenizerManager"), ns, module.replace(".", "/") + ".py"
    )["abort_request"]


class StreamingEngine(WheelEngine):
    """WheelEngine (weights, memory) plus the streaming surface described in the module doc."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        abort = wheel_abort_request(WheelEngine.src)
        self.jobs = {}  # dispatched rid -> job
        self.aborts = []  # AbortReq the tokenizer manager sent
        self.finished = []  # our rids, in the order they ended
        tm = SimpleNamespace(rid_to_state={}, enable_metrics=False, _dispatch_to_scheduler=self._scheduler_abort)
        tm.abort_request = lambda rid="", abort_all=False: abort(tm, rid=rid, abort_all=abort_all)
        self.tokenizer_manager = tm

    def _scheduler_abort(self, req):
        self.aborts.append(req)
        for rid, job in self.jobs.items():
            if req.abort_all or rid.startswith(req.rid):
                job["aborted"] = True

    async def async_generate(self, input_ids=None, sampling_params=None, return_logprob=False, rid=None):
        assert isinstance(rid, str) and isinstance(input_ids[0], int) and return_logprob
        state = SimpleNamespace(dispatched=False, abort_sent=False)
        self.tokenizer_manager.rid_to_state[rid] = state
        sp = sampling_params
        ours = SamplingParams(
            temperature=sp["temperature"],
            top_p=sp["top_p"],
            top_k=sp["top_k"],
            max_new_tokens=sp["max_new_tokens"],
            ignore_eos=sp["ignore_eos"],
            seed=sp.get("sampling_seed"),
        )
        full = self.hf.generate([input_ids], ours)[0][0]
        await asyncio.sleep(0)  # tokenizing
        state.dispatched = True
        job = self.jobs[rid] = {"aborted": False}
        n = 0
        while n < len(full.output_ids) and not job["aborted"]:
            await asyncio.sleep(0.002)  # one decode step
            n += 1
        finish = {"type": "abort", "message": "Abort"} if job["aborted"] else {"type": full.finish_reason}
        del self.tokenizer_manager.rid_to_state[rid], self.jobs[rid]
        self.finished.append(rid)
        return {
            "text": None,
            "output_ids": full.output_ids[:n],
            "meta_info": {
                "id": rid,
                "finish_reason": finish,
                "output_token_logprobs": [(lp, t, None) for lp, t in zip(full.logprobs[:n], full.output_ids[:n])],
            },
        }


@pytest.fixture
def engine(wheel_sglang, model_dir, monkeypatch):  # noqa: F811
    monkeypatch.setattr(sys.modules["sglang"], "Engine", StreamingEngine)
    eng = se.SGLangEngine(str(model_dir), device="cuda", load_format="auto")
    return eng, WheelEngine.instances[-1]


def _greedy(n):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


def test_release_is_refused_while_requests_stream(engine):
    eng, _ = engine
    eng.submit([Request("a", [1, 2], _greedy(30))])
    with pytest.raises(RuntimeError, match="1 streamed requests outstanding"):
        eng.release_memory(["kv_cache"])
    eng.abort_requests()
    eng.release_memory(["kv_cache"])


def test_build_stream_request_seeds_like_sample_zero_of_a_blocking_call():
    r = Request("x", [5, 6], SamplingParams(temperature=0.7, max_new_tokens=9, seed=77))
    ids, sp = se.build_stream_request(r, default_seed=1)
    _, sps, _ = se.build_generate_requests([[5, 6]], SamplingParams(temperature=0.7, max_new_tokens=9, seed=77), 1)
    assert ids == [5, 6] and sp == sps[0]
    with pytest.raises(ValueError, match="n=1"):
        se.build_stream_request(Request("x", [5], SamplingParams(n=2)), 1)


def test_the_wheels_scheduler_aborts_by_rid_prefix(src):  # noqa: F811
    """Why RID_END: Scheduler.abort_request matches queued and running requests by prefix."""
    fn = next(
        n
        for n in ast.walk(src.cls("sglang.srt.managers.scheduler", "Scheduler"))
        if isinstance(n, ast.FunctionDef) and n.name == "abort_request"
    )
    text = ast.unparse(fn)
    assert "req.rid.startswith(recv_req.rid)" in text and "FINISH_ABORT()" in text
