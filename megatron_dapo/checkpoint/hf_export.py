"""HF checkpoint <-> torch_dist checkpoint, the work behind ``tools/convert_*``.

Both directions go tensor by tensor through :mod:`.mapping` (no layout logic here) and run
under whatever process group is initialised: a world of one (the tools' default, no torchrun)
or all ranks of a launched job. Memory: the model of the ranks' layout is built without
initialisation (``perform_initialization=False``) and filled one HF tensor at a time, so the
peak is about one copy of the model plus the largest tensor (see docs/conversion.md).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Optional

import torch

from ..distributed import free_port, init_distributed, init_parallel
from ..errors import CheckpointError
from ..models.hf_config import ModelArch, load_hf_config, padded_vocab_size, parse_hf_config
from . import dist_ckpt, manifest, mapping
from .hf_check import check_hf_checkpoint
from .model_io import HFWeights, gather_full_weights, load_hf_weights

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3


def ensure_distributed() -> None:
    """A gloo/nccl default group: the launcher's (torchrun env) or a world of one on a free port."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        init_distributed()
    else:
        init_distributed(rank=0, world_size=1, master_port=free_port())


def _build(arch_or_cfg, dtype: torch.dtype, tp: int, pp: int, make_vocab_size_divisible_by: int):
    from ..models import ModelBuildOptions, build_gpt_model  # megatron-core: imported when a model is built

    init_parallel(tp, pp)
    opts = ModelBuildOptions(
        params_dtype=dtype, make_vocab_size_divisible_by=make_vocab_size_divisible_by, perform_initialization=False
    )
    model, arch, _ = build_gpt_model(arch_or_cfg, opts)
    model.eval()
    return model, arch, padded_vocab_size(arch.vocab_size, make_vocab_size_divisible_by, tp)


@torch.no_grad()
def hf_to_torch_dist(
    hf_dir,
    save_dir,
    dtype: str = "fp32",
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    make_vocab_size_divisible_by: int = 128,
) -> dict:
    """Convert the HF checkpoint in ``hf_dir`` into a torch_dist checkpoint in ``save_dir``.

    Collective over the default group (initialised here as a world of one when absent).
    The layout used for writing does not constrain loading: the trainer loads at any TP/PP.
    Returns the checkpoint metadata.
    """
    hf_dir = os.fspath(hf_dir)
    cfg = load_hf_config(hf_dir)
    arch = parse_hf_config(cfg)
    check_hf_checkpoint(hf_dir, arch)  # before building anything: whole files, names, shapes, dtypes
    weights = HFWeights(hf_dir)
    ensure_distributed()
    model, arch, padded = _build(
        cfg,
        dist_ckpt.torch_dtype(dtype),
        tensor_model_parallel_size,
        pipeline_model_parallel_size,
        make_vocab_size_divisible_by,
    )
    target = dist_ckpt.torch_dtype(dtype)
    # Round every tensor to the checkpoint dtype, also those the local spec keeps in fp32 (norms).
    load_hf_weights(model, arch, lambda name: read_hf_tensor(hf_dir, weights.weight_map, name).to(target), padded)
    meta = dist_ckpt.checkpoint_metadata(cfg, dtype, extra={"source": os.path.abspath(hf_dir)})
    dist_ckpt.save_checkpoint(model, save_dir, meta, release_model_memory=True)
    import torch.distributed as dist

    if dist.get_rank() == 0:
        manifest.write_manifest(save_dir)  # the ranks' shard digests merged; verified before a read
    dist.barrier()
    return meta


def read_hf_tensor(hf_dir: str, weight_map: dict, name: str) -> torch.Tensor:
    """One tensor of an HF checkpoint, its safetensors file opened and closed around the read.

    A file kept open stays memory-mapped, and every page read through the map stays in the
    process's RSS (file-backed) until it is closed: a whole model's worth after a conversion.
    """
    from safetensors import safe_open

    with safe_open(os.path.join(hf_dir, weight_map[name]), "pt") as f:
        return f.get_tensor(name)


