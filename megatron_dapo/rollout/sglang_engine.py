"""SGLangEngine: a thin adapter around ``sglang.Engine`` (GPU), pinned to SGLANG_VERSION.

sglang is imported lazily (constructor / methods only). This module holds the adapter class
(launch, blocking generation, scoring, the weight-update session, memory, control calls);
its pieces live in modules of their own, all re-exported here:

- rollout/sglang_api.py: ``SGLANG_VERSION``, ``INSTALL_HINT``, the environment variable names
  and ``USED_API``, the table of everything the adapter uses of SGLang;
- rollout/sglang_launch.py: ``build_engine_kwargs``, ``graph_saver_launch``, the process
  environment set before SGLang starts, the lazy sglang import, and what is read from a local
  checkpoint (``checkpoint_weight_shapes``, ``routing_shape``, ``tied_embeddings``,
  ``config_vocab_size``);
- rollout/sglang_translation.py: the pure functions that translate between our types and
  SGLang's, exercised by CPU tests without sglang: ``to_sglang_sampling_params``,
  ``build_generate_requests``, ``from_sglang_output``, ``group_outputs``,
  ``build_score_requests``, ``from_sglang_score_output``;
- rollout/sglang_streaming.py: the streaming client (``submit`` / ``poll`` /
  ``abort_requests``, mixed into SGLangEngine), ``sglang_rid``, ``build_stream_request``;
- rollout/sglang_weights.py: ``payload_entries``, ``release_cached_memory`` and the weight
  checker's per-rank checksums (``rank_checksums``, ``diff_rank_checksums``);

the payload functions (``flatten_bucket`` / ``serialize_bucket``) live in
``megatron_dapo.rollout.payload``, shared with HFEngine.

Every SGLang entry point, keyword argument, server-arg field, sampling-param name, meta_info
key, constant and environment variable the adapter uses is listed in ``USED_API``
(rollout/sglang_api.py); tests/rollout/test_sglang_api.py checks each against the source of
the pinned wheel (read with ``ast``, never imported). Add to USED_API whenever you add a use
of SGLang here.

Logprobs: with ``logprobs_mode="processed"`` (default) ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is
left unset (an existing value must be falsy) and SGLang's sampler returns
``log_softmax(logits / T)`` at the request's temperature T, computed before top-k / top-p
truncation: the distribution the token was sampled from, which is what the trainer
recomputes (it divides its logits by the rollout temperature). With ``logprobs_mode="raw"``
the adapter sets the variable to 1 before SGLang starts its scheduler processes and gets
``log_softmax(logits)`` at temperature 1. Greedy requests are raw in either mode. The
variable is process-wide: all SGLangEngines started by one process must use the same mode.
``score`` uses prompt ("input") logprobs, which SGLang 0.5.23 always computes from raw logits
(the adapter asks at temperature 1.0 anyway).

Weight updates (0.5.23's protocol): ``update_weights_from_tensor`` is refused outside a
session, so the adapter opens one (``Engine.begin_weight_update``) explicitly or at the first
bucket and ends it (``Engine.end_weight_update``) in ``finish_weight_update``. The call
returns once SGLang has enqueued the copies, so a bucket's flat buffer is kept until the next
SGLang call has returned or the session ends, then freed (and the CUDA allocator's cache
emptied). Every control call's result is checked. See docs/rollout.md.
"""

from __future__ import annotations

