"""What SGLangEngine prepares before and while it starts ``sglang.Engine`` (sglang itself is
imported only when :func:`_import_sglang` is called):

- ``build_engine_kwargs``: the ``sglang.Engine`` keyword arguments (ServerArgs fields);
- ``graph_saver_launch``: the environment and server args that put SGLang's CUDA graphs under
  its memory saver, set in the process by ``_set_graph_saver_env``;
- ``_set_logprob_env``: ``SGLANG_RETURN_ORIGINAL_LOGPROB`` for the logprobs mode
  (rollout/sglang_engine.py, "Logprobs");
- ``_import_sglang``: the lazy ``import sglang`` with the install hint;
- facts read from a local checkpoint: ``checkpoint_weight_shapes`` (safetensors headers),
  ``routing_shape``, ``tied_embeddings``, ``config_vocab_size`` (config.json).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from megatron_dapo.rollout.sglang_api import GRAPH_SAVER_ENV, INSTALL_HINT, RAW_LOGPROB_ENV


# ------------------------------------------------------------------ engine arguments ----
def build_engine_kwargs(
    model_path: str,
    *,
    tp_size: int = 1,
    mem_fraction_static: float = 0.5,
    base_gpu_id: Optional[int] = 0,
    enable_memory_saver: bool = True,
    dtype: str = "bfloat16",
    random_seed: Optional[int] = None,
    enable_deterministic_inference: bool = False,
    trust_remote_code: bool = False,
    log_level: str = "error",
    disable_cuda_graph: bool = False,
    context_length: Optional[int] = None,
    port: Optional[int] = None,
    tokenizer_path: Optional[str] = None,
    load_format: Optional[str] = "dummy",
    max_total_tokens: Optional[int] = None,
) -> Dict[str, Any]:
    """Keyword arguments of ``sglang.Engine`` (ServerArgs fields; all in USED_API).

    ``load_format="dummy"`` (default): SGLang starts with random weights instead of reading the
    checkpoint (the first weight sync fills them); ``tokenizer_path`` defaults to ``model_path``.
    """
    _, graph_args = graph_saver_launch(enable_memory_saver, disable_cuda_graph)
    kw: Dict[str, Any] = dict(
        model_path=str(model_path),
        tokenizer_path=str(tokenizer_path if tokenizer_path is not None else model_path),
        tp_size=int(tp_size),
        mem_fraction_static=float(mem_fraction_static),
        base_gpu_id=int(base_gpu_id or 0),  # None: a CPU engine (no GPU to start from)
        enable_memory_saver=bool(enable_memory_saver),
        dtype=dtype,
        trust_remote_code=bool(trust_remote_code),
        log_level=log_level,
        disable_cuda_graph=bool(disable_cuda_graph),
        enable_deterministic_inference=bool(enable_deterministic_inference),
        **graph_args,
    )
    for k, v in (
        ("random_seed", random_seed),
        ("context_length", context_length),
        ("port", port),
        ("load_format", load_format),
        ("max_total_tokens", max_total_tokens),
    ):
        if v is not None:
            kw[k] = v
    return kw


def graph_saver_launch(enable_memory_saver: bool, disable_cuda_graph: bool) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """(environment, server args) that make ``release_memory(["cuda_graph"])`` free SGLang's
    CUDA graphs: with the memory saver on and graphs captured, ``SGLANG_MEMORY_SAVER_CUDA_GRAPH=1``
    and ``cuda_graph_backend_prefill="disabled"``; nothing otherwise.

    sglang 0.5.23 captures decode graphs under its memory saver (tag "cuda_graph", with a CPU
    backup of the graph pool: the graphs are kept, not re-captured, their pool is copied to
    host memory at release and back at resume) only when that variable is set
    (``FullCudaGraphBackend.__init__``); without it the tag frees nothing. Its default prefill
    graph backend on CUDA ("breakable") raises ``NotImplementedError`` under that variable
    (``BreakableCudaGraphBackend.__init__``), so the prefill phase runs eagerly. docs/rollout.md.
    """
    if not enable_memory_saver or disable_cuda_graph:
        return {}, {}
    return {GRAPH_SAVER_ENV: "1"}, {"cuda_graph_backend_prefill": "disabled"}


def _set_logprob_env(mode: str) -> None:
    cur = os.environ.get(RAW_LOGPROB_ENV)
    if mode == "raw":
        if cur is not None and cur.lower() not in ("1", "true", "yes", "on"):
            raise RuntimeError(f"{RAW_LOGPROB_ENV}={cur!r} conflicts with logprobs_mode='raw'")
        os.environ[RAW_LOGPROB_ENV] = "1"
    elif cur is not None and cur.lower() in ("1", "true", "yes", "on"):
        raise RuntimeError(f"{RAW_LOGPROB_ENV}={cur!r} conflicts with logprobs_mode='processed'")


def _set_graph_saver_env(enable_memory_saver: bool, disable_cuda_graph: bool) -> None:
    """Set what :func:`graph_saver_launch` asks before SGLang starts its scheduler processes
    (they inherit the environment); a conflicting value already set is an error."""
    for name, value in graph_saver_launch(enable_memory_saver, disable_cuda_graph)[0].items():
        cur = os.environ.get(name)
        if cur is not None and cur.lower() not in ("1", "true"):
            raise RuntimeError(
                f"{name}={cur!r} conflicts with enable_memory_saver=True: the 'cuda_graph' memory tag would free "
                f"nothing (unset it, or launch with disable_cuda_graph=True)"
            )
        os.environ[name] = value


def _import_sglang():
    try:
        import sglang  # noqa: F401  (sglang: imported when an engine starts)
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(INSTALL_HINT) from e
    return sglang


# -------------------------------------------------------------- checkpoint facts ----
def checkpoint_weight_shapes(model_dir) -> Dict[str, Tuple[int, ...]]:
    """HF name -> shape of every tensor in a local safetensors checkpoint (headers only)."""
    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    shapes: Dict[str, Tuple[int, ...]] = {}
    for f in files:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name != "__metadata__":
                shapes[name] = tuple(info["shape"])
    return shapes


def routing_shape(model_dir) -> Optional[Tuple[int, ...]]:
    """(layers, top_k, experts) of a MoE checkpoint's routed experts (config.json
    ``num_hidden_layers``, ``num_experts_per_tok``: the rows SGLang's capturer allocates;
    ``num_experts`` for the storage dtype); None for a dense model."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    cfg = json.loads(path.read_text())
    cfg = cfg.get("text_config", cfg)
    if not cfg.get("num_experts_per_tok"):
        return None
    experts = cfg.get("num_experts", cfg.get("num_local_experts"))
    return int(cfg["num_hidden_layers"]), int(cfg["num_experts_per_tok"]), experts


def tied_embeddings(model_dir) -> bool:
    cfg_path = Path(model_dir) / "config.json"
    if not cfg_path.exists():
        return False
    cfg = json.loads(cfg_path.read_text())
    return bool(cfg.get("tie_word_embeddings", cfg.get("text_config", {}).get("tie_word_embeddings", False)))


def config_vocab_size(model_dir) -> Optional[int]:
    """``vocab_size`` of a local checkpoint's config.json (text config for multimodal ones)."""
    cfg_path = Path(model_dir) / "config.json"
    if not cfg_path.exists():
        return None
    cfg = json.loads(cfg_path.read_text())
    v = cfg.get("vocab_size", cfg.get("text_config", {}).get("vocab_size"))
    return int(v) if v is not None else None
