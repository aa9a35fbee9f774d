"""``Registry`` lives in ``megatron_dapo/registry.py`` (standard library only, shared with
``reward`` and ``rollout``); this name is kept for the algorithm modules."""

from ..registry import Registry

__all__ = ["Registry"]
