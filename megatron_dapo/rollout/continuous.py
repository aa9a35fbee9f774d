"""Continuous batching for HFEngine: the streaming interface (``submit`` / ``poll`` /
``abort_requests``, rollout/base.py) on a transformers model.

``max_running`` slots. Each ``poll`` runs decode steps until a request ends (or its time is
up); one step:

1. the running sequences (if their next logits are not computed yet) get one decode forward;
2. waiting requests are admitted into the free slots: their distinct prompts are prefilled
   in one left-padded batch, and the new rows' KV cache joins the running batch's (both
   left-padded with masked zero columns to the longer cache, rows concatenated);
3. every row samples its next token; a row that ends (stop token, stop string, length) is
   returned at once (``Finished``, time-stamped) and leaves the batch; the leading cache
   columns no remaining row uses are cut away.

Each output token is stamped with the engine's weight version that computed its logits
(``GenerationOutput.token_versions``): a weight update between two polls (asynchronous
training) leaves the tokens before it of the old version, those after of the new one, and the
KV cache of the prefix as the old weights computed it.

Sampling per row is the blocking ``HFEngine.generate``'s (``HFEngine._sample``, one
``torch.Generator`` per request seeded with ``derive_seed(seed, 0)``, one uniform per token),
so a greedy or seeded request gives the blocking engine's tokens whatever else runs with it
(as far as the batch's numerics leave the logits unchanged, which they do on CPU fp32 in
practice: tests/rollout/test_hf_streaming.py). ``abort_requests`` returns the running rows'
prefixes (finish "abort"); continuing ``prompt + prefix`` greedily gives the uninterrupted
greedy output.

Needs full-attention KV caches (transformers ``DynamicLayer``: Qwen2 without sliding window,
Llama, ...); another cache layer type is refused with its name.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch

from megatron_dapo.rollout.base import Finished, GenerationOutput, Request, check_request, derive_seed


@dataclass
class _Row:
    req: Request
    gen: torch.Generator
    stop_ids: set
    next_pos: int  # position id of the next token fed
    out: List[int] = field(default_factory=list)
    lps: List[float] = field(default_factory=list)
    text: Optional[str] = None  # cut before a stop string
    routing: Optional[list] = None  # return_routed_experts: [n_k, layers, top_k] blocks of the fed positions
    versions: List[Optional[int]] = field(default_factory=list)  # the weight version of each output token
    logits_version: Optional[int] = None  # the weight version that computed the row's next-token logits


class ContinuousBatcher:
    """The streaming state of one HFEngine (see the module doc)."""

    def __init__(self, engine, max_running: int):
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        self.e, self.max_running = engine, int(max_running)
        self.waiting: collections.deque = collections.deque()
        self.done: List[Finished] = []  # ended, not returned by poll yet
        self._clear_batch()

    def _clear_batch(self) -> None:
        self.rows: List[_Row] = []
        self.cache = None
        self.mask = None  # [B, T]: which cache columns hold a row's tokens
        self.logits = (
            None  # next-token logits of the rows ([n_k, V] blocks in row order), None while they need a forward
        )
        self.last = None  # [B] the tokens sampled last, fed by the next forward

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.rows) + len(self.done)

    def rids(self) -> set:
        return {r.rid for r in self.waiting} | {r.req.rid for r in self.rows} | {f.rid for f in self.done}

    # ------------------------------------------------------------------ the interface ----
    def submit(self, requests: Sequence[Request]) -> None:
        known = self.rids()
        for r in requests:
            check_request(r)
            if r.params.stop and self.e.tokenizer is None:
                raise ValueError("stop strings need HFEngine(tokenizer=...)")
            if r.rid in known:
                raise ValueError(f"request id {r.rid!r} is already outstanding")
            known.add(r.rid)
        self.waiting.extend(requests)

    def poll(self, timeout_s: float) -> List[Finished]:
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        with torch.no_grad():
            while not self.done and (self.rows or self.waiting):
                self._step()
                if time.monotonic() >= deadline:
                    break
        out, self.done = self.done, []
        return out

    def abort(self, rids: Optional[Sequence[str]] = None) -> List[Finished]:
        want = self.rids() if rids is None else set(rids)
        now = time.time()
        out = [f for f in self.done if f.rid in want]
        self.done = [f for f in self.done if f.rid not in want]
        for r in [r for r in self.waiting if r.rid in want]:
            self.waiting.remove(r)
            out.append(Finished(r.rid, self._output(r, [], [], "abort"), now))
        gone = [i for i, row in enumerate(self.rows) if row.req.rid in want]
        for i in gone:
            row = self.rows[i]
            prefix = self._output(row.req, row.out, row.lps, "abort", routing=row.routing, versions=row.versions)
            out.append(Finished(row.req.rid, prefix, now))
        self._drop(gone)
        return out

    # ------------------------------------------------------------------------ a step ----
    def _step(self) -> None:
        if self.rows and self.logits is None:
            self._decode()
        free = self.max_running - len(self.rows)
        if free > 0 and self.waiting:
            self._admit([self.waiting.popleft() for _ in range(min(free, len(self.waiting)))])
        if self.rows:
            self._sample_rows()

    def _decode(self) -> None:
        mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        pos = torch.tensor([[r.next_pos] for r in self.rows], device=self.e.device)
        logits = self.e._forward(self.last.view(-1, 1).to(self.e.device), mask, pos, self.cache, last_only=True)
        self.mask, self.logits = mask, [logits[:, -1, :].float()]
        for r in self.rows:
            r.logits_version = self.e.weight_version
        if any(r.routing is not None for r in self.rows):
            rec = self.e._router_rec.last(len(self.rows), 1)
            for i, r in enumerate(self.rows):
                if r.routing is not None:
                    r.routing.append(rec[i])
        for r in self.rows:
            r.next_pos += 1

    def _admit(self, reqs: List[Request]) -> None:
        from transformers import DynamicCache  # transformers: ~2.5 s to import, only when a batch is admitted

        now = time.time()
        empty = [r for r in reqs if r.params.max_new_tokens == 0]
        for r in empty:
            self.done.append(Finished(r.rid, self._output(r, [], [], "length"), now))
        reqs = [r for r in reqs if r.params.max_new_tokens > 0]
        if not reqs:
            return
        # each distinct prompt is prefilled once; its requests get copies of its cache
        prompts, where = [], {}
        for r in reqs:
            key = tuple(int(t) for t in r.prompt_ids)
            if key not in where:
                where[key] = len(prompts)
                prompts.append(list(key))
        n, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((n, width), self.e.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        dev = self.e.device
        cache = DynamicCache(config=self.e.config)
        logits = self.e._forward(ids.to(dev), mask.to(dev), pos.to(dev), cache, last_only=True)[:, -1, :].float()
        pick = torch.tensor([where[tuple(int(t) for t in r.prompt_ids)] for r in reqs])
        cache.batch_select_indices(pick.to(dev))
        rows = [self._row(r) for r in reqs]
        for row in rows:
            row.logits_version = self.e.weight_version
        if any(r.routing is not None for r in rows):
            rec = self.e._router_rec.last(n, width)
            for r, i in zip(rows, pick.tolist()):
                if r.routing is not None:
                    r.routing.append(rec[i, width - len(r.req.prompt_ids) :])
        self._merge(cache, mask.to(dev)[pick.to(dev)], logits[pick.to(logits.device)], rows)

    def _row(self, r: Request) -> _Row:
        p = r.params
        seed = derive_seed(p.seed, 0) if p.seed is not None else self.e._rng.getrandbits(63)
        g = torch.Generator(device="cpu")
        g.manual_seed(seed)
        stop = {int(t) for t in p.stop_token_ids}
        if not p.ignore_eos:
            stop.update(self.e.eos_token_ids)
        routing = [] if p.return_routed_experts and self.e._router_rec is not None else None
        return _Row(r, g, stop, next_pos=len(r.prompt_ids), routing=routing)

    def _merge(self, cache, mask, logits, rows) -> None:
        _check_layers(cache)
        if not self.rows:
            self.cache, self.mask, self.logits, self.rows = cache, mask, [logits], rows
            return
        width = max(self.mask.shape[1], mask.shape[1])
        for old, new in zip(self.cache.layers, cache.layers):
            old.keys = torch.cat([_pad_left(old.keys, width, -2), _pad_left(new.keys, width, -2)], dim=0)
            old.values = torch.cat([_pad_left(old.values, width, -2), _pad_left(new.values, width, -2)], dim=0)
        self.mask = torch.cat([_pad_left(self.mask, width, 1), _pad_left(mask, width, 1)], dim=0)
        self.logits = self.logits + [logits]  # (no copy of the running rows' logits)
        self.rows = self.rows + rows

    def _sample_rows(self) -> None:
        tokens, lps, start = [], [], 0
        for block in self.logits:
            t, lp = self._sample_block(block, self.rows[start : start + block.shape[0]])
            tokens.append(t)
            lps.append(lp.float())
            start += block.shape[0]
        tokens = torch.cat(tokens)
        now = time.time()
        ended = []
        for i, (r, tok, lp) in enumerate(zip(self.rows, tokens.tolist(), torch.cat(lps).tolist())):
            r.out.append(tok)
            r.lps.append(lp)
            r.versions.append(r.logits_version)
            reason = self._finish_reason(r, tok)
            if reason is not None:
                out = self._output(r.req, r.out, r.lps, reason, r.text, r.routing, r.versions)
                self.done.append(Finished(r.req.rid, out, now))
                ended.append(i)
        self.logits, self.last = None, tokens
        self._drop(ended)

    def _sample_block(self, logits, rows):
        """``HFEngine._sample`` per group of rows sharing the distribution settings."""
        by_params = collections.defaultdict(list)
        for i, r in enumerate(rows):
            p = r.req.params
            by_params[(p.temperature, p.top_p, p.top_k)].append(i)
        if len(by_params) == 1:  # the usual case: no copy of the logits
            return self.e._sample(logits, [r.gen for r in rows], rows[0].req.params)
        tokens = torch.empty(len(rows), dtype=torch.long)
        lps = torch.empty(len(rows), dtype=torch.float32)
        for idx in by_params.values():
            sel = torch.tensor(idx)
            t, lp = self.e._sample(logits[sel.to(logits.device)], [rows[i].gen for i in idx], rows[idx[0]].req.params)
            tokens[sel], lps[sel] = t, lp.float()
        return tokens, lps

    def _finish_reason(self, r: _Row, tok: int) -> Optional[str]:
        if tok in r.stop_ids:
            return "stop"
        stops = r.req.params.stop
        if stops:
            text = self.e.tokenizer.decode(r.out)
            hits = [text.find(s) for s in stops if s in text]
            if hits:
                r.text = text[: min(hits)]
                return "stop"
        if len(r.out) >= r.req.params.max_new_tokens:
            return "length"
        return None

    def _output(
        self,
        req: Request,
        ids,
        lps,
        reason: str,
        text: Optional[str] = None,
        routing: Optional[list] = None,
        versions: Optional[List[int]] = None,
    ) -> GenerationOutput:
        if text is None and self.e.tokenizer is not None:
            text = self.e.tokenizer.decode(list(ids))
        routed = None
        if routing and ids:  # the prompt and every output token but the last were fed
            routed = torch.cat(routing, dim=0)[: len(req.prompt_ids) + len(ids) - 1]
        return GenerationOutput(
            prompt_ids=list(req.prompt_ids),
            output_ids=list(ids),
            logprobs=list(lps),
            finish_reason=reason,
            text=text,
            routed_experts=routed,
            token_versions=_stamps(versions, len(ids), self.e.weight_version),
        )

    def _drop(self, idx: List[int]) -> None:
        """Remove rows ``idx`` from the batch; cut cache columns no remaining row uses."""
        if not idx:
            return
        gone = set(idx)
        keep = [i for i in range(len(self.rows)) if i not in gone]
        if not keep:
            self._clear_batch()
            return
        sel = torch.tensor(keep)
        dev = self.mask.device
        self.cache.batch_select_indices(sel.to(dev))
        self.mask = self.mask[sel.to(dev)]
        self.last = self.last[sel] if self.last is not None else None
        if self.logits is not None:
            self.logits = [torch.cat(self.logits)[sel.to(dev)]]
        self.rows = [self.rows[i] for i in keep]
        first = int(self.mask.any(dim=0).nonzero()[0])
        if first > 0:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[..., first:, :], layer.values[..., first:, :]
            self.mask = self.mask[:, first:]


def _stamps(versions: Optional[List[Optional[int]]], n: int, current: Optional[int]) -> Optional[List[int]]:
    """The output's ``token_versions``: None while the engine was never told a version."""
    if versions is None:
        return None if current is None else [int(current)] * n
    if any(v is None for v in versions):
        return None
    return [int(v) for v in versions if v is not None]


def _pad_left(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``t`` left-padded with zeros along ``dim`` to ``width``."""
    dim = dim % t.dim()
    extra = width - t.shape[dim]
    if extra <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)


def _check_layers(cache) -> None:
    from transformers.cache_utils import DynamicLayer  # transformers: ~2.5 s to import

    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise NotImplementedError(
                f"HFEngine streaming generation needs full-attention KV caches (DynamicLayer); this model has "
                f"{type(layer).__name__} layers (e.g. sliding-window attention)"
            )
