"""The typed config tree of a run, its command line (Megatron-LM flag names) and validation."""

from .cli import ConfigError, build_parser, load_yaml, parse_args
from .schema import (
    CheckpointConfig,
    DAPOConfig,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
)
from .validate import data_parallel_size, lr_warmup_optimizer_steps, validate, world_size

__all__ = [
    "ConfigError",
    "build_parser",
    "load_yaml",
    "parse_args",
    "CheckpointConfig",
    "DAPOConfig",
    "DataConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "data_parallel_size",
    "lr_warmup_optimizer_steps",
    "validate",
    "world_size",
]
