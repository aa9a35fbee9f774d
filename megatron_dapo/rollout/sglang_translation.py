"""Translation between our types and SGLang's, as pure functions (CPU tests run them
without sglang): sampling params and generate requests out (``to_sglang_sampling_params``,
``build_generate_requests``), output dicts in (``parse_finish_reason``, ``from_sglang_output``,
``group_outputs``), and the prefill-only scoring call both ways (``build_score_requests``,
``from_sglang_score_output``). The streamed requests' translation is in
rollout/sglang_streaming.py.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from megatron_dapo.rollout.base import GenerationOutput, SamplingParams, derive_seed
from megatron_dapo.rollout.routing import decode_sglang_routed_experts


# ------------------------------------------------------------------------ requests ----
def to_sglang_sampling_params(params: SamplingParams, seed: Optional[int] = None) -> Dict[str, Any]:
    """One SGLang sampling_params dict for one sample (n is always 1: we expand n ourselves
    so that every sample gets its own seed and the output order is ours)."""
    params.validate()
    d: Dict[str, Any] = {
        "temperature": float(params.temperature),  # SGLang: 0 -> greedy (top_k=1)
        "top_p": float(params.top_p),
        "top_k": int(params.top_k),  # -1 = whole vocabulary in both
        "max_new_tokens": int(params.max_new_tokens),
        "n": 1,
        "ignore_eos": bool(params.ignore_eos),
    }
    if params.stop_token_ids:
        d["stop_token_ids"] = [int(t) for t in params.stop_token_ids]
    if params.stop:
        d["stop"] = list(params.stop)
    if seed is not None:
        d["sampling_seed"] = int(seed)
    return d


def build_generate_requests(
    prompts: List[List[int]], params: SamplingParams, default_seed: int
) -> Tuple[List[List[int]], List[Dict[str, Any]], List[Tuple[int, int]]]:
    """Expand prompts x n into flat SGLang requests: (input_ids, sampling_params, (i, j)).

    Every request gets its own ``sampling_seed``: request k (prompt-major, k = i * n + j) uses
    ``derive_seed(base, k)`` with base ``params.seed``, or ``default_seed`` when the call has
    none. SGLang honours per-request seeds only with ``enable_deterministic_inference``, and
    then gives every unseeded request the same seed (42), so the samples of a prompt (and
    equal prompts) would coincide; its seeded sampler hashes (seed, position), so two
    requests sharing a seed would share their random numbers.
    """
    base = params.seed if params.seed is not None else default_seed
    input_ids, sps, index = [], [], []
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError("empty prompt")
        for j in range(params.n):
            seed = derive_seed(base, i * params.n + j)
            input_ids.append([int(t) for t in p])
            sps.append(to_sglang_sampling_params(params, seed))
            index.append((i, j))
    return input_ids, sps, index


# ------------------------------------------------------------------------- outputs ----
_FINISH_TYPES = {"stop": "stop", "length": "length", "abort": "abort"}


def parse_finish_reason(fr: Any) -> str:
    """SGLang's meta_info["finish_reason"] (``{"type": ...}`` dict, or a string) -> ours."""
    kind = fr.get("type") if isinstance(fr, dict) else fr
    if kind not in _FINISH_TYPES:
        raise ValueError(f"unexpected SGLang finish_reason {fr!r}")
    return _FINISH_TYPES[kind]


def from_sglang_output(
    out: Dict[str, Any], prompt_ids: List[int], routing_shape: Optional[Tuple[int, ...]] = None
) -> GenerationOutput:
    """One SGLang output dict (``return_logprob=True``) -> GenerationOutput; with
    ``routing_shape`` (layers, top_k[, experts]) the ``meta_info["routed_experts"]`` of a request sent with
    ``return_routed_experts`` (rollout/routing.decode_sglang_routed_experts)."""
    meta = out["meta_info"]
    output_ids = [int(t) for t in out["output_ids"]]
    entries = meta.get("output_token_logprobs") or []
    finish = parse_finish_reason(meta.get("finish_reason"))
    if len(entries) != len(output_ids):
        raise ValueError(f"SGLang returned {len(output_ids)} output ids but {len(entries)} output_token_logprobs")
    logprobs = []
    for k, (entry, tok) in enumerate(zip(entries, output_ids)):
        lp, tid = entry[0], entry[1]
        if int(tid) != tok:
            raise ValueError(f"logprob entry {k} is for token {tid}, output token is {tok}")
        if lp is None:
            raise ValueError(f"SGLang returned no logprob for output token {k}")
        logprobs.append(float(lp))
    routed = None
    if routing_shape is not None and meta.get("routed_experts") is not None:
        routed = decode_sglang_routed_experts(meta["routed_experts"], *routing_shape)
        want = len(prompt_ids) + len(output_ids) - 1
        if output_ids and routed.shape[0] != want:
            raise ValueError(
                f"SGLang returned routed experts of {routed.shape[0]} positions, expected {want} "
                f"(prompt {len(prompt_ids)} + output {len(output_ids)} - 1)"
            )
    return GenerationOutput(
        prompt_ids=list(prompt_ids),
        output_ids=output_ids,
        logprobs=logprobs,
        finish_reason=finish,
        text=out.get("text"),
        routed_experts=routed if output_ids else None,
        token_versions=token_versions_of(meta.get("weight_versions"), len(output_ids)),
    )