def hf_config_for(meta: dict, hf_config_dir=None) -> dict:
    """The config.json to write for a checkpoint: ``hf_config_dir``'s (checked against the
    checkpoint) or the one stored in the metadata."""
    if hf_config_dir is not None:
        cfg = load_hf_config(hf_config_dir)
        try:
            dist_ckpt.check_metadata(meta, parse_hf_config(cfg), where="the checkpoint")
        except CheckpointError as e:
            raise CheckpointError(
                f"--hf-config {hf_config_dir}: its config.json does not describe the checkpoint ({e}); give the "
                "config the checkpoint was converted from, or leave --hf-config out (the checkpoint's own is written)"
            ) from None
    elif meta.get("hf_config"):
        cfg = dict(meta["hf_config"])
    else:
        cfg = _config_from_arch(dist_ckpt.metadata_arch(meta))
    cfg = dict(cfg)
    cfg["dtype"] = (
        "bfloat16" if meta.get("dtype") == "bf16" else ("float16" if meta.get("dtype") == "fp16" else "float32")
    )
    cfg.pop("torch_dtype", None)
    return cfg


def _config_from_arch(arch: ModelArch) -> dict:
    cls = {
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
        "qwen3_moe": "Qwen3MoeForCausalLM",
        "llama": "LlamaForCausalLM",
    }[arch.model_type]
    cfg = dict(
        model_type=arch.model_type,
        architectures=[cls],
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.ffn_hidden_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_query_groups,
        head_dim=arch.head_dim,
        max_position_embeddings=arch.max_position_embeddings,
        rope_theta=arch.rope_theta,
        rms_norm_eps=arch.norm_eps,
        tie_word_embeddings=arch.tie_word_embeddings,
        hidden_act="silu",
        bos_token_id=arch.bos_token_id,
        eos_token_id=arch.eos_token_id,
    )
    if arch.model_type in ("llama", "qwen3", "qwen3_moe"):
        cfg.update(attention_bias=False)
    if arch.model_type == "llama":
        cfg.update(mlp_bias=False)
    if arch.is_moe:
        cfg.update(
            num_experts=arch.num_experts,
            moe_intermediate_size=arch.moe_ffn_hidden_size,
            num_experts_per_tok=arch.moe_router_topk,
            norm_topk_prob=arch.moe_norm_topk_prob,
            router_aux_loss_coef=arch.router_aux_loss_coef,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    return cfg


class ShardWriter:
    """Write (name, tensor) pairs into ``model-XXXXX-of-YYYYY.safetensors`` shards + index.

    ``part_prefix`` names the temporary part files, so that several writers (one per pipeline
    stage) can share a directory; :func:`finalize_shards` then names all parts at once."""

    def __init__(self, directory: str, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, part_prefix: str = "_part"):
        self.directory = directory
        self.max_shard_bytes = max_shard_bytes
        self.part_prefix = part_prefix
        self._buf: dict[str, torch.Tensor] = {}
        self._buf_bytes = 0
        self._files: list[list[str]] = []
        self.total_bytes = 0
        os.makedirs(directory, exist_ok=True)

    def add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self._buf and self._buf_bytes + nbytes > self.max_shard_bytes:
            self._flush()
        self._buf[name] = tensor.detach().contiguous().clone()  # own storage: no shared views
        self._buf_bytes += nbytes
        self.total_bytes += nbytes

    def _flush(self) -> None:
        from safetensors.torch import save_file

        i = len(self._files)
        save_file(self._buf, os.path.join(self.directory, self._part_name(i)), metadata={"format": "pt"})
        self._files.append(list(self._buf))
        self._buf, self._buf_bytes = {}, 0

    def _part_name(self, i: int) -> str:
        return f"{self.part_prefix}{i:05d}.safetensors"

    def flush_parts(self) -> list[tuple[str, list[str]]]:
        """Write what is buffered; returns ``[(part file, tensor names)]`` of this writer."""
        if self._buf:
            self._flush()
        return [(self._part_name(i), keys) for i, keys in enumerate(self._files)]

    def close(self) -> list[str]:
        if not self._files and not self._buf:
            self._flush()  # an empty model still gets its (empty) model.safetensors
        return finalize_shards(self.directory, self.flush_parts(), self.total_bytes)


def finalize_shards(directory: str, parts: list, total_bytes: int) -> list[str]:
    """Rename part files ``[(file, names)]`` to ``model[-XXXXX-of-YYYYY].safetensors`` and write
    the index when there is more than one. Returns the final file names."""
    n = len(parts)
    weight_map, names = {}, []
    for i, (part, keys) in enumerate(parts):
        final = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        os.replace(os.path.join(directory, part), os.path.join(directory, final))
        names.append(final)
        weight_map.update({k: final for k in keys})
    if n > 1:
        with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total_bytes}, "weight_map": weight_map}, f, indent=2)
    return names


