"""Config tree, Megatron-style CLI, YAML overrides and validation messages."""

import re

import pytest

from megatron_dapo.config import ConfigError, parse_args, validate
from megatron_dapo.models import parse_hf_config
from tests.tiny import tiny_qwen2_config

SMALL = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--global-batch-size", "8"]


def _cfg(*argv):
    cfg = parse_args(list(SMALL) + list(argv))
    return cfg


def test_megatron_flag_names_parse():
    cfg = parse_args(
        [
            "--tensor-model-parallel-size",
            "2",
            "--pipeline-model-parallel-size",
            "2",
            "--sequence-parallel",
            "--use-distributed-optimizer",
            "--lr",
            "1e-6",
            "--lr-warmup-iters",
            "10",
            "--weight-decay",
            "0.1",
            "--clip-grad",
            "1.0",
            "--adam-beta1",
            "0.9",
            "--adam-beta2",
            "0.98",
            "--micro-batch-size",
            "2",
            "--global-batch-size",
            "512",
            "--seed",
            "7",
            "--save-interval",
            "5",
        ]
    )
    assert cfg.parallel.tensor_model_parallel_size == 2 and cfg.parallel.pipeline_model_parallel_size == 2
    assert cfg.parallel.sequence_parallel is True and cfg.parallel.use_distributed_optimizer is True
    assert cfg.optim.lr == 1e-6 and cfg.optim.adam_beta2 == 0.98 and cfg.optim.lr_warmup_iters == 10
    assert cfg.optim.micro_batch_size == 2 and cfg.optim.global_batch_size == 512 and cfg.optim.seed == 7
    assert cfg.checkpoint.save_interval == 5


