"""HFEngine: a transformers causal LM on CPU behind the RolloutEngine interface.

For tests and demos. The sampling loop is our own (left-padded batch, attention mask,
explicit position ids, a transformers ``DynamicCache``), so that it honours exactly our
``SamplingParams`` and returns per-token logprobs.

Sampling, per step and per row: ``logits`` (fp32) -> greedy argmax when temperature is 0,
else ``logits / T`` -> top-k -> top-p (smallest set of highest-probability tokens whose mass
reaches top_p) -> softmax -> inverse-CDF draw with one uniform number from the row's own
``torch.Generator``. Logprobs: see ``megatron_dapo.rollout.base`` (raw by default).

Seeds: sample j of a request with ``seed`` uses ``derive_seed(seed, j)`` and consumes exactly
one uniform per generated token, so its random stream does not depend on the batch it ran
in. The guarantee achieved: a seeded request gives the same tokens whatever else is in the
batch *as long as the model's logits for it are the same*; on CPU fp32 they are in practice
(tested with different batch compositions and paddings), but batch-dependent numerics could
in principle move a probability across the drawn uniform. Unseeded rows draw their seed from
the engine's own RNG (constructor ``seed``).

Stop strings (need ``tokenizer``): after each token the sample's output is decoded; at the
first occurrence of any stop string the sample finishes with reason "stop". ``output_ids``
keep every token up to and including the one that completed the stop string (that token may
carry characters past it) and nothing after; ``text`` is cut just before the stop string.
Stop tokens (EOS and ``stop_token_ids``) are included in ``output_ids``.

Streaming (``submit`` / ``poll`` / ``abort_requests``, the rollout manager's interface):
continuous batching over ``max_running`` slots, rollout/continuous.py; ``poll`` runs the decode
steps. Releasing "weights" or "kv_cache" while streamed requests are outstanding is refused.

Memory: ``release_memory(["weights"])`` resizes every parameter storage to 0 bytes (really
freed); ``resume_memory(["weights"])`` re-allocates it with *undefined contents*: generate and
score refuse until a complete weight update has been finished (``finish_weight_update``).
The KV cache only lives during a ``generate`` call; releasing "kv_cache" drops any cache
kept and makes generate/score refuse until it is resumed.
"""

from __future__ import annotations

import inspect
import os
import random
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from megatron_dapo.rollout.base import (
    KV_CACHE,
    LOGPROBS_MODES,
    WEIGHTS,
    EngineReleasedError,
    Finished,
    GenerationOutput,
    Request,
    RolloutEngine,
    SamplingParams,
    WeightUpdateError,
    check_weight_action,
    derive_seed,
)
from megatron_dapo.rollout.checksum import dtype_of, itemsize, tensor_checksum
from megatron_dapo.rollout.continuous import ContinuousBatcher
from megatron_dapo.rollout.payload import load_payload, reconstruct_bucket
from megatron_dapo.rollout.routing import RoutingRecorder