import functools
import logging
import random
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from megatron_dapo.rollout.base import (
    CUDA_GRAPH,
    LOGPROBS_MODES,
    WEIGHTS,
    EngineReleasedError,
    RolloutEngine,
    SamplingParams,
    WeightUpdateError,
    check_weight_action,
)
from megatron_dapo.rollout.payload import (  # noqa: F401  (re-exported: one serializer for every engine)
    BUCKET_ALIGN_BYTES,
    BucketEntry,
    default_serializer,
    flatten_bucket,
    reconstruct_bucket,
    serialize_bucket,
)
from megatron_dapo.rollout.sglang_api import (  # noqa: F401  (re-exported: the adapter's public names)
    FLATTENED_BUCKET,
    GRAPH_SAVER_ENV,
    INSTALL_HINT,
    RAW_LOGPROB_ENV,
    SGLANG_VERSION,
    USED_API,
)
from megatron_dapo.rollout.sglang_cpu import cpu_engine_kwargs, prepare_cpu_engine_process
from megatron_dapo.rollout.sglang_launch import (  # noqa: F401  (re-exported)
    _import_sglang,
    _set_graph_saver_env,
    _set_logprob_env,
    build_engine_kwargs,
    checkpoint_weight_shapes,
    config_vocab_size,
    graph_saver_launch,
    routing_shape,
    tied_embeddings,
)
from megatron_dapo.rollout.sglang_streaming import (  # noqa: F401  (re-exported)
    RID_END,
    STREAM_ABORT_TIMEOUT_S,
    SGLangStreaming,
    _Stream,
    build_stream_request,
    in_loop,
    sglang_rid,
)
from megatron_dapo.rollout.sglang_translation import (  # noqa: F401  (re-exported)
    build_generate_requests,
    build_score_requests,
    from_sglang_output,
    from_sglang_score_output,
    group_outputs,
    parse_finish_reason,
    to_sglang_sampling_params,
)
from megatron_dapo.rollout.sglang_weights import (  # noqa: F401  (re-exported)
    FUSED_FROM_HF,
    ProbeHashes,
    diff_rank_checksums,
    hf_sources,
    payload_entries,
    rank_checksums,
    release_cached_memory,
)

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------- the adapter ----
class SGLangEngine(SGLangStreaming, RolloutEngine):
    """``sglang.Engine`` behind the RolloutEngine interface (token ids in and out).

    ``expected_shapes``: HF name -> shape used to validate buckets and the completeness of a
    weight update; by default read from the safetensors headers of a local ``model_path``.
    With tied embeddings (config.json) a ``lm_head.weight`` in a bucket is accepted, checked
    against the embedding's shape and not sent (the engine's head is its embedding). ``None`` and a non-local path:
    names and shapes are not checked (a warning is logged).

    Launched with ``load_format="dummy"`` (random weights): ``generate`` and ``score`` raise
    until the first complete weight update, and again after ``resume_memory(["weights"])``
    until the next one (the resumed memory's contents are undefined), like HFEngine.
    """

    def __init__(
        self,
        model_path: str,
        *,
        tp_size: int = 1,
        mem_fraction_static: float = 0.5,
        base_gpu_id: Optional[int] = 0,
        enable_memory_saver: bool = True,
        dtype: str = "bfloat16",
        random_seed: Optional[int] = None,
        enable_deterministic_inference: bool = False,
        logprobs_mode: str = "processed",
        expected_shapes: Optional[Dict[str, Tuple[int, ...]]] = None,
        load_format: str = "dummy",
        tokenizer_path: Optional[str] = None,
        device: Optional[str] = None,
        **server_args,
    ) -> None:
        super().__init__()
        # "cuda", or "cpu" (the test bench: rollout/sglang_cpu.py); None: cuda where torch sees a GPU
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"SGLangEngine device must be 'cuda' or 'cpu', got {self.device!r}")
        self.on_cpu = self.device == "cpu"
        if self.on_cpu and server_args.get("enable_return_routed_experts"):
            raise ValueError(
                "--routing-replay with SGLang on the CPU: SGLang captures routed experts in pinned host memory, "
                "which needs a GPU (run --routing-replay on a GPU, or use --rollout-engine hf on CPU)"
            )
        #: on CPU: the memory tags whose release / resume was a no-op (the CPU engine keeps its memory)
        self.memory_noops: List[Tuple[str, str]] = []
        self.cpu_driver: Optional[Dict[str, str]] = None
        if self.on_cpu:  # before SGLang is imported: its kernels' objects need libcuda.so.1
            self.cpu_driver = prepare_cpu_engine_process()
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
        unknown = sorted(set(server_args) - set(USED_API["server_args"]))
        if unknown:
            raise TypeError(f"server args {unknown} are not in USED_API['server_args'] (add and test them)")
        self.logprobs_mode = logprobs_mode
        self.tp_size = int(tp_size)
        _set_logprob_env(logprobs_mode)
        if self.on_cpu:
            enable_memory_saver = False
            server_args["disable_cuda_graph"] = True
        _set_graph_saver_env(enable_memory_saver, bool(server_args.get("disable_cuda_graph", False)))
        sglang = _import_sglang()
        from sglang.srt.utils.common import MultiprocessingSerializer  # sglang: imported by an engine only
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata

        if not self.on_cpu:
            # sender side: CUDA IPC handles carry device UUIDs. It rewrites every tensor
            # reduction for CUDA tensors: with it a CPU tensor does not pickle (IndexError in
            # patch_torch._modify_tuple), so a CPU engine's adapter leaves torch's own.
            monkey_patch_torch_reductions()
        self._serializer = MultiprocessingSerializer.serialize
        self._metadata_cls = FlattenedTensorMetadata

        self.tied = False
        self.vocab_size: Optional[int] = None
        if Path(model_path).is_dir():
            if expected_shapes is None:
                expected_shapes = checkpoint_weight_shapes(model_path)
            self.tied = tied_embeddings(model_path)
            self.vocab_size = config_vocab_size(model_path)
        if expected_shapes is None:
            logger.warning("SGLangEngine: no expected weight names for %s; updates are not checked", model_path)
        self._shapes = expected_shapes
        # per-call seeds when a request brings none (see build_generate_requests)
        self._seed_rng = random.Random(random_seed)
        self._session_open = False
        self._streams: Dict[str, _Stream] = {}  # our rid -> its async_generate task
        self._rid_prefix = f"mdapo-{uuid.uuid4().hex[:12]}-"
        self._held: List[torch.Tensor] = []  # flat buffers SGLang may still be copying from
        self._session_devices: set = set()  # devices of the buffers freed in this session
        self._probe: Optional[ProbeHashes] = None  # armed for a probe sync (weight_checksums)
        # load_format="dummy": nothing valid until the first complete sync
        self._weights_valid = load_format != "dummy"
        kwargs = build_engine_kwargs(
            model_path,
            tp_size=tp_size,
            mem_fraction_static=mem_fraction_static,
            base_gpu_id=base_gpu_id,
            enable_memory_saver=enable_memory_saver,
            dtype=dtype,
            random_seed=random_seed,
            enable_deterministic_inference=enable_deterministic_inference,
            load_format=load_format,
            tokenizer_path=tokenizer_path,
            **server_args,
        )
        if self.on_cpu:
            kwargs = cpu_engine_kwargs(kwargs)
        self._engine = sglang.Engine(**kwargs)
        # routing replay: (layers, top_k) of a MoE checkpoint launched with enable_return_routed_experts
        self._routing_shape = routing_shape(model_path) if server_args.get("enable_return_routed_experts") else None

    def _wants_routing(self, params: SamplingParams) -> bool:
        if not params.return_routed_experts:
            return False
        if self._routing_shape is None:
            raise ValueError(
                "return_routed_experts: launch SGLangEngine(enable_return_routed_experts=True) on a "
                "mixture-of-experts checkpoint (--routing-replay)"
            )
        return True

    # generation
    def _check_can_generate(self, what: str) -> None:
        super()._check_can_generate(what)
        self._check_not_released(CUDA_GRAPH, what)  # SGLang would replay graphs on freed memory
        if not self._weights_valid:
            raise EngineReleasedError(
                f"SGLangEngine.{what}() called before a complete weight update (update_weights ... "
                "finish_weight_update) since launch (load_format='dummy') or resume_memory(['weights']): "
                "weights are undefined"
            )

    def generate(self, prompts, params: SamplingParams):
        self._check_can_generate("generate")
        ids, sps, index = build_generate_requests(prompts, params, self._seed_rng.getrandbits(63))
        if not ids:
            return [[] for _ in prompts]
        routed = self._wants_routing(params)
        if routed:  # (only then: the flag needs the engine launched with enable_return_routed_experts)
            outs = self._engine.generate(
                input_ids=ids, sampling_params=sps, return_logprob=True, return_routed_experts=True
            )
        else:
            outs = self._engine.generate(input_ids=ids, sampling_params=sps, return_logprob=True)
        shape = self._routing_shape if routed else None
        flat = [from_sglang_output(o, p, shape) for o, p in zip(outs, ids)]
        return group_outputs(flat, index, len(prompts))

    # streaming: submit / poll / abort_requests are SGLangStreaming's (rollout/sglang_streaming.py)

    def score(self, sequences, prompt_lens):
        self._check_can_generate("score")
        ids, sps, starts = build_score_requests(sequences, prompt_lens)
        if not ids:
            return []
        outs = self._engine.generate(input_ids=ids, sampling_params=sps, return_logprob=True, logprob_start_len=starts)
        return [from_sglang_score_output(o, s, p, self.vocab_size) for o, s, p in zip(outs, ids, prompt_lens)]

    # weights
    def expected_weight_names(self) -> List[str]:
        if self._shapes is None:
            return sorted(self._received)
        names = set(self._shapes)
        if self.tied:
            names.discard("lm_head.weight")
        return sorted(names)

    def _check_entries(self, named_shapes) -> List[str]:
        """Names (and shapes, where given) of a bucket against the checkpoint; returns the
        names that count for completeness (a tied lm_head does not)."""
        out = []
        emb = (self._shapes or {}).get("model.embed_tokens.weight")
        for name, shape in named_shapes:
            if self.tied and name == "lm_head.weight":
                if shape is not None and emb is not None and tuple(shape) != tuple(emb):
                    raise WeightUpdateError(
                        f"shape mismatch for 'lm_head.weight': bucket has {tuple(shape)}, "
                        f"tied embedding has {tuple(emb)}"
                    )
                continue
            if self._shapes is not None:
                if name not in self._shapes:
                    raise WeightUpdateError(f"unknown parameter name {name!r} in weight bucket")
                if shape is not None and tuple(shape) != tuple(self._shapes[name]):
                    raise WeightUpdateError(
                        f"shape mismatch for {name!r}: bucket has {tuple(shape)}, "
                        f"checkpoint has {tuple(self._shapes[name])}"
                    )
            out.append(name)
        return out

    def begin_weight_update(self) -> None:
        """Open SGLang's weight-update session (``update_weights`` opens it when needed)."""
        self._check_not_released(WEIGHTS, "begin_weight_update")
        if not self._session_open:
            _check_result(self._engine.begin_weight_update(), "begin_weight_update")
            self._session_open = True

    def _load_bucket(self, bucket):
        names = self._check_entries([(n, tuple(t.shape)) for n, t in bucket])
        if self._probe is not None:
            self._probe.observe(bucket)
        if self.tied:
            # The tied head is the embedding: the engine gets embed_tokens, lm_head is dropped.
            bucket = [(n, t) for n, t in bucket if n != "lm_head.weight"]
        if not bucket:
            return []
        payloads, flat = serialize_bucket(
            bucket, self.tp_size, metadata_cls=self._metadata_cls, serializer=self._serializer
        )
        self._send(payloads, hold=flat)
        return names

    def update_weights_from_payloads(self, payloads: Sequence[Any], names: Optional[Sequence[str]] = None) -> None:
        """Load a bucket that is already serialized: ``payloads[k]`` is TP rank k's
        ``{"flattened_tensor", "metadata"}`` payload (SGLang's FlattenedTensorMetadata entries),
        referring to memory on rank k's GPU that its sender keeps untouched until this call
        returns and the next call to this engine has returned (or ``finish_weight_update``
        has). The names and shapes are read from payload 0's metadata (no tensor is rebuilt
        here), checked against the checkpoint and counted for completeness; ``names``, if
        given, must be the same names."""
        self._check_not_released(WEIGHTS, "update_weights_from_payloads")
        if len(payloads) != self.tp_size:
            raise ValueError(
                f"update_weights_from_payloads needs one payload per TP rank: got {len(payloads)}, "
                f"tp_size is {self.tp_size}"
            )
        entries = payload_entries(payloads[0])
        if names is not None and list(names) != [n for n, _ in entries]:
            raise WeightUpdateError(f"names {list(names)} differ from the payload's {[n for n, _ in entries]}")
        checked = self._check_entries(entries)
        if self._probe is not None:  # a probe sync: the tensors are read here (rank 0's copy)
            from sglang.srt.utils.common import MultiprocessingSerializer  # what the scheduler reads payloads with

            obj = MultiprocessingSerializer.deserialize(payloads[0])
            self._probe.observe(reconstruct_bucket(obj["flattened_tensor"], obj["metadata"]))
        self._send(list(payloads), hold=None)
        self._received.update(checked)

    def _send(self, payloads, hold: Optional[torch.Tensor]) -> None:
        self.begin_weight_update()
        try:
            result = self._engine.update_weights_from_tensor(
                named_tensors=payloads, load_format=FLATTENED_BUCKET, flush_cache=False
            )
            _check_result(result, "update_weights_from_tensor")
        except BaseException:
            if hold is not None:
                self._held.append(hold)
            self._close_session(failed=True)
            raise
        # The scheduler handles calls in order: returning from this call, it is done with
        # the previous bucket (and has dropped its mapping), so that buffer may go; this
        # bucket's copies may still be queued on its device, so this buffer stays held
        # until the next call returns or the session ends.
        self._free_held()
        if hold is not None:
            self._held.append(hold)

    # weights over a collective group: the trainer broadcasts, the engine receives (asynchronous
    # training will feed busy engines this way: issue #40); hybrid/weight_broadcast.py is the sender
    def init_weights_update_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> None:
        """Join the group the trainer broadcasts weights over (SGLang's ``init_weights_update_group``):
        the sender is rank 0, this engine's TP rank k is rank ``rank_offset + k``; returns once
        every member joined (the sender opens its side with
        ``hybrid.weight_broadcast.open_weight_update_group``). ``backend``: "nccl" on GPUs, "gloo"
        on CPUs."""
        result = self._engine.init_weights_update_group(
            master_address=master_address,
            master_port=int(master_port),
            rank_offset=int(rank_offset),
            world_size=int(world_size),
            group_name=group_name,
            backend=backend,
        )
        _check_result(result, "init_weights_update_group")

    def update_weights_from_distributed(
        self, entries: Sequence[Tuple[str, str, Sequence[int]]], group_name: str
    ) -> None:
        """One bucket that the sender broadcasts over ``group_name``: ``entries`` are (HF name,
        dtype name such as "float32", shape), in the order of the broadcasts. Checked against
        the checkpoint and counted for completeness as :meth:`update_weights` is; runs in the
        weight-update session. Blocks until every tensor arrived."""
        self._check_not_released(WEIGHTS, "update_weights_from_distributed")
        entries = [(str(n), str(d).replace("torch.", ""), [int(x) for x in s]) for n, d, s in entries]
        checked = self._check_entries([(n, tuple(s)) for n, _, s in entries])
        self.begin_weight_update()
        try:
            result = self._engine.update_weights_from_distributed(
                names=[n for n, _, _ in entries],
                dtypes=[d for _, d, _ in entries],
                shapes=[s for _, _, s in entries],
                group_name=group_name,
                flush_cache=False,
            )
            _check_result(result, "update_weights_from_distributed")
        except BaseException:
            self._close_session(failed=True)
            raise
        self._received.update(checked)

    def destroy_weights_update_group(self, group_name: str) -> None:
        _check_result(self._engine.destroy_weights_update_group(group_name=group_name), "destroy_weights_update_group")

    def set_weight_version(self, version: int) -> None:
        """``RolloutEngine.set_weight_version``, and SGLang's own: its scheduler records the
        change for every request in flight (SGLang's ``update_weight_version``, requests kept),
        and each finished request's ``meta_info["weight_versions"]`` spans give its tokens'
        versions (``GenerationOutput.token_versions``)."""
        super().set_weight_version(version)
        from sglang.srt.managers.io_struct import UpdateWeightVersionReqInput  # sglang: the adapter's import

        tm = self._engine.tokenizer_manager
        req = UpdateWeightVersionReqInput(new_version=str(int(version)), abort_all_requests=False)
        self._engine.loop.run_until_complete(tm.update_weight_version(req))

    def _end_weight_update(self) -> None:
        self._close_session(failed=False)

    def _close_session(self, failed: bool) -> None:
        try:
            if self._session_open:
                self._session_open = False
                result = self._engine.end_weight_update()
                if not failed:
                    _check_result(result, "end_weight_update")
        finally:
            self._free_held()
            # the buffers' memory goes back to the driver once per session, not per bucket
            release_cached_memory(self._session_devices)
            self._session_devices = set()

    def _free_held(self) -> None:
        self._session_devices.update(t.device for t in self._held)
        self._held = []

    def finish_weight_update(self) -> None:
        self._weights_valid = False
        super().finish_weight_update()  # ends the session, flushes, raises on missing names
        self._weights_valid = True

    def check_weights(self, action: str) -> List[str]:
        """``RolloutEngine.check_weights`` through SGLang's own weight checker, by SGLang's
        parameter names (fused qkv_proj / gate_up_proj, TP shards): "snapshot" and "compare"
        ask every rank for the hash of each of its parameters (checker action "checksum",
        gathered over the TP ranks) and compare them per rank here; "reset_tensors" is the
        checker's own (random values in every parameter). The checker's "snapshot"/"compare"
        actions are not used: only TP rank 0's compare result reaches the caller (every rank
        answers, the others' answers are dropped), and the snapshot is a host copy of all the
        engine's weights kept until the compare."""
        check_weight_action(action)
        self._check_not_released(WEIGHTS, f"check_weights({action!r})")
        if action == "reset_tensors":
            self._weight_checker("reset_tensors")
            self._weights_valid = False  # random until the next complete update
            return []
        now = rank_checksums(self._weight_checker("checksum"))
        if action == "snapshot":
            self._checksum_snapshot = now
            return []
        before = getattr(self, "_checksum_snapshot", None)
        if before is None:
            raise RuntimeError(
                "SGLangEngine.check_weights('compare') without a snapshot: call check_weights('snapshot') first"
            )
        self._checksum_snapshot = None
        return diff_rank_checksums(before, now)

    def _weight_checker(self, action: str):
        """One call of SGLang's weight checker on the target model; the per-rank answers."""
        from sglang.srt.managers.io_struct import CheckWeightsReqInput  # sglang: imported by an engine only

        req = CheckWeightsReqInput(action=action, allow_quant_error=False, skip_tensor_list=None, selector="target")
        tm = self._engine.tokenizer_manager
        result = self._engine.loop.run_until_complete(tm.check_weights(req, None))
        _check_result(result, f"check_weights(action={action!r})")
        return result[2]

    def arm_weight_checksums(self) -> None:
        """The next sync is a probe sync: record what it hands over (``ProbeHashes``)."""
        from sglang.srt.managers.mm_utils import tensor_hash  # sglang: imported by an engine only

        self._check_not_released(WEIGHTS, "arm_weight_checksums")
        device = torch.device(self.device)
        dtype = self._engine.tokenizer_manager.model_config.dtype
        # the weight checker's own hash (weight_checker._hash_tensor), on the engine's device
        self._probe = ProbeHashes(lambda t: f"{tensor_hash(t.to(device)):016x}", dtype, self.tied)

    def weight_checksums(self, dtypes=None):
        """``RolloutEngine.weight_checksums`` through SGLang's weight checker: after an armed
        sync, each HF tensor's checksum as the adapter received it when the SGLang parameter it
        was loaded into (fused q/k/v, gate/up; padded vocabulary) holds exactly the expected
        bytes, else a line saying what differs (``sglang_weights.ProbeHashes``). The received
        checksums are in the dtype sent (``dtypes`` is not needed). The expected layout is
        TP 1's: an engine with several TP ranks, or one not armed for this sync (restarted
        since), reports nothing (NotImplementedError: the check skips it, the logprob half
        runs)."""
        probe, self._probe = self._probe, None
        if probe is None:
            raise NotImplementedError("SGLangEngine.weight_checksums: this sync was not armed (arm_weight_checksums)")
        self._check_not_released(WEIGHTS, "weight_checksums")
        ranks = rank_checksums(self._weight_checker("checksum"))
        if len(ranks) != 1:
            raise NotImplementedError(
                f"SGLangEngine.weight_checksums models TP 1's parameter layout; this engine answered for {sorted(ranks)}"
            )
        return probe.verdicts(next(iter(ranks.values())))

    # memory
    def _refuse_while_streaming(self, tags) -> None:
        if self._streams:
            raise RuntimeError(
                f"SGLangEngine.release_memory({list(tags)}) with {len(self._streams)} streamed requests outstanding: "
                "abort_requests() (or poll them to the end) first"
            )

    def _release(self, tags):
        self._refuse_while_streaming(tags)
        if self.on_cpu:
            return self._memory_noop("release", tags)
        result = self._engine.release_memory_occupation(tags=list(tags))
        _check_result(result, "release_memory_occupation")
        if WEIGHTS in tags:
            self._weights_valid = False

    def _resume(self, tags):
        if self.on_cpu:
            return self._memory_noop("resume", tags)
        result = self._engine.resume_memory_occupation(tags=list(tags))
        _check_result(result, "resume_memory_occupation")
        if WEIGHTS in tags:
            self._weights_valid = False  # contents undefined until a complete update
            self._received = set()

    def _memory_noop(self, what: str, tags) -> List[str]:
        """On the CPU, SGLang cannot release its memory (the scheduler synchronizes CUDA there):
        the call is recorded (``memory_noops``, and returned: the hybrid event log shows it),
        the protocol is kept as on a GPU (generate refuses while a tag is "released"; resumed
        weights need a complete update)."""
        if not self.memory_noops:
            logger.info("SGLangEngine on the CPU: memory release and resume are no-ops (the engine keeps its memory)")
        self.memory_noops.extend((what, t) for t in tags)
        if WEIGHTS in tags:
            self._weights_valid = False  # as on a GPU: a complete update before the next generate
            if what == "resume":
                self._received = set()
        return list(tags)

    # misc
    def flush_cache(self) -> None:
        _check_result(self._engine.flush_cache(), "flush_cache")

    def abort(self) -> None:
        tm = self._engine.tokenizer_manager
        loop = self._engine.loop
        if loop.is_running():  # another thread is inside the loop: the call joins it there
            loop.call_soon_threadsafe(functools.partial(tm.abort_request, abort_all=True))
        else:  # in the loop from this thread (zmq's sends need the thread's event loop)
            in_loop(loop, tm.abort_request, [{"abort_all": True}])

    def health(self) -> bool:
        if self._engine is None:
            return False
        try:
            self._engine.get_server_info()
            return True
        except Exception:  # noqa: BLE001 - any failure means unhealthy
            return False

    def shutdown(self) -> None:
        if self._engine is not None:
            self._held = []
            self._engine.shutdown()
            self._engine = None


def _check_result(result, what: str) -> None:
    """SGLang control calls return (success, message[, ...]) tuples (begin/end_weight_update,
    update_weights_from_tensor), objects with .success (flush_cache) or None
    (release/resume_memory_occupation, whose failures raise in SGLang)."""
    ok, msg = True, ""
    if isinstance(result, tuple) and result and isinstance(result[0], bool):
        ok, msg = result[0], (result[1] if len(result) > 1 else "")
    elif hasattr(result, "success"):
        ok, msg = bool(result.success), getattr(result, "message", "")
    elif result is not None:
        raise RuntimeError(f"SGLang {what} returned an unexpected result {result!r}")
    if not ok:
        raise RuntimeError(f"SGLang {what} failed: {msg}")