def test_yaml_then_cli_override(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("optim:\n  lr: 3.0e-6\n  seed: 5\neps-clip-high: 0.3\ntensor_model_parallel_size: 2\n")
    cfg = parse_args(["--config", str(y), "--seed", "9"])
    assert cfg.optim.lr == 3e-6  # from the file
    assert cfg.optim.seed == 9  # the flag wins
    assert cfg.algo.eps_clip_high == 0.3 and cfg.parallel.tensor_model_parallel_size == 2


def test_yaml_unknown_key_named(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("optim:\n  learning_rate: 1\n")
    with pytest.raises(ConfigError, match="learning_rate"):
        parse_args(["--config", str(y)])


def test_presets_and_explicit_flags_win():
    grpo = _cfg("--algorithm", "grpo").algo
    assert (grpo.eps_clip_low, grpo.eps_clip_high, grpo.loss_agg_mode) == (0.2, 0.2, "seq-mean-token-mean")
    assert not grpo.dynamic_sampling and not grpo.overlong_filter and not grpo.overlong_penalty
    dapo = _cfg("--algorithm", "dapo").algo
    assert (dapo.eps_clip_high, dapo.loss_agg_mode, dapo.dynamic_sampling) == (0.28, "token-mean", True)
    mixed = _cfg("--algorithm", "grpo", "--overlong-filter", "--eps-clip-high", "0.28").algo
    assert mixed.overlong_filter is True and mixed.eps_clip_high == 0.28 and mixed.dynamic_sampling is False
    assert _cfg("--no-dynamic-sampling").algo.dynamic_sampling is False


@pytest.mark.parametrize(
    "argv, replacement",
    [
        (["--normalize-adv-std", "false"], "--advantage-estimator group-norm .* or group-mean"),
        (["--normalize-adv-std"], "--advantage-estimator"),
        (["--min-lr", "0"], "constant after warm-up"),
    ],
)
def test_removed_flags_say_what_replaces_them(argv, replacement, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    err = capsys.readouterr().err
    assert f"{argv[0]} was removed" in err and re.search(replacement, err)


def test_removed_flags_in_yaml_say_what_replaces_them(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("algo:\n  normalize_adv_std: false\n")
    with pytest.raises(
        ConfigError, match="normalize_adv_std.*--normalize-adv-std was removed: use --advantage-estimator"
    ):
        parse_args(["--config", str(y)])
    y.write_text("min-lr: 0.0\n")
    with pytest.raises(ConfigError, match="--min-lr was removed"):
        parse_args(["--config", str(y)])


def test_choices_come_from_the_registries():
    from megatron_dapo.algo import ADVANTAGE_ESTIMATORS, DYNAMIC_SAMPLING_METRICS
    from megatron_dapo.config import build_parser
    from megatron_dapo.reward.api import REWARD_MODES
    from megatron_dapo.rollout.engines import ENGINE_KINDS

    choices = {a.option_strings[0]: a.choices for a in build_parser()._actions if a.option_strings}
    assert choices["--advantage-estimator"] == list(ADVANTAGE_ESTIMATORS.names())
    assert choices["--dynamic-sampling-metric"] == list(DYNAMIC_SAMPLING_METRICS)
    assert choices["--reward-mode"] == list(REWARD_MODES.names()) == ["dapo", "math"]
    assert choices["--rollout-engine"] == ["auto", *ENGINE_KINDS.names()] == ["auto", "hf", "sglang"]
    assert _cfg("--advantage-estimator", "reinforce-pp-baseline").algo.advantage_estimator == "reinforce-pp-baseline"
    with pytest.raises(SystemExit):
        _cfg("--advantage-estimator", "gae")


def test_bad_bool_value_names_flag(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--overlong-filter", "maybe"])
    assert "--overlong-filter" in capsys.readouterr().err


# ---- invalid combinations: each message names the flags and values


def test_world_not_divisible_by_tp_pp():
    cfg = _cfg("--actor-num-gpus-per-node", "6", "--tensor-model-parallel-size", "4")
    with pytest.raises(ConfigError, match=r"--tensor-model-parallel-size 4.*--pipeline-model-parallel-size 1"):
        validate(cfg, on_gpu=True)


def test_heads_not_divisible_by_tp():
    arch = parse_hf_config(tiny_qwen2_config(num_attention_heads=6, num_key_value_heads=6, hidden_size=48))
    cfg = _cfg(
        "--actor-num-gpus-per-node",
        "4",
        "--tensor-model-parallel-size",
        "4",
        "--max-response-length",
        "64",
        "--max-prompt-length",
        "64",
    )
    with pytest.raises(ConfigError, match=r"attention heads 6.*--tensor-model-parallel-size 4"):
        validate(cfg, arch=arch, on_gpu=True)


def test_kv_heads_not_divisible_by_tp():
    arch = parse_hf_config(tiny_qwen2_config(num_attention_heads=4, num_key_value_heads=1))
    cfg = _cfg(
        "--actor-num-gpus-per-node",
        "2",
        "--tensor-model-parallel-size",
        "2",
        "--max-response-length",
        "64",
        "--max-prompt-length",
        "64",
    )
    with pytest.raises(ConfigError, match=r"KV heads 1.*--tensor-model-parallel-size 2"):
        validate(cfg, arch=arch, on_gpu=True)


def test_layers_not_divisible_by_pp():
    arch = parse_hf_config(tiny_qwen2_config(num_hidden_layers=3))
    cfg = _cfg(
        "--actor-num-gpus-per-node",
        "2",
        "--pipeline-model-parallel-size",
        "2",
        "--max-response-length",
        "64",
        "--max-prompt-length",
        "64",
    )
    with pytest.raises(ConfigError, match=r"layers 3.*--pipeline-model-parallel-size 2"):
        validate(cfg, arch=arch, on_gpu=True)


def test_global_batch_not_divisible_by_dp():
    cfg = parse_args(
        [
            "--actor-num-gpus-per-node",
            "4",
            "--rollout-batch-size",
            "3",
            "--n-samples-per-prompt",
            "2",
            "--global-batch-size",
            "6",
        ]
    )
    with pytest.raises(ConfigError, match=r"--global-batch-size 6.*data-parallel size 4"):
        validate(cfg, on_gpu=True)


def test_responses_not_divisible_by_global_batch():
    cfg = parse_args(["--rollout-batch-size", "3", "--n-samples-per-prompt", "3", "--global-batch-size", "4"])
    with pytest.raises(
        ConfigError, match=r"--rollout-batch-size 3 x --n-samples-per-prompt 3 = 9.*--global-batch-size 4"
    ):
        validate(cfg, on_gpu=True)


def test_gpu_only_features_refused_on_cpu():
    with pytest.raises(ConfigError, match="--bf16"):
        validate(_cfg("--bf16"), on_gpu=False)
    with pytest.raises(ConfigError, match="--sequence-parallel"):
        validate(
            _cfg("--actor-num-gpus-per-node", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"),
            on_gpu=False,
        )


def test_bad_algorithm_values_named():
    with pytest.raises(ConfigError, match="--eps-clip-low"):
        validate(_cfg("--eps-clip-low", "1.5"), on_gpu=True)
    with pytest.raises(ConfigError, match="--dynamic-sampling.*--n-samples-per-prompt"):
        validate(
            parse_args(["--rollout-batch-size", "4", "--n-samples-per-prompt", "1", "--global-batch-size", "4"]),
            on_gpu=True,
        )


def test_context_length_checked():
    arch = parse_hf_config(tiny_qwen2_config(max_position_embeddings=256))
    with pytest.raises(ConfigError, match=r"--max-prompt-length 2048 \+ --max-response-length 20480"):
        validate(_cfg(), arch=arch, on_gpu=True)


def test_missing_paths_named(tmp_path):
    with pytest.raises(ConfigError, match="--prompt-data"):
        validate(_cfg("--prompt-data", str(tmp_path / "nope.parquet")), on_gpu=True)
    with pytest.raises(ConfigError, match="--hf-checkpoint"):
        validate(_cfg("--hf-checkpoint", str(tmp_path / "nope")), on_gpu=True)


def test_valid_config_passes():
    arch = parse_hf_config(tiny_qwen2_config())
    cfg = _cfg(
        "--actor-num-gpus-per-node",
        "4",
        "--tensor-model-parallel-size",
        "2",
        "--max-response-length",
        "64",
        "--max-prompt-length",
        "64",
        "--overlong-buffer-length",
        "16",
    )
    assert validate(cfg, arch=arch, on_gpu=False) == []