def write_config_and_tokenizer(save_dir: str, cfg: dict, tokenizer_dir=None) -> list[str]:
    """config.json and (from ``tokenizer_dir``) the tokenizer files of an HF checkpoint."""
    with open(os.path.join(save_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    return ["config.json"] + (copy_tokenizer(tokenizer_dir, save_dir) if tokenizer_dir is not None else [])


def check_tokenizer_dir(src) -> list[str]:
    """The tokenizer files in ``src`` (None: no tokenizer asked for); CheckpointError, one line,
    when there are none (before anything is loaded or written)."""
    if src is None:
        return []
    src = os.fspath(src)
    found = [f for f in TOKENIZER_FILES if os.path.exists(os.path.join(src, f))]
    if not any(f.startswith("tokenizer") or f in ("vocab.json",) for f in found):
        what = "no tokenizer files there" if os.path.isdir(src) else "directory not found"
        raise CheckpointError(
            f"--tokenizer {src}: {what} ({', '.join(TOKENIZER_FILES[:5])} ...); give the directory of the "
            "model's tokenizer (its HF checkpoint) or leave --tokenizer out"
        )
    return found


def copy_tokenizer(src, dst) -> list[str]:
    """Copy the tokenizer files found in ``src`` into ``dst``; error if there are none."""
    src = os.fspath(src)
    found = check_tokenizer_dir(src)
    for f in found:
        shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))
    return found


