"""The driver resumes on fewer ranks: a checkpoint of a 2-node job continued by a 1-node job.

A: ``python -m megatron_dapo.train`` with ``--actor-num-nodes 2 --actor-num-gpus-per-node 1``
(2 trainer ranks, DP 2; one rollout engine fed by both), 2 DAPO steps (2 optimizer steps each),
a checkpoint after each, --deterministic. B: ``--load`` of A's step-1 checkpoint with
``--actor-num-nodes 1`` (1 rank, DP 1, one engine), step 2 only. What is simulated: the two "nodes" of A are two Ray bundles on
this one host (the placement group packs them), so the checkpoint records 1 host; what changes
between A and B is the rank count and the data-parallel size, which is what a 2 -> 1 node
resume changes for the checkpoint (its tensors have global keys, no node in them).

A's step 2 stands for a resume at the saving layout (that resume is bitwise equal to the
uninterrupted run: tests/e2e/test_resume.py). With --deterministic, B's step 2 generates the same
responses (per-sample seeds, the same weights, one engine in both), so its metrics and final
weights are compared with A's: measured |dloss| 1.2e-8, |dweight| 3.3e-8 (lr 1e-3);
asserted |dloss| <= 1e-6, |dweight| within the bound of tests/tolerances.py for the step's two Adam
steps (--adam-eps 1e-3 there), the same generation metrics. B logs one note that the per-rank RNG
states were re-derived.
"""

from __future__ import annotations

import os
import sys

import pytest
from safetensors.torch import load_file

from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir
from tests.e2e.test_resume import _env, _strip
from tests.e2e.test_train_e2e import base_args, read_metrics
from tests.launch.procs import run_in_session
from tests.tolerances import COMPARE_ADAM_EPS, adam_weight_atol, max_abs

pytestmark = [pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOSS_TOL = 1e-6
# the step's generation, the same in A and B when the responses are the same
SAME_ROLLOUT_KEYS = ("reward_mean", "acc_mean", "response_length_mean", "response_length_max", "kept_group_ratio")


def _cmd(hf, prompts, run, nodes, extra=()):
    args = base_args(
        hf,
        prompts,
        run,
        **{
            "--num-rollout": "2",
            "--deterministic": None,
            "--save-hf-final": None,
            "--actor-num-nodes": str(nodes),
            "--actor-num-gpus-per-node": "1",
            "--rollout-num-gpus-per-engine": str(nodes),
            "--adam-eps": str(COMPARE_ADAM_EPS),
        },
    )
    return [sys.executable, "-m", "megatron_dapo.train", *args, *extra]


def _run(cmd):
    r = run_in_session(cmd, 900, cwd=ROOT, env=_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return r


def test_two_node_checkpoint_resumes_on_one_node(tmp_path):
    hf = make_tiny_qwen2_dir(str(tmp_path / "hf"))
    prompts = make_prompts(str(tmp_path / "prompts.jsonl"))
    run_a, save_a, run_b = str(tmp_path / "a"), str(tmp_path / "a_ckpt"), str(tmp_path / "b")
    _run(_cmd(hf, prompts, run_a, 2, ["--save", save_a, "--save-interval", "1", "--keep-last", "2"]))
    from megatron_dapo.checkpoint.dist_ckpt import read_metadata

    step1 = os.path.join(save_a, "step_000001")
    layout = read_metadata(step1)["layout"]
    assert (layout["world_size"], layout["dp"], layout["tp"]) == (2, 2, 1), layout
    out = _run(_cmd(hf, prompts, run_b, 1, ["--load", step1]))

    notes = [line for line in out.stdout.splitlines() if line.startswith("[resume] layout:")]
    assert len(notes) == 1 and "DP 2 -> 1, ranks 2 -> 1" in notes[0] and "re-derived" in notes[0], out.stdout[-3000:]
    assert "continuing after step 1" in out.stdout
    a, b = read_metrics(run_a), read_metrics(run_b)
    assert [r["step"] for r in b] == [2]
    ra, rb = _strip(a)[1], _strip(b)[0]
    for k in SAME_ROLLOUT_KEYS:
        assert ra[k] == rb[k], (k, ra[k], rb[k])
    dloss = abs(ra["pg_loss"] - rb["pg_loss"])
    wa = load_file(os.path.join(run_a, "final_hf", "model.safetensors"))
    wb = load_file(os.path.join(run_b, "final_hf", "model.safetensors"))
    assert wa.keys() == wb.keys()
    dw = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    print(f"[reshard] driver, 2 ranks (--actor-num-nodes 2) -> 1 rank: |dloss| {dloss:.2e} |dweight| {dw:.2e}")
    assert ra["grad_norm"] == pytest.approx(rb["grad_norm"], rel=1e-5)
    # step 2 is two Adam steps (lr 1e-3, clip 1.0 by default) on gradients that differ by DP 2 vs DP 1
    weight_tol = adam_weight_atol(1e-3, max(ra["grad_norm"], rb["grad_norm"]), max_abs(wa), steps=2, clip_grad=1.0)
    assert dloss <= LOSS_TOL and dw <= weight_tol, (dloss, dw, weight_tol)
