"""AlgorithmConfig, presets, apply_preset and validate()."""

import dataclasses

import pytest

from megatron_dapo.algo import PRESETS, AlgorithmConfig, apply_preset

FIELDS = {f.name: f for f in dataclasses.fields(AlgorithmConfig)}


def test_every_field_has_help_and_a_unique_flag():
    flags = [f.metadata["flag"] for f in FIELDS.values()]
    assert len(set(flags)) == len(flags)
    for name, f in FIELDS.items():
        assert f.metadata["help"].strip()
        assert f.metadata["flag"] == "--" + name.replace("_", "-")
        assert AlgorithmConfig.flag(name) == f.metadata["flag"]
    assert FIELDS["eps_clip_high"].metadata["flag"] == "--eps-clip-high"
    assert FIELDS["overlong_filter"].type is bool and FIELDS["max_response_length"].type is int


def test_required_controls_exist():
    for name in (
        "algorithm",
        "eps_clip_low",
        "eps_clip_high",
        "clip_ratio_c",
        "loss_agg_mode",
        "advantage_estimator",
        "overlong_filter",
        "overlong_penalty",
        "max_response_length",
        "overlong_buffer_length",
        "overlong_penalty_factor",
        "dynamic_sampling",
        "dynamic_sampling_metric",
        "kl_coef",
        "kl_estimator",
        "entropy_coef",
    ):
        assert name in FIELDS


def test_presets_cover_every_control():
    for preset in PRESETS.values():
        assert set(preset) == set(FIELDS) - {"algorithm"}


def test_grpo_preset():
    cfg = AlgorithmConfig.from_preset("grpo").validate()
    assert cfg.algorithm == "grpo"
    assert (cfg.eps_clip_low, cfg.eps_clip_high, cfg.clip_ratio_c) == (0.2, 0.2, None)
    assert cfg.loss_agg_mode == "seq-mean-token-mean"
    assert not cfg.overlong_filter and not cfg.overlong_penalty and not cfg.dynamic_sampling
    assert cfg.kl_coef == 0.0 and cfg.entropy_coef == 0.0


def test_dapo_preset_and_defaults():
    cfg = AlgorithmConfig.from_preset("dapo").validate()
    assert (cfg.eps_clip_low, cfg.eps_clip_high, cfg.clip_ratio_c) == (0.2, 0.28, 10.0)
    assert cfg.loss_agg_mode == "token-mean"
    assert cfg.overlong_filter and cfg.overlong_penalty and cfg.dynamic_sampling
    assert (cfg.max_response_length, cfg.overlong_buffer_length, cfg.overlong_penalty_factor) == (20480, 4096, 1.0)
    assert cfg.dynamic_sampling_metric == "acc" and cfg.kl_coef == 0.0 and cfg.kl_estimator == "k3"
    assert AlgorithmConfig() == cfg  # the dataclass defaults are the dapo preset


def test_from_preset_overrides_and_custom():
    cfg = AlgorithmConfig.from_preset("grpo", overlong_filter=True)
    assert cfg.overlong_filter and cfg.eps_clip_high == 0.2
    custom = AlgorithmConfig.from_preset("custom", eps_clip_high=0.3)
    assert custom.algorithm == "custom" and custom.eps_clip_high == 0.3 and custom.loss_agg_mode == "token-mean"
    with pytest.raises(ValueError, match="--algorithm"):
        AlgorithmConfig.from_preset("ppo")
    with pytest.raises(ValueError, match="eps_hihg"):
        AlgorithmConfig.from_preset("dapo", eps_hihg=0.3)


def test_apply_preset_explicit_flags_win():
    # what the CLI parsed: --algorithm grpo --eps-clip-high 0.28 --overlong-filter true
    parsed = AlgorithmConfig(algorithm="grpo", eps_clip_high=0.28, overlong_filter=True)
    cfg = apply_preset(parsed, "grpo", explicit={"eps_clip_high", "--overlong-filter", "algorithm"})
    assert cfg.algorithm == "grpo"
    assert cfg.eps_clip_high == 0.28 and cfg.overlong_filter is True  # explicit values kept
    assert cfg.loss_agg_mode == "seq-mean-token-mean" and cfg.dynamic_sampling is False  # preset elsewhere
    assert cfg.clip_ratio_c is None
    assert parsed.loss_agg_mode == "token-mean"  # the input is not modified
    # name defaults to cfg.algorithm
    assert apply_preset(parsed, explicit={"eps_clip_high"}).dynamic_sampling is False


def test_apply_preset_explicit_dapo_to_grpo_value_wins_even_if_equal_to_default():
    parsed = AlgorithmConfig(algorithm="grpo", loss_agg_mode="token-mean")  # == the dataclass default
    assert apply_preset(parsed, "grpo", {"loss_agg_mode"}).loss_agg_mode == "token-mean"
    assert apply_preset(parsed, "grpo", set()).loss_agg_mode == "seq-mean-token-mean"


def test_apply_custom_changes_nothing():
    parsed = AlgorithmConfig(algorithm="custom", eps_clip_high=0.5, dynamic_sampling=False)
    assert apply_preset(parsed, "custom", set()) == parsed


@pytest.mark.parametrize(
    "overrides, flag",
    [
        ({"algorithm": "ppo"}, "--algorithm"),
        ({"eps_clip_low": 1.2}, "--eps-clip-low must be in [0, 1], got 1.2"),
        ({"eps_clip_low": -0.1}, "--eps-clip-low"),
        ({"eps_clip_high": -0.01}, "--eps-clip-high"),
        ({"clip_ratio_c": 1.0}, "--clip-ratio-c"),
        ({"loss_agg_mode": "sum"}, "--loss-agg-mode"),
        ({"advantage_estimator": "gae"}, "--advantage-estimator"),
        ({"adv_eps": -1e-6}, "--adv-eps"),
        ({"overlong_filter": 1}, "--overlong-filter"),
        ({"overlong_penalty": None}, "--overlong-penalty"),
        ({"max_response_length": 0}, "--max-response-length"),
        ({"max_response_length": 1.5}, "--max-response-length"),
        ({"overlong_buffer_length": 30000}, "--overlong-buffer-length"),
        ({"overlong_buffer_length": 0}, "--overlong-buffer-length"),
        ({"overlong_penalty_factor": -1.0}, "--overlong-penalty-factor"),
        ({"dynamic_sampling": "true"}, "--dynamic-sampling"),
        ({"dynamic_sampling_metric": ""}, "--dynamic-sampling-metric"),
        ({"dynamic_sampling_metric": "length"}, "--dynamic-sampling-metric must be one of acc, score, reward"),
        ({"kl_coef": -0.1}, "--kl-coef"),
        ({"kl_coef": float("nan")}, "--kl-coef"),
        ({"kl_estimator": "k4"}, "--kl-estimator"),
        ({"entropy_coef": -0.001}, "--entropy-coef"),
    ],
)
def test_validate_names_the_flag(overrides, flag):
    cfg = dataclasses.replace(AlgorithmConfig(), **overrides)
    with pytest.raises(ValueError) as err:
        cfg.validate()
    assert flag in str(err.value)


def test_validate_accepts_edge_values():
    AlgorithmConfig(eps_clip_low=0.0, eps_clip_high=0.0, clip_ratio_c=None).validate()
    AlgorithmConfig(overlong_penalty=False, overlong_buffer_length=0).validate()
    AlgorithmConfig(max_response_length=16, overlong_buffer_length=16, dynamic_sampling_metric="score").validate()