class HFEngine(RolloutEngine):
    """``HFEngine(model_dir)`` or ``HFEngine(config, state_dict)`` or ``HFEngine((config, sd))``.

    ``state_dict=None`` with a config gives random weights (load real ones with
    update_weights), unless ``load_weights_from`` names the HF checkpoint directory to read
    them from (what ``--check-weight-sync-init`` needs: the engine starts from the checkpoint).
    ``eos_token_ids`` defaults to the config's ``eos_token_id``.
    """

    def __init__(
        self,
        model: Union[str, os.PathLike, object, Tuple[object, Dict[str, torch.Tensor]]],
        state_dict: Optional[Dict[str, torch.Tensor]] = None,
        *,
        tokenizer=None,
        dtype: torch.dtype = torch.float32,
        device: Union[str, torch.device] = "cpu",
        eos_token_ids: Optional[Sequence[int]] = None,
        pad_token_id: Optional[int] = None,
        logprobs_mode: str = "raw",
        seed: Optional[int] = None,
        load_weights_from: Optional[Union[str, os.PathLike]] = None,
        max_running: int = 128,
    ) -> None:
        super().__init__()
        self._update_groups: dict = {}  # weight-update groups joined (init_weights_update_group)
        self._staged: list = []  # broadcast tensors received, loaded by finish_weight_update
        self._staged_lock = threading.Lock()
        from transformers import AutoModelForCausalLM  # transformers: ~2.5 s to import, only when an engine is built

        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
        if isinstance(model, tuple):
            if state_dict is not None:
                raise TypeError("pass either (config, state_dict) or config, state_dict")
            model, state_dict = model
        self.device = torch.device(device)
        self.dtype = dtype
        if load_weights_from is not None:
            if isinstance(model, (str, os.PathLike)) or state_dict is not None:
                raise TypeError("load_weights_from is only accepted with a config and no state_dict")
            self.model = AutoModelForCausalLM.from_pretrained(str(load_weights_from), config=model, dtype=dtype)
        elif isinstance(model, (str, os.PathLike)):
            if state_dict is not None:
                raise TypeError("state_dict is only accepted with a config")
            self.model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype)
        else:
            self.model = AutoModelForCausalLM.from_config(model, dtype=dtype)
        self.model.to(self.device).eval()
        self.model.requires_grad_(False)
        _own_storages(self.model)  # release_memory resizes storages: not the checkpoint's mmap
        self.config = self.model.config
        self.tokenizer = tokenizer
        self.logprobs_mode = logprobs_mode
        self._rng = random.Random(seed)
        self._abort = threading.Event()
        self._closed = False
        self._weights_valid = True
        self._snapshot: Optional[Dict[str, torch.Tensor]] = None  # check_weights("snapshot")
        # LoRA adapters (load_lora_adapter_from_tensors): name -> {weight: (alpha/r) B A}; the base
        # of every adapted weight as the last full update left it; the adapter requests are served with
        self._loras: Dict[str, Dict[str, torch.Tensor]] = {}
        self._lora_base: Dict[str, torch.Tensor] = {}
        self.active_lora: Optional[str] = None
        self._cache = None
        self._step_hook: Optional[Callable[[int], None]] = None  # tests: called every step
        self._stream = ContinuousBatcher(self, max_running)
        self._router_rec = RoutingRecorder.attach(self.model)  # MoE: the routers' top-k (routing replay)

        if eos_token_ids is None:
            eos = getattr(self.config, "eos_token_id", None)
            if eos is None and getattr(self.model, "generation_config", None) is not None:
                eos = self.model.generation_config.eos_token_id
            eos_token_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        self.eos_token_ids = [int(t) for t in eos_token_ids]
        if pad_token_id is None:
            pad_token_id = getattr(self.config, "pad_token_id", None)
            if pad_token_id is None:
                pad_token_id = self.eos_token_ids[0] if self.eos_token_ids else 0
        self.pad_token_id = int(pad_token_id)

        fwd_params = inspect.signature(type(self.model).forward).parameters
        self._cache_kwarg = "cache" if "cache" in fwd_params else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in fwd_params

        self._build_name_index()
        if state_dict is not None:
            self.update_weights(list(state_dict.items()))
            self.finish_weight_update()

    # ------------------------------------------------------------------ weights ----
    def _build_name_index(self) -> None:
        # named_parameters() drops duplicates: a tied lm_head.weight is not listed, the
        # embedding is. Persistent buffers are part of a checkpoint too.
        self._params: Dict[str, torch.Tensor] = dict(self.model.named_parameters())
        persistent = self.model.state_dict(keep_vars=True)
        for name, t in self.model.named_buffers():
            if name in persistent:
                self._params[name] = t
        # Aliases: every state_dict name sharing storage with a canonical one (tied weights).
        self._alias: Dict[str, str] = {n: n for n in self._params}
        by_ptr = {}
        for n, t in self._params.items():
            by_ptr.setdefault(t.data_ptr(), n)
        for n, t in persistent.items():
            if n not in self._alias and t.data_ptr() in by_ptr:
                self._alias[n] = by_ptr[t.data_ptr()]
        self._storages = {}  # data_ptr-independent list of unique storages, filled on release

    def expected_weight_names(self) -> List[str]:
        return sorted(self._params)

    def _load_bucket(self, bucket: List[Tuple[str, torch.Tensor]]) -> List[str]:
        # Validate the whole bucket before touching any parameter.
        plan = []
        for name, tensor in bucket:
            if not isinstance(tensor, torch.Tensor):
                raise WeightUpdateError(f"bucket entry {name!r} is not a tensor: {type(tensor).__name__}")
            canonical = self._alias.get(name)
            if canonical is None:
                raise WeightUpdateError(
                    f"unknown parameter name {name!r} in weight bucket (the model has "
                    f"{len(self._params)} parameters, e.g. {sorted(self._params)[:3]})"
                )
            param = self._params[canonical]
            if tuple(tensor.shape) != tuple(param.shape):
                raise WeightUpdateError(
                    f"shape mismatch for {name!r}: bucket has {tuple(tensor.shape)}, model expects {tuple(param.shape)}"
                )
            if tensor.is_floating_point() != param.is_floating_point():
                raise WeightUpdateError(
                    f"dtype mismatch for {name!r}: bucket has {tensor.dtype}, model has {param.dtype}"
                )
            plan.append((canonical, param, tensor))
        with torch.no_grad():
            for _, param, tensor in plan:
                param.data.copy_(tensor.to(device=param.device, dtype=param.dtype))
        return [c for c, _, _ in plan]

    def finish_weight_update(self) -> None:
        self._mapped = []  # the feeders' buffers (update_weights_from_payloads)
        with self._staged_lock:  # what a broadcast received (update_weights_from_distributed)
            staged, self._staged = self._staged, []
        if staged:
            self.update_weights(staged)
        super().finish_weight_update()  # raises on missing names
        self._weights_valid = True
        self._lora_base, self.active_lora = {}, None  # a full update is the new base, no adapter on it

    # ------------------------------------------------------------------ LoRA adapters ----
    def load_lora_adapter_from_tensors(
        self, lora_name: str, tensors: Dict[str, torch.Tensor], config_dict: dict
    ) -> None:
        """SGLang's call (``Engine.load_lora_adapter_from_tensors``): an adapter in PEFT's names
        (``base_model.model.<module>.lora_A.weight`` ``[r, in]``, ``...lora_B.weight`` ``[out, r]``)
        with its ``adapter_config.json`` dict (``r``, ``lora_alpha``, ``use_rslora``). It becomes the
        adapter requests are served with (this engine serves one at a time: the newest; SGLang's
        requests name theirs): every adapted weight is set to ``base + (alpha / r) B A``, the base
        being what the last full weight update left. Validated whole before anything changes."""
        self._check_not_released(WEIGHTS, "load_lora_adapter_from_tensors")
        r = int(config_dict["r"])
        alpha = float(config_dict.get("lora_alpha", r))
        scaling = alpha / (r**0.5 if config_dict.get("use_rslora") else r)
        pairs: Dict[str, Dict[str, torch.Tensor]] = {}
        for key, t in tensors.items():
            name = key[len("base_model.model.") :] if key.startswith("base_model.model.") else key
            for which in ("A", "B"):
                suffix = f".lora_{which}.weight"
                if name.endswith(suffix):
                    pairs.setdefault(name[: -len(suffix)] + ".weight", {})[which] = t
                    break
            else:
                raise WeightUpdateError(f"LoRA adapter {lora_name!r}: {key!r} is no lora_A / lora_B weight")
        deltas = {}
        for weight, ab in pairs.items():
            canonical = self._alias.get(weight)
            if canonical is None or set(ab) != {"A", "B"}:
                raise WeightUpdateError(
                    f"LoRA adapter {lora_name!r}: {weight!r} is {'no weight of the model' if canonical is None else 'missing lora_A or lora_B'}"
                )
            a, b, param = ab["A"], ab["B"], self._params[canonical]
            if a.shape[0] != r or b.shape[1] != r or (b.shape[0], a.shape[1]) != tuple(param.shape):
                raise WeightUpdateError(
                    f"LoRA adapter {lora_name!r}: {weight}: A {tuple(a.shape)} and B {tuple(b.shape)} at rank {r} "
                    f"do not make the weight's {tuple(param.shape)}"
                )
            deltas[canonical] = (b.float() @ a.float()) * scaling
        self._loras[lora_name] = deltas
        self._activate(lora_name)

    def unload_lora_adapter(self, lora_name: str) -> None:
        """SGLang's call: forget the adapter; if it was the one served, the base is served again."""
        if lora_name not in self._loras:
            raise WeightUpdateError(f"no LoRA adapter {lora_name!r} is loaded (loaded: {sorted(self._loras)})")
        del self._loras[lora_name]
        if self.active_lora == lora_name:
            self._activate(None)

    @torch.no_grad()
    def _activate(self, lora_name: Optional[str]) -> None:
        deltas = self._loras.get(lora_name, {}) if lora_name else {}
        for name in set(deltas) | set(self._lora_base):
            param = self._params[name]
            base = self._lora_base.setdefault(name, param.detach().clone())
            delta = deltas.get(name)
            param.copy_(base if delta is None else (base.float() + delta).to(param.dtype))
        self.active_lora = lora_name

    def get_weight(self, name: str) -> torch.Tensor:
        """The engine's current tensor for an HF name (aliases allowed); for tests/probes."""
        self._check_not_released(WEIGHTS, "get_weight")
        return self._params[self._alias[name]].detach()

    def weight_checksums(self, dtypes: Optional[Dict[str, str]] = None) -> Dict[str, Optional[tuple]]:
        """Checksums of the engine's current tensors by canonical HF name (see
        ``RolloutEngine.weight_checksums``)."""
        self._check_not_released(WEIGHTS, "weight_checksums")
        out: Dict[str, Optional[tuple]] = {}
        for name in self.expected_weight_names():
            t = self._params[name].detach()
            want = (dtypes or {}).get(name)
            if want is not None and itemsize(want) > t.element_size():
                out[name] = None  # narrower than what was sent: the bytes cannot match
                continue
            out[name] = tensor_checksum(t, dtype_of(want) if want else None)
        return out

    def check_weights(self, action: str) -> List[str]:
        """``RolloutEngine.check_weights`` on the HF tensors (canonical names): the snapshot is
        a copy in host memory; "reset_tensors" fills floating tensors with uniform [0, 1)
        values and integer ones with random integers (SGLang's WeightChecker does the same);
        "compare" is bitwise (``torch.equal`` on the raw bytes)."""
        check_weight_action(action)
        self._check_not_released(WEIGHTS, f"check_weights({action!r})")
        with torch.no_grad():
            if action == "snapshot":
                self._snapshot = {n: t.detach().clone() for n, t in self._params.items()}
                return []
            if action == "reset_tensors":
                for t in self._params.values():
                    t.copy_(_random_like(t))
                self._weights_valid = False  # garbage until the next complete update
                return []
            if self._snapshot is None:
                raise RuntimeError(
                    "HFEngine.check_weights('compare') without a snapshot: call check_weights('snapshot') first"
                )
            snap, self._snapshot = self._snapshot, None
            out = []
            for name in sorted(snap):
                want, got = snap[name], self._params[name].detach()
                if _same_bytes(want, got):
                    continue
                err = (got.double() - want.double()).abs()
                out.append(
                    f"{name}: max_abs_err={float(err.max()):.4g}, {int((err != 0).sum())} of "
                    f"{want.numel()} elements differ"
                )
            return out

    # ------------------------------------------------------------------- memory ----
    def _unique_storages(self):
        seen = {}
        for t in self._params.values():
            s = t.data.untyped_storage()
            seen.setdefault(id(s) if s.data_ptr() == 0 else s.data_ptr(), (t, s))
        return list(seen.values())

    def _release(self, tags: List[str]) -> None:
        if self._stream.outstanding:
            raise RuntimeError(
                f"HFEngine.release_memory({tags}) with {self._stream.outstanding} streamed requests outstanding: "
                "abort_requests() (or poll them to the end) first"
            )
        if WEIGHTS in tags:
            self._saved_sizes = []
            for t, s in self._unique_storages():
                self._saved_sizes.append((t, s.nbytes()))
                s.resize_(0)
            self._weights_valid = False
        if KV_CACHE in tags:
            self._cache = None

    def _resume(self, tags: List[str]) -> None:
        if WEIGHTS in tags:
            for t, nbytes in self._saved_sizes:
                t.data.untyped_storage().resize_(nbytes)
            self._saved_sizes = []
            # Contents are undefined until a full update is finished.
            self._weights_valid = False
            self._received = set()

    def param_storage_bytes(self) -> int:
        """Bytes currently held by parameter storages (0 while "weights" is released)."""
        return sum(s.nbytes() for _, s in self._unique_storages())

    def _check_ready(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"HFEngine.{what}() called after shutdown()")
        self._check_can_generate(what)
        if not self._weights_valid:
            raise EngineReleasedError(
                f"HFEngine.{what}() called after resume_memory(['weights']) but before a complete "
                "weight update (update_weights ... finish_weight_update): weights are undefined"
            )

    def update_weights(self, bucket) -> None:
        if self._closed:
            raise RuntimeError("HFEngine.update_weights() called after shutdown()")
        super().update_weights(bucket)

    def update_weights_from_payloads(self, payloads: Sequence) -> None:
        """Load one bucket from serialized payloads (``rollout/payload.py``, the form SGLang's
        ``update_weights_from_tensor(load_format="flattened_bucket")`` takes), one per feeding
        rank, each referring to that rank's own copy of the bucket (shared memory on CPU).

        Every payload must describe the same tensors. Tensor ``j`` is copied from payload
        ``j mod len(payloads)``, so every feeder's copy is read and a wrong one fails the
        probe. The copies are done when this returns: the feeders may then reuse their
        buffers. The mapped buffers are kept (not their contents) until the update finishes,
        so that the next bucket in the same buffer maps nothing new."""
        if not payloads:
            raise WeightUpdateError("update_weights_from_payloads: no payloads")
        decoded = [load_payload(p) for p in payloads]
        first = [(m.name, tuple(m.shape), m.dtype) for m in decoded[0][1]]
        for k, (_, meta) in enumerate(decoded[1:], start=1):
            if [(m.name, tuple(m.shape), m.dtype) for m in meta] != first:
                raise WeightUpdateError(
                    f"payload {k} describes other tensors than payload 0 (each feeding rank must "
                    "hand over the same bucket)"
                )
        copies = [reconstruct_bucket(flat, meta) for flat, meta in decoded]
        bucket = [copies[j % len(copies)][j] for j in range(len(first))]
        self.update_weights(bucket)
        self._mapped = ([flat for flat, _ in decoded] + getattr(self, "_mapped", []))[: 2 * len(decoded)]

    # weights over a collective group (the contract of SGLangEngine's calls of the same names;
    # hybrid/weight_broadcast.py is the sender): what asynchronous training feeds busy engines by
    def init_weights_update_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> None:
        """Join the group the trainer broadcasts weights over as rank ``rank_offset`` (one rank:
        no TP); returns once every member joined. The group is made as SGLang makes its own
        (``init_custom_process_group``: its own store, apart from any default group)."""
        from sglang.srt.utils.common import init_custom_process_group  # lazy: only where weights are broadcast

        groups = self._update_groups
        if group_name in groups:
            raise WeightUpdateError(f"weight-update group {group_name!r} is already joined")
        group = init_custom_process_group(
            backend=backend,
            init_method=f"tcp://{master_address}:{int(master_port)}",
            world_size=int(world_size),
            rank=int(rank_offset),
            group_name=group_name,
        )
        # the tensors a gloo group moves are host tensors; NCCL's are on the engine's GPU
        groups[group_name] = (group, self.device if backend == "nccl" else torch.device("cpu"))

    def update_weights_from_distributed(
        self, entries: Sequence[Tuple[str, str, Sequence[int]]], group_name: str
    ) -> None:
        """One bucket broadcast from rank 0 of ``group_name``: ``entries`` are (HF name, dtype
        name, shape) in the order of the broadcasts. Blocks until every tensor arrived; they are
        held aside, not loaded: it may run in a thread of its own while :meth:`poll` decodes with
        the current weights (asynchronous training broadcasts into generating engines).
        :meth:`finish_weight_update` loads them all at once, between two decode steps; requests
        in flight are kept, and the tokens decoded after it are of the new weights (the caller
        sets their version with it: ``EngineActor.finish_weight_update(version)``)."""
        import torch.distributed as dist  # lazy: the collective path only

        joined = self._update_groups.get(group_name)
        if joined is None:
            raise WeightUpdateError(
                f"update_weights_from_distributed: group {group_name!r} not joined (init_weights_update_group first)"
            )
        group, dev = joined
        bucket = []
        for name, dtype, shape in entries:
            t = torch.empty([int(x) for x in shape], dtype=getattr(torch, str(dtype).replace("torch.", "")), device=dev)
            dist.broadcast(t, src=0, group=group)
            bucket.append((str(name), t))
        with self._staged_lock:
            self._staged.extend(bucket)

    def destroy_weights_update_group(self, group_name: str) -> None:
        import torch.distributed as dist  # lazy: the collective path only

        joined = self._update_groups.pop(group_name, None)
        if joined is not None:
            dist.destroy_process_group(joined[0])

    # ---------------------------------------------------------------- generation ----
    def _forward(self, input_ids, attention_mask, position_ids, cache, last_only=False):
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        if cache is not None:
            # transformers 5.x renamed past_key_values to cache.
            kwargs[self._cache_kwarg] = cache
            kwargs["use_cache"] = True
        else:
            kwargs["use_cache"] = False
        if last_only and self._has_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        return self.model(**kwargs).logits

    @torch.no_grad()
    def generate(self, prompts: List[List[int]], params: SamplingParams) -> List[List[GenerationOutput]]:
        from transformers import DynamicCache  # transformers: ~2.5 s to import

        self._check_ready("generate")
        params.validate()
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need HFEngine(tokenizer=...)")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        self._abort.clear()

        stop_ids = set(int(t) for t in params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids.update(self.eos_token_ids)

        rows = []  # (prompt index, sample index, prompt ids, generator)
        for i, p in enumerate(prompts):
            for j in range(params.n):
                seed = derive_seed(params.seed, j) if params.seed is not None else self._rng.getrandbits(63)
                g = torch.Generator(device="cpu")
                g.manual_seed(seed)
                rows.append((i, j, [int(t) for t in p], g))

        outs_ids: List[List[int]] = [[] for _ in rows]
        outs_lp: List[List[float]] = [[] for _ in rows]
        finish: List[Optional[str]] = [None] * len(rows)
        record = bool(params.return_routed_experts) and self._router_rec is not None
        routing: List[list] = [[] for _ in rows]  # per row: [n_k, layers, top_k] blocks of fed positions
        texts: List[Optional[str]] = [None] * len(rows)

        if params.max_new_tokens == 0 or not rows:
            finish = ["length"] * len(rows)
        else:
            B = len(rows)
            # Prefill each distinct prompt once, then give each of its n samples a copy of
            # its KV cache (rows are prompt-major, sample-minor).
            P = len(prompts)
            max_len = max(len(p) for p in prompts)
            ids = torch.full((P, max_len), self.pad_token_id, dtype=torch.long)
            mask = torch.zeros((P, max_len), dtype=torch.long)
            for i, p in enumerate(prompts):
                ids[i, max_len - len(p) :] = torch.tensor([int(t) for t in p])
                mask[i, max_len - len(p) :] = 1
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            ids, mask, pos = ids.to(self.device), mask.to(self.device), pos.to(self.device)
            cache = DynamicCache(config=self.config)
            self._cache = cache
            logits = self._forward(ids, mask, pos, cache, last_only=True)[:, -1, :]
            if record:
                rec = self._router_rec.last(P, max_len)
                for b, (i, _, p, _) in enumerate(rows):
                    routing[b].append(rec[i, max_len - len(p) :])
            if params.n > 1:
                cache.batch_repeat_interleave(params.n)
                logits = logits.repeat_interleave(params.n, dim=0)
                mask = mask.repeat_interleave(params.n, dim=0)
                pos = pos.repeat_interleave(params.n, dim=0)
            next_pos = pos[:, -1:] + 1
            active = list(range(B))  # row index of each batch slot
            step = 0
            while True:
                tokens, lps = self._sample(logits.float(), [rows[b][3] for b in active], params)
                still = []
                for slot, b in enumerate(active):
                    tok = int(tokens[slot])
                    outs_ids[b].append(tok)
                    outs_lp[b].append(float(lps[slot]))
                    if tok in stop_ids:
                        finish[b] = "stop"
                    elif params.stop and self._check_stop_strings(b, outs_ids, texts, params.stop):
                        finish[b] = "stop"
                    elif len(outs_ids[b]) >= params.max_new_tokens:
                        finish[b] = "length"
                    else:
                        still.append(slot)
                step += 1
                if self._step_hook is not None:
                    self._step_hook(step)
                if self._abort.is_set():
                    for slot in still:
                        finish[active[slot]] = "abort"
                    still = []
                if not still:
                    break
                if len(still) < len(active):
                    sel = torch.tensor(still, device=self.device)
                    cache.batch_select_indices(sel)
                    mask = mask[sel]
                    next_pos = next_pos[sel]
                    tokens = tokens[sel.cpu()]
                    active = [active[s] for s in still]
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                logits = self._forward(tokens.view(-1, 1).to(self.device), mask, next_pos, cache, last_only=True)[
                    :, -1, :
                ]
                if record:
                    rec = self._router_rec.last(len(active), 1)
                    for slot, b in enumerate(active):
                        routing[b].append(rec[slot])
                next_pos = next_pos + 1
            self._cache = None

        if self.tokenizer is not None:
            for b in range(len(rows)):
                if texts[b] is None:
                    texts[b] = self.tokenizer.decode(outs_ids[b])
        result: List[List[GenerationOutput]] = [[] for _ in prompts]
        for b, (i, _j, p, _) in enumerate(rows):
            result[i].append(
                GenerationOutput(
                    prompt_ids=list(p),
                    output_ids=outs_ids[b],
                    logprobs=outs_lp[b],
                    finish_reason=finish[b],
                    text=texts[b],
                    routed_experts=_routed(routing[b], len(p), len(outs_ids[b])) if record else None,
                )
            )
        return result

    # ------------------------------------------------------------ streaming ----
    def submit(self, requests: List[Request]) -> None:
        self._check_ready("submit")
        self._stream.submit(list(requests))

    def poll(self, timeout_s: float = 1.0) -> List[Finished]:
        if self._stream.rows or self._stream.waiting:
            self._check_ready("poll")
        return self._stream.poll(timeout_s)

    def abort_requests(self, rids: Optional[Sequence[str]] = None) -> List[Finished]:
        return self._stream.abort(rids)

    def _check_stop_strings(self, b, outs_ids, texts, stops) -> bool:
        text = self.tokenizer.decode(outs_ids[b])
        hits = [(text.find(s), s) for s in stops if s in text]
        if not hits:
            return False
        texts[b] = text[: min(h[0] for h in hits)]
        return True

    def _sample(self, logits: torch.Tensor, generators, params: SamplingParams):
        """logits: [B, V] fp32 -> (tokens [B] long, logprobs [B] float)."""
        raw = torch.log_softmax(logits, dim=-1)
        if params.temperature == 0.0:
            tokens = logits.argmax(dim=-1)
            lp = raw
        else:
            scaled = logits / params.temperature
            lp = raw if self.logprobs_mode == "raw" else torch.log_softmax(scaled, dim=-1)
            filtered = _top_k_top_p(scaled, params.top_k, params.top_p)
            probs = torch.softmax(filtered, dim=-1)
            cdf = probs.cumsum(dim=-1)
            u = torch.stack([torch.rand((), generator=g) for g in generators]).to(cdf)
            u = u * cdf[:, -1]
            tokens = torch.searchsorted(cdf, u.unsqueeze(-1), right=True).squeeze(-1)
            tokens = tokens.clamp(max=logits.shape[-1] - 1)
        return tokens.cpu(), lp.gather(-1, tokens.to(lp.device).unsqueeze(-1)).squeeze(-1).cpu()

    @torch.no_grad()
    def score(self, sequences: List[List[int]], prompt_lens: Sequence[int]) -> List[List[float]]:
        self._check_ready("score")
        if len(sequences) != len(prompt_lens):
            raise ValueError("sequences and prompt_lens differ in length")
        for s, p in zip(sequences, prompt_lens):
            if not 1 <= p <= len(s):
                raise ValueError(f"prompt_len {p} out of range [1, {len(s)}]")
        if not sequences:
            return []
        B, L = len(sequences), max(len(s) for s in sequences)
        ids = torch.full((B, L), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((B, L), dtype=torch.long)
        for b, s in enumerate(sequences):  # right padding: positions are plain 0..len-1
            ids[b, : len(s)] = torch.tensor(s)
            mask[b, : len(s)] = 1
        pos = torch.arange(L).expand(B, L)
        logits = self._forward(ids.to(self.device), mask.to(self.device), pos.to(self.device), None)
        logp = torch.log_softmax(logits.float(), dim=-1)
        out = []
        for b, (s, p) in enumerate(zip(sequences, prompt_lens)):
            tgt = torch.tensor(s[p:], dtype=torch.long, device=logp.device)
            out.append(logp[b, p - 1 : len(s) - 1].gather(-1, tgt.unsqueeze(-1)).squeeze(-1).tolist())
        return out

    # --------------------------------------------------------------------- misc ----
    def flush_cache(self) -> None:
        self._cache = None

    def abort(self) -> None:
        self._abort.set()

    def health(self) -> bool:
        return not self._closed

    def shutdown(self) -> None:
        self._closed = True
        self._cache = None
        self._stream = ContinuousBatcher(self, self._stream.max_running)  # drops what was streaming
        self.model = None
        self._params = {}


def _routed(blocks: list, prompt_len: int, n_out: int) -> Optional[torch.Tensor]:
    """A row's routing blocks -> ``[prompt_len + n_out - 1, layers, top_k]`` (rollout/routing.py)."""
    if not blocks or n_out == 0:
        return None
    return torch.cat(blocks, dim=0)[: prompt_len + n_out - 1]


def _own_storages(model) -> None:
    """Give every parameter and buffer a storage of its own where it has a fixed-size one (a
    checkpoint's memory-mapped safetensors), so that ``release_memory`` can resize it to 0."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if not t.data.untyped_storage().resizable():
                t.data = t.data.clone()


def _random_like(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_floating_point:
        return torch.rand(t.shape, dtype=torch.float32, device=t.device).to(t.dtype)
    if t.dtype == torch.bool:
        return torch.rand(t.shape, device=t.device) > 0.5
    info = torch.iinfo(t.dtype)
    return torch.randint(int(info.min), int(info.max), t.shape, dtype=t.dtype, device=t.device)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:  # bitwise: NaN == NaN, -0.0 != 0.0
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.contiguous().view(ints), b.contiguous().view(ints)
    return torch.equal(a, b)


def _top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    V = logits.shape[-1]
    if 0 < top_k < V:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of strictly better tokens
        drop_sorted = before >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits
