"""The rollout-engine interface shared by the SGLang (GPU) and HF transformers (CPU) engines.

Two ways to generate: ``generate`` (a blocking batch call: evaluation, tools) and the streaming
interface the rollout manager uses (``submit`` requests one sample each, ``poll`` for the ones
that finished, ``abort_requests`` for the prefixes of the rest; docs/rollout.md, "Streaming").

Logprob semantics (both engines, by default): ``GenerationOutput.logprobs[i]`` is the
log-probability of ``output_ids[i]`` under the *raw policy*, i.e. ``log_softmax(logits)``
at temperature 1.0, before temperature scaling and before top-k / top-p truncation. This is
what the trainer recomputes, so the train/inference mismatch metric compares like with like.
``logprobs_mode="processed"`` (engine constructor argument) instead returns
``log_softmax(logits / T)`` (temperature-scaled, still before top-k / top-p truncation),
which is SGLang's own default. For greedy requests (temperature 0) both modes give the raw
logprob. ``RolloutEngine.score`` always returns raw logprobs. See docs/rollout.md.
"""

from __future__ import annotations

import abc
import hashlib
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Literal, Optional, Sequence, Tuple

import torch

FinishReason = Literal["stop", "length", "abort"]
LOGPROBS_MODES = ("raw", "processed")
# Engine kinds (``--rollout-engine``) are registered in rollout/engines.py (ENGINE_KINDS).

WEIGHTS = "weights"
KV_CACHE = "kv_cache"
CUDA_GRAPH = "cuda_graph"  # SGLang's captured CUDA graphs; a no-op tag for engines without any
MEMORY_TAGS = (WEIGHTS, KV_CACHE, CUDA_GRAPH)

#: The initial weight-sync check (``--check-weight-sync-init``, hybrid/phases.py), in this order:
#: "snapshot" (at launch: the engine holds the checkpoint it loaded), "reset_tensors" (before
#: the first sync: every tensor overwritten with random values), "compare" (after it: every
#: tensor must equal its snapshot again). See :meth:`RolloutEngine.check_weights`.
WEIGHT_CHECK_ACTIONS = ("snapshot", "reset_tensors", "compare")


@dataclass
class SamplingParams:
    """Sampling parameters of one ``generate`` call (applied to every prompt of the call).

    temperature: 0 means greedy (argmax); top_k: -1 disables it; top_p: 1.0 disables it.
    stop_token_ids: extra token ids that end a sample (the engine's EOS ids are added unless
    ``ignore_eos``). stop: strings that end a sample (needs a tokenizer in HFEngine).
    seed: per-request seed; sample j of a prompt uses ``derive_seed(seed, j)``.
    return_routed_experts: MoE models: return the routed experts of every position the
    engine ran (``GenerationOutput.routed_experts``; routing replay, docs/moe.md).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    n: int = 1
    stop_token_ids: List[int] = field(default_factory=list)
    stop: List[str] = field(default_factory=list)
    seed: Optional[int] = None
    ignore_eos: bool = False
    return_routed_experts: bool = False

    def validate(self) -> None:
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if isinstance(self.stop, str):
            raise TypeError("stop must be a list of strings, not a string")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")


@dataclass
class GenerationOutput:
    """One sample. ``logprobs`` has one entry per ``output_ids`` entry (see module doc)."""

    prompt_ids: List[int]
    output_ids: List[int]
    logprobs: List[float]
    finish_reason: FinishReason
    text: Optional[str] = None
    # with ``SamplingParams.return_routed_experts`` on a MoE model: [n, layers, top_k] (uint8 up to
    # 256 experts, else int16: rollout/routing.routing_dtype), the
    # experts each position 0 .. n - 1 of prompt + output was routed to, n = len(prompt) +
    # len(output) - 1 (the last output token is never fed back); SGLang's layout (docs/moe.md)
    routed_experts: Optional[torch.Tensor] = None
    # the engine's weight version (RolloutEngine.set_weight_version) that computed the
    # distribution of each output token, one per ``output_ids`` entry, from engines that stamp
    # them (HFEngine); None: the driver stamps the step's own version. Asynchronous training
    # updates weights while a request runs: its tokens then carry two versions.
    token_versions: Optional[List[int]] = None


@dataclass
class Request:
    """One streamed sample: ``params.n`` must be 1. ``rid``: the caller's id, unique among the
    engine's outstanding requests; ``group``: requests of one group go to one engine (the
    EnginePool), so an engine can prefill their shared prompt once."""

    rid: str
    prompt_ids: List[int]
    params: SamplingParams
    group: Optional[str] = None


@dataclass
class Finished:
    """A streamed request that ended: finished (stop / length) or aborted with its prefix
    (finish reason "abort": the tokens and logprobs generated so far). ``finished_at``:
    wall-clock time (``time.time()``) when the engine ended it."""

    rid: str
    output: GenerationOutput
    finished_at: float


def check_request(r: Request) -> None:
    if r.params.n != 1:
        raise ValueError(f"request {r.rid!r}: a streamed request is one sample (n=1), got n={r.params.n}")
    if len(r.prompt_ids) == 0:
        raise ValueError(f"request {r.rid!r}: empty prompt")
    r.params.validate()


def derive_seed(seed: int, sample_index: int) -> int:
    """The seed of sample ``sample_index`` of a request seeded with ``seed`` (63-bit)."""
    if sample_index == 0:
        return int(seed) & ((1 << 63) - 1)
    digest = hashlib.sha256(f"{int(seed)}:{int(sample_index)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class EngineReleasedError(RuntimeError):
    """Raised by generate/score/update_weights while the needed memory is released."""


class WeightUpdateError(RuntimeError):
    """A bucket or a whole weight update does not match the engine's parameters."""


