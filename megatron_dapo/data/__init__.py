"""Prompt data: verl-schema parquet/jsonl loading, de-duplication, resumable sampling."""

from .dataset import (
    DataError,
    DatasetStats,
    PromptDataset,
    PromptRecord,
    ResumableSampler,
    check_fingerprint,
    load_prompt_dataset,
    read_rows,
    render_prompt,
)

__all__ = [
    "DataError",
    "DatasetStats",
    "PromptDataset",
    "PromptRecord",
    "ResumableSampler",
    "check_fingerprint",
    "load_prompt_dataset",
    "read_rows",
    "render_prompt",
]