def token_versions_of(spans, n: int) -> Optional[List[int]]:
    """Each output token's weight version from SGLang's ``meta_info["weight_versions"]`` spans
    (``{"version", "start", "end"}``, set by ``SGLangEngine.set_weight_version``); None when
    SGLang gave none, a version is not ours (a number), or the spans do not cover the ``n`` tokens."""
    if not spans or n == 0:
        return None
    out: List[int] = []
    for s in spans:
        try:
            v = int(s["version"])
        except (TypeError, ValueError, KeyError):
            return None
        if int(s["start"]) != len(out) or int(s["end"]) < len(out):
            return None
        out += [v] * (int(s["end"]) - int(s["start"]))
    return out if len(out) == n else None


def group_outputs(
    flat: List[GenerationOutput], index: List[Tuple[int, int]], num_prompts: int
) -> List[List[GenerationOutput]]:
    if len(flat) != len(index):
        raise ValueError(f"SGLang returned {len(flat)} outputs for {len(index)} requests")
    result: List[List[Optional[GenerationOutput]]] = [[] for _ in range(num_prompts)]
    for out, (i, j) in zip(flat, index):
        if len(result[i]) != j:
            raise ValueError("requests were not expanded in prompt-major order")
        result[i].append(out)
    return result  # type: ignore[return-value]


def build_score_requests(
    sequences: List[List[int]], prompt_lens: Sequence[int]
) -> Tuple[List[List[int]], List[Dict[str, Any]], List[int]]:
    """(input_ids, sampling_params, logprob_start_len) for a prefill-only scoring call.

    SGLang's input_token_logprobs cover tokens ``ids[logprob_start_len:]``, the first being
    None (no context), so start at ``prompt_len - 1`` to get logprobs of ``ids[prompt_len:]``.
    """
    if len(sequences) != len(prompt_lens):
        raise ValueError("sequences and prompt_lens differ in length")
    ids, sps, starts = [], [], []
    for s, p in zip(sequences, prompt_lens):
        if not 1 <= p <= len(s):
            raise ValueError(f"prompt_len {p} out of range [1, {len(s)}]")
        ids.append([int(t) for t in s])
        sps.append({"max_new_tokens": 0, "temperature": 1.0})
        starts.append(int(p) - 1)
    return ids, sps, starts


def _is_reported_id(reported: int, token: int, vocab_size: Optional[int]) -> bool:
    """SGLang 0.5.23 reports input ids ``>= vocab_size - 1`` as 0 in input_token_logprobs
    (its logprob_result_processor clips "padded hash values"); the logprob itself is the
    real token's (the gather clamps ids to ``vocab_size - 1`` only, a no-op for real ids)."""
    if reported == token:
        return True
    return reported == 0 and (vocab_size is None or token >= vocab_size - 1)


def from_sglang_score_output(
    out: Dict[str, Any], sequence: List[int], prompt_len: int, vocab_size: Optional[int] = None
) -> List[float]:
    """Logprobs of ``sequence[prompt_len:]`` from a scoring output. ``vocab_size`` is the
    model config's (SGLang's ``model_config.vocab_size``): ids at its end come back as 0 and are
    accepted there only; without it a 0 is accepted for any id."""
    entries = out["meta_info"].get("input_token_logprobs") or []
    want = len(sequence) - prompt_len
    if want == 0:
        return []
    if len(entries) < want:
        raise ValueError(f"SGLang returned {len(entries)} input logprobs, need {want}")
    tail = entries[len(entries) - want :]
    res = []
    for k, (entry, tok) in enumerate(zip(tail, sequence[prompt_len:])):
        lp, tid = entry[0], entry[1]
        if lp is None or not _is_reported_id(int(tid), int(tok), vocab_size):
            raise ValueError(f"bad input logprob entry {entry!r} for token {tok} at {prompt_len + k}")
        res.append(float(lp))
    return res