def format_name_mismatch(missing: Iterable[str], unexpected: Iterable[str]) -> str:
    missing, unexpected = sorted(missing), sorted(unexpected)
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing: {missing}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected: {unexpected}")
    return "; ".join(parts)


class RolloutEngine(abc.ABC):
    """One rollout engine. Memory tags: "weights", "kv_cache" and "cuda_graph".

    Weight updates run in a session: ``begin_weight_update()`` (optional: the first
    ``update_weights`` opens the session when the engine needs one), ``update_weights(bucket)``
    any number of times (each bucket a list of (HF parameter name, tensor)), then
    ``finish_weight_update()``, which ends the session, flushes the cache and checks that
    every expected parameter name arrived since the last finish (raising
    ``WeightUpdateError`` listing missing names otherwise; the session is ended either way).

    While "weights" is released, ``generate``, ``score`` and ``update_weights`` raise
    ``EngineReleasedError``; while "kv_cache" is released, ``generate`` and ``score`` raise.
    The colocation order is: release all -> train -> resume "weights" -> update_weights ...
    -> finish_weight_update -> resume "kv_cache" and "cuda_graph" -> generate.
    """

    def __init__(self) -> None:
        self._released: set = set()
        self._received: set = set()
        self.weight_version: Optional[int] = None  # None: never told (no stamps; the driver's own)

    def set_weight_version(self, version: int) -> None:
        """The policy version of the weights now loaded (after a sync); from now on the tokens
        this engine generates are of it (an engine that stamps tokens: ``GenerationOutput.
        token_versions``). Versions never go back."""
        version = int(version)
        if self.weight_version is not None and version < self.weight_version:
            raise ValueError(f"weight version {version} is older than the engine's {self.weight_version}")
        self.weight_version = version

    # --- generation -----------------------------------------------------------------
    @abc.abstractmethod
    def generate(self, prompts: List[List[int]], params: SamplingParams) -> List[List[GenerationOutput]]:
        """``params.n`` outputs per prompt, in prompt order."""

    # --- streaming generation (the rollout manager) ------------------------------------
    def submit(self, requests: List[Request]) -> None:
        """Queue requests (``check_request``); they start as the engine has room."""
        raise NotImplementedError(f"{type(self).__name__} has no streaming generation")

    def poll(self, timeout_s: float) -> List[Finished]:
        """The requests that ended since the last call; waits (HFEngine: generates) up to
        ``timeout_s`` for at least one while any is outstanding; [] when none is."""
        raise NotImplementedError(f"{type(self).__name__} has no streaming generation")

    def abort_requests(self, rids: Optional[Sequence[str]] = None) -> List[Finished]:
        """Stop the outstanding requests ``rids`` (all when None) and return them: the running
        ones with their prefix (finish reason "abort"), the queued ones empty, those that
        ended before the abort as they ended. Unknown rids are ignored."""
        raise NotImplementedError(f"{type(self).__name__} has no streaming generation")

    @abc.abstractmethod
    def score(self, sequences: List[List[int]], prompt_lens: Sequence[int]) -> List[List[float]]:
        """Raw (temperature 1) logprob of each token ``sequences[i][prompt_lens[i]:]`` given
        its prefix. ``prompt_lens[i]`` must be >= 1."""

    # --- weights --------------------------------------------------------------------
    @abc.abstractmethod
    def expected_weight_names(self) -> List[str]:
        """HF names a complete update must carry (tied lm_head not included)."""

    @abc.abstractmethod
    def _load_bucket(self, bucket: List[Tuple[str, torch.Tensor]]) -> List[str]:
        """Load one validated bucket, return the canonical names it covered."""

    def begin_weight_update(self) -> None:
        """Open a weight-update session (no-op for engines without one; SGLang needs one)."""

    def _end_weight_update(self) -> None:
        """Close the session ``begin_weight_update`` (or the first bucket) opened; no-op here."""

    def update_weights(self, bucket: List[Tuple[str, torch.Tensor]]) -> None:
        self._check_not_released(WEIGHTS, "update_weights")
        names = self._load_bucket(list(bucket))
        self._received.update(names)

    def finish_weight_update(self) -> None:
        self._check_not_released(WEIGHTS, "finish_weight_update")
        expected = set(self.expected_weight_names())
        missing = expected - self._received
        unexpected = self._received - expected
        self._received = set()
        self._end_weight_update()
        self.flush_cache()
        if missing or unexpected:
            raise WeightUpdateError(
                "incomplete weight update since the last finish_weight_update: "
                + format_name_mismatch(missing, unexpected)
            )

    def arm_weight_checksums(self) -> None:
        """The next weight sync is a probe sync: an engine that cannot read its tensors back by
        HF name records what it needs for :meth:`weight_checksums` while the sync passes
        (SGLangEngine); engines that can (HFEngine) need nothing."""

    def weight_checksums(self, dtypes: Optional[Dict[str, str]] = None) -> Dict[str, Optional[tuple]]:
        """HF name -> exact checksum (``rollout.checksum.tensor_checksum``) of the tensor the
        engine holds now, for every name of ``expected_weight_names()``. ``dtypes`` (HF name
        -> ``str(torch.dtype)``): the dtype the trainer sent it in; the engine's tensor is
        cast to it first (exact when the engine's dtype is at least as wide; a narrower one
        gives None: not comparable). Used by the weight-sync check on probe syncs."""
        raise NotImplementedError(f"{type(self).__name__} cannot report weight checksums by HF name")

    def check_weights(self, action: str) -> List[str]:
        """The initial weight-sync check (``WEIGHT_CHECK_ACTIONS``), on the tensors the engine
        holds under its own names. "snapshot": record them (the checkpoint loaded at launch);
        "reset_tensors": overwrite each with random values (generate/score then refuse until
        the next complete update); "compare": one line per tensor that differs from the
        snapshot (name first, then what differs), empty when all are equal; the snapshot is
        dropped. Needs the "weights" memory. Engines that cannot do it raise
        NotImplementedError (the check was asked for: it fails rather than being skipped)."""
        raise NotImplementedError(f"{type(self).__name__} cannot check its weights against a snapshot")

    # --- memory ---------------------------------------------------------------------
    def is_released(self, tag: str) -> bool:
        _check_tags([tag])
        return tag in self._released

    def release_memory(self, tags: Sequence[str] = MEMORY_TAGS) -> List[str]:
        """Release the memory of ``tags``; returns those whose release freed nothing (an engine
        that cannot release memory on this machine: SGLang on a CPU), which the hybrid event
        log records."""
        tags = _check_tags(tags)
        todo = [t for t in tags if t not in self._released]
        kept: List[str] = []
        if todo:
            kept = list(self._release(todo) or [])
            self._released.update(todo)
        return kept

    def resume_memory(self, tags: Sequence[str] = MEMORY_TAGS) -> List[str]:
        """Resume the memory of ``tags``; returns those whose resume was a no-op (as above)."""
        tags = _check_tags(tags)
        todo = [t for t in tags if t in self._released]
        kept: List[str] = []
        if todo:
            kept = list(self._resume(todo) or [])
            self._released.difference_update(todo)
        return kept

    @abc.abstractmethod
    def _release(self, tags: List[str]) -> Optional[List[str]]:
        """Release ``tags``; the ones that stay resident (a no-op), or None."""

    @abc.abstractmethod
    def _resume(self, tags: List[str]) -> Optional[List[str]]:
        """Resume ``tags``; the ones whose resume was a no-op, or None."""

    def _check_not_released(self, tag: str, what: str) -> None:
        if tag in self._released:
            raise EngineReleasedError(
                f"{type(self).__name__}.{what}() called while its {tag!r} memory is released; "
                f"call resume_memory([{tag!r}]) first"
            )

    def _check_can_generate(self, what: str) -> None:
        self._check_not_released(WEIGHTS, what)
        self._check_not_released(KV_CACHE, what)

    # --- misc -----------------------------------------------------------------------
    @abc.abstractmethod
    def flush_cache(self) -> None: ...

    @abc.abstractmethod
    def abort(self) -> None:
        """Abort in-flight requests (their outputs finish with reason "abort")."""

    @abc.abstractmethod
    def health(self) -> bool: ...

    @abc.abstractmethod
    def shutdown(self) -> None: ...


def check_weight_action(action: str) -> str:
    if action not in WEIGHT_CHECK_ACTIONS:
        raise ValueError(f"unknown weight check action {action!r}; known: {list(WEIGHT_CHECK_ACTIONS)}")
    return action


def _check_tags(tags) -> List[str]:
    if isinstance(tags, str):
        tags = [tags]
    tags = list(tags)
    bad = [t for t in tags if t not in MEMORY_TAGS]
    if bad:
        raise ValueError(f"unknown memory tags {bad}; known: {list(MEMORY_TAGS)}")
    return tags
