"""benchmarks/demo_ab.py: its training command is the demo's (read from examples/run_smollm2_cpu.sh,
less what an A/B does not want), the B/A ratios are of the step means of each side, and an
existing --out is refused with one line."""

from __future__ import annotations

import os
import re
import shlex
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import demo_ab as D  # noqa: E402

# flags of the demo that an A/B leaves out: checkpoints, the HF export, rollout dumps, the start-over
NOT_IN_AB = {
    "--save-hf-final": 0,
    "--save": 1,
    "--save-interval": 1,
    "--keep-last": 1,
    "--dump-rollouts-every": 1,
    "--start-over": 0,
}


def _script_train_argv() -> list:
    text = open(os.path.join(ROOT, "examples", "run_smollm2_cpu.sh")).read()
    block = text[text.index("$PY -m megatron_dapo.train") : text.index("[ $DRY_RUN = 1 ]")]
    argv = shlex.split(block.replace("\\\n", " "))[3:]  # after `$PY -m megatron_dapo.train`
    subst = {"$HF": "$WORK/smollm2-hf", "$DATA": "$WORK/addition", "$WORK": D.WORK}
    out = []
    for x in argv:
        if x == "${INIT[@]}":
            out += ["--pretrained-checkpoint", "$CKPT"]
        elif x not in ("$@", "${ARGS[@]+${ARGS[@]}}"):  # the user's extra flags
            out.append(x)
    out = [x.replace("$CKPT", "$WORK/smollm2-torch_dist") for x in out]
    for k, v in subst.items():
        out = [x.replace(k, v) for x in out]
    return out


def _drop(argv: list, drop: dict) -> list:
    out, i = [], 0
    while i < len(argv):
        if argv[i] in drop:
            i += 1 + drop[argv[i]]
        else:
            out.append(argv[i])
            i += 1
    return out


def test_the_ab_command_is_the_demos():
    script = _drop(_script_train_argv(), NOT_IN_AB)
    ab = D.demo_args(5, "RUN")
    subst = {"$STEPS": "5", "$RUN_DIR": "RUN", "$ENGINE": D._engine()}  # the script's ENGINE: sglang here
    assert ab == [subst.get(x, x) for x in script]
    assert not any(re.search(r"\$", x) for x in ab)


def test_ratios_are_of_the_step_means_of_each_side():
    def rows(*steps):
        return [{**{k: 1.0 for k in D.PHASES}, "time_step": s, "time_train": s / 2} for s in steps]

    res = D.compare({"A1": rows(100.0, 110.0), "B1": rows(90.0), "B2": rows(99.0, 96.0), "A2": rows(120.0)})
    assert res["time_step"]["A"] == pytest.approx(110.0) and res["time_step"]["B"] == pytest.approx(95.0)
    assert res["time_step"]["ratio"] == pytest.approx(95.0 / 110.0)
    assert res["time_train"]["ratio"] == pytest.approx(95.0 / 110.0) and res["time_sync"]["ratio"] == 1.0


def test_an_existing_out_is_refused_in_one_line(tmp_path, capsys):
    assert D.main(["HEAD", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tmp_path) in err[0] and "nothing is overwritten" in err[0]
    assert os.listdir(tmp_path) == []
