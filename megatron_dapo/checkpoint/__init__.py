"""Checkpoint formats: the HF <-> megatron-core weight mapping, HF I/O, torch_dist checkpoints."""

from .mapping import (
    MappingError,
    canonical_name,
    fuse_qkv,
    hf_names,
    hf_names_for,
    hf_to_megatron,
    megatron_names,
    megatron_to_hf,
    shard_tp,
    split_qkv,
    tp_partition_dim,
    unshard_tp,
)

__all__ = [
    "MappingError",
    "canonical_name",
    "fuse_qkv",
    "hf_names",
    "hf_names_for",
    "hf_to_megatron",
    "megatron_names",
    "megatron_to_hf",
    "shard_tp",
    "split_qkv",
    "tp_partition_dim",
    "unshard_tp",
]
