"""Issue 38, item 3: one validator for every number. Every numeric field of the config tree
declares its range next to its default, and ``validate`` refuses NaN, the infinities and an
out-of-range value of each, in one line naming the flag: from the command line, from a YAML
file, and through the dry run of the real entry point."""

from __future__ import annotations

import math

import pytest

from megatron_dapo.config.cli import ConfigError, parse_args
from megatron_dapo.config.schema import DAPOConfig, flag_of
from megatron_dapo.config.validate import check_ranges, validate
from megatron_dapo.ranges import Range, numeric_fields
from tests.foundation.test_user_errors import _args, _no_debug, _train, one_line, tiny  # noqa: F401 (fixtures)

FIELDS = [(f, flag) for f, flag, _ in numeric_fields(DAPOConfig(), flag_of)]


def _outside(rng: Range):
    """A value just outside ``rng`` (None when every finite number is inside)."""
    if rng.lo is not None:
        return int(rng.lo) - 1 if rng.integer else (rng.lo if rng.lo_open else rng.lo - 0.5)
    if rng.hi is not None:
        return int(rng.hi) + 1 if rng.integer else (rng.hi if rng.hi_open else rng.hi + 0.5)
    return None


def test_every_numeric_field_declares_its_range_and_its_default_is_inside():
    assert len(FIELDS) >= 60  # the walk reaches every section, algorithm controls included
    for f, flag in FIELDS:
        rng = f.metadata.get("range")
        assert isinstance(rng, Range), f"{flag}: no range= next to its default"
        assert f.default is None or rng.contains(f.default), (flag, f.default, rng)
    check_ranges(DAPOConfig())  # the defaults pass


@pytest.mark.parametrize("field,flag", FIELDS, ids=[flag for _, flag in FIELDS])
def test_nan_inf_and_out_of_range_are_refused_naming_the_flag(field, flag, tmp_path):
    rng = field.metadata["range"]
    bad = [math.nan, math.inf, -math.inf]
    if _outside(rng) is not None:
        bad.append(_outside(rng))
    for value in bad:
        # through YAML (".nan", ".inf" and numbers reach the field as YAML floats / ints)
        text = {math.inf: ".inf", -math.inf: "-.inf"}.get(value, ".nan" if value != value else repr(value))
        path = tmp_path / "c.yaml"
        path.write_text(f"{flag[2:]}: {text}\n")
        with pytest.raises(ConfigError) as e:
            validate(parse_args(["--config", str(path)]), on_gpu=False)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(flag), (flag, value, msg)
        assert "must be" in msg or "expects" in msg, msg


def test_the_entry_point_refuses_a_nan_learning_rate_and_a_negative_seed_in_one_line(tiny, tmp_path, capfd):
    one_line(_train(capfd, _args(tiny, tmp_path, "--lr", "nan")), "--lr", "must be a finite number > 0", "nan")
    one_line(_train(capfd, _args(tiny, tmp_path, "--seed", "-1")), "--seed", "an integer in [0, 4294967295]", "-1")
    one_line(_train(capfd, _args(tiny, tmp_path, "--adam-beta2", "2")), "--adam-beta2", "[0, 1)", "2")
    one_line(_train(capfd, _args(tiny, tmp_path, "--rollout-temperature", "nan")), "--rollout-temperature", "nan")
    # the dry run (the plan a user checks before submitting) refuses them too
    one_line(_train(capfd, _args(tiny, tmp_path, "--dry-run", "--clip-grad", "inf")), "--clip-grad", "inf")
