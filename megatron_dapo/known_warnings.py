"""The library warnings an entry point silences: each known to be harmless here, named by its
category, the start of its message and the library that issues it, with why.

Every command (``megatron_dapo.train``, ``tools/*.py``) and every process the run starts (the
trainer ranks, the engines, the reward workers) calls :func:`quiet_known_warnings` first. Only
these warnings are filtered, each by its message: any other warning of the same library, and
every warning of this package, still prints; nothing is filtered for a program that imports
megatron_dapo as a library. ``MEGATRON_DAPO_SHOW_WARNINGS=1`` shows them all again.
Standard library and `platform_imports` only (layer 1).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Optional

from .platform_imports import drop_log_lines

SHOW_ENV = "MEGATRON_DAPO_SHOW_WARNINGS"


@dataclasses.dataclass(frozen=True)
class Known:
    category: type[Warning]
    message: str  # a regular expression matched at the start of the message
    module: Optional[str]  # regex of the module the warning is attributed to (None: any)
    why: str


KNOWN: tuple[Known, ...] = (
    Known(
        UserWarning,
        r"(Transformer Engine and )?Apex (is|are) not installed",
        r"megatron\.core",
        "megatron-core falls back to its torch implementations, the ones this project builds with "
        "(docs/design.md: the local spec, torch optimizers)",
    ),
    Known(
        UserWarning,
        r"full scope is deprecated",
        r"megatron\.core\.transformer\.transformer_config",
        "megatron-core 0.19's own default of TransformerConfig.cuda_graph_scope; CUDA graphs are off",
    ),
    Known(
        DeprecationWarning,
        r"MLP requires ffn_hidden_size, but it was not provided",
        r"megatron\.core\.transformer\.mlp",
        "megatron-core 0.19's own layer spec builds the MLP from config.ffn_hidden_size, as meant",
    ),
    Known(
        DeprecationWarning,
        r"The following imports from `dynamic_context.py`",
        r"megatron\.core\.inference",
        "a note to megatron-core's own developers, printed by its import",
    ),
    Known(
        FutureWarning,
        r"Please use DTensor instead and we are deprecating ShardedTensor",
        None,
        "megatron-core 0.19's torch_dist format is built on ShardedTensor (one line per tensor loaded)",
    ),
    Known(
        UserWarning,
        r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent is to load in a "
        r"single process",
        r"torch\.distributed\.checkpoint",
        "a checkpoint's common state is read by one process on purpose (checkpoint/dist_ckpt.py)",
    ),
    Known(
        UserWarning,
        r"The argument order of load has been changed",
        r"torch\.distributed\.checkpoint",
        "torch's notice about its own API, raised for megatron-core's keyword call",
    ),
)

#: log lines of the Ray driver that read like problems and are not: (logger, start of the line, why)
KNOWN_LOG_LINES: tuple[tuple[str, str, str], ...] = (
    (
        "ray._private.authentication.authentication_token_setup",
        "Token authentication is enabled for this Ray cluster",
        "the local Ray instance a run starts is protected by a token; nothing to do",
    ),
)


def quiet_known_warnings() -> bool:
    """Filter the warnings of :data:`KNOWN` and the log lines of :data:`KNOWN_LOG_LINES` in this
    process (idempotent); False (nothing filtered) when ``MEGATRON_DAPO_SHOW_WARNINGS`` is set."""
    if os.environ.get(SHOW_ENV, "").strip().lower() not in ("", "0", "false", "no", "off"):
        return False
    for k in KNOWN:
        warnings.filterwarnings("ignore", message=k.message, category=k.category, module=k.module or "")
    for name, prefix, _ in KNOWN_LOG_LINES:
        drop_log_lines(name, prefix)
    return True