@torch.no_grad()
def torch_dist_to_hf(
    load_dir,
    save_dir,
    hf_config_dir=None,
    tokenizer_dir=None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    make_vocab_size_divisible_by: int = 128,
    lora_setup=None,
) -> list[str]:
    """Write the torch_dist checkpoint in ``load_dir`` as an HF checkpoint in ``save_dir``.

    safetensors shards (+ index when more than one), config.json and, from ``tokenizer_dir``,
    the tokenizer files. Collective over the default group (a world of one when absent); rank 0
    writes. Tensors keep the checkpoint's dtype. Returns the files written.

    A LoRA run's checkpoint holds the adapters only (checkpoint/lora_meta.py): ``lora_setup(model,
    arch, record, padded_vocab)`` puts the adapters on the built model and loads the base it names
    (tools/convert_megatron_to_hf.py); the export is the merged model. Without it such a
    checkpoint is refused in one line.
    """
    import torch.distributed as dist

    load_dir, save_dir = os.fspath(load_dir), os.fspath(save_dir)
    meta = dist_ckpt.read_metadata(load_dir)
    cfg = hf_config_for(meta, hf_config_dir)  # validated before the (long) load
    check_tokenizer_dir(tokenizer_dir)
    dist_ckpt.verify_checkpoint_files(load_dir)
    damaged = manifest.verify(load_dir)  # the digests recorded at save (none: written before they existed)
    if damaged:
        raise CheckpointError(f"{load_dir}: {damaged}; {dist_ckpt.FIX_DAMAGED}")
    lora = (meta.get("extra") or {}).get("lora")
    if lora and lora_setup is None:
        raise CheckpointError(
            f"{load_dir} holds LoRA adapters only (rank {lora['rank']}, base {lora['base']['hf_checkpoint']}): "
            "convert it with tools/convert_megatron_to_hf.py, which loads the base and merges them"
        )
    ensure_distributed()  # every check above reads files only
    arch = dist_ckpt.metadata_arch(meta)
    model, arch, padded = _build(arch, dist_ckpt.torch_dtype(meta["dtype"]), 1, 1, make_vocab_size_divisible_by)
    if lora:
        lora_setup(model, arch, lora, padded)
    dist_ckpt.load_checkpoint(model, load_dir, arch)
    written: list[str] = []
    if dist.get_rank() == 0:
        os.makedirs(save_dir, exist_ok=True)
        writer = ShardWriter(save_dir, max_shard_bytes)
        out_dtype = dist_ckpt.torch_dtype(meta["dtype"])  # the local spec keeps norms in fp32
        for name, full in gather_full_weights(model, arch):
            for hf_name, t in mapping.megatron_to_hf(arch, name, full):
                writer.add(hf_name, t.to(out_dtype))
        written = writer.close() + write_config_and_tokenizer(save_dir, cfg, tokenizer_dir)
        manifest.write_manifest(save_dir)
    dist.barrier()
    return written


@torch.no_grad()
def export_model_to_hf(
    model,
    arch: ModelArch,
    save_dir: str,
    hf_config_dir=None,
    tokenizer_dir=None,
    dtype: Optional[torch.dtype] = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> list[str]:
    """Write a live (trained) megatron model as an HF checkpoint: the trainer's own weights,
    through the one mapping (``mapping.megatron_to_hf``), never through an engine.

    Collective over the world: TP shards are all-gathered inside each model-parallel group;
    on every pipeline stage the rank with TP rank 0 and DP rank 0 writes that stage's tensors
    (no PP traffic); global rank 0 then names the shards, writes the index, config.json
    (``hf_config_dir``'s, with the written dtype) and the tokenizer files. ``dtype``: the
    tensors' dtype in the files (default: the parameters' dtype). Returns the files written
    (on rank 0; [] elsewhere).
    """
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    save_dir = os.fspath(save_dir)
    writer_rank = ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0
    stage = ps.get_pipeline_model_parallel_rank()
    os.makedirs(save_dir, exist_ok=True)
    writer = ShardWriter(save_dir, max_shard_bytes, part_prefix=f"_pp{stage:03d}_part") if writer_rank else None
    out_dtype = dtype
    for name, full in gather_full_weights(model, arch):
        out_dtype = out_dtype or full.dtype
        for hf_name, t in mapping.megatron_to_hf(arch, name, full):
            if writer is not None:
                writer.add(hf_name, t.to(dtype or t.dtype).cpu())
    mine = (writer.flush_parts(), writer.total_bytes) if writer is not None else ([], 0)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (stage, mine))
    written: list[str] = []
    if dist.get_rank() == 0:
        parts = [p for _, (ps_, _) in sorted(everyone, key=lambda x: x[0]) for p in ps_]
        total = sum(b for _, (_, b) in everyone)
        written = finalize_shards(save_dir, parts, total)
        cfg = load_hf_config(hf_config_dir) if hf_config_dir else _config_from_arch(arch)
        cfg = dict(cfg)
        cfg.pop("torch_dtype", None)
        cfg["dtype"] = {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(out_dtype, "float32")
        written += write_config_and_tokenizer(save_dir, cfg, tokenizer_dir)
    dist.barrier()
    return written
