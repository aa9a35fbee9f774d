"""megatron-dapo: DAPO reinforcement learning on megatron-core with colocated rollout engines.

Importing this package is cheap and safe on a CPU-only machine: it imports neither
megatron-core, transformers, sglang nor transformer_engine. Subpackages import what
they need when they are used.
"""

__version__ = "0.1.0"

from . import platform_imports as _platform_imports  # noqa: E402  (standard library only)

_platform_imports.install()  # megatron-core's torch.compile decorators compile when first called
