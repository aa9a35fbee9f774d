"""The evaluation driver (megatron_dapo.eval.runner) and tools/eval.py.

Scripted engines check grouping of copies, sample counts, batching, caps and exact metric
values; a tiny random Qwen2 (hidden 16, one layer, the real Qwen2 vocabulary) runs the real
HFEngine, tools/eval.py main() and the torch_dist checkpoint path.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_dapo.data.dataset import DataError
from megatron_dapo.eval.runner import (
    DAPO_TEMPLATE,
    build_prompt,
    dataset_name,
    eval_log_keys,
    evaluate,
    extract_problem,
    load_eval_problems,
)
from megatron_dapo.reward import compute_score
from megatron_dapo.rollout.base import GenerationOutput
from tests.data import DATA, qwen2_tokenizer_dir

ROOT = Path(__file__).resolve().parents[2]
SUMMARY_KEYS = {
    "avg@4",
    "pass@4",
    "maj@4",
    "pass@1",
    "response_length_mean",
    "truncation_ratio",
    "no_answer_rate",
    "timeout_rate",
    "n_problems",
    "n_samples_total",
    "samples_per_problem",
    "k",
    "prompts_truncated",
    "wall_s",
    "gen_tokens_per_s",
}
SAMPLE_KEYS = {
    "problem_id",
    "sample_index",
    "row",
    "data_source",
    "ground_truth",
    "response",
    "response_length",
    "prompt_length",
    "finish_reason",
    "score",
    "acc",
    "pred",
    "reason",
}


def _load_eval_tool():
    spec = importlib.util.spec_from_file_location("_tools_eval_under_test", ROOT / "tools" / "eval.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen2_tokenizer_dir())


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _verl_row(question, gt):
    return {
        "data_source": "toy",
        "prompt": [{"role": "user", "content": DAPO_TEMPLATE.format(problem=question)}],
        "ability": "MATH",
        "reward_model": {"ground_truth": gt, "style": "rule"},
    }


QUESTIONS = [("What is 2 + 3?", "5"), ("What is 3 + 4?", "7"), ("What is 4 + 5?", "9")]


@pytest.fixture
def copies_file(tmp_path):
    """3 problems x 4 copies, interleaved (p0 p1 p2 p0 p1 p2 ...)."""
    rows = [_verl_row(q, a) for _ in range(4) for q, a in QUESTIONS]
    return _write_jsonl(tmp_path / "toy-copies.jsonl", rows)


@pytest.fixture
def single_file(tmp_path):
    return _write_jsonl(tmp_path / "toy-single.jsonl", [_verl_row(q, a) for q, a in QUESTIONS])


class ScriptedEngine:
    """Answers problem "What is a + b?" with ``script(gt, j)`` for sample j; records calls."""

    def __init__(self, tokenizer, script, context_length=None):
        self.tok, self.script, self.calls = tokenizer, script, []
        if context_length is not None:
            self.context_length = context_length

    def generate(self, prompts, params):
        self.calls.append((len(prompts), params))
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            gt = next(a for q, a in QUESTIONS if q in text)
            group = []
            for j in range(params.n):
                resp = self.script(gt, j)
                ids = self.tok(resp, add_special_tokens=False)["input_ids"][: params.max_new_tokens]
                finish = "length" if len(ids) >= params.max_new_tokens else "stop"
                group.append(GenerationOutput(list(p), ids, [0.0] * len(ids), finish, resp))
            out.append(group)
        return out


def _script(gt, j):
    """p "5": right, right, wrong, wrong ...; p "7": always wrong; p "9": no answer."""
    if gt == "5":
        return "Answer: 5" if j < 2 else "Answer: 0"
    if gt == "7":
        return "Answer: 8"
    return "I do not know."


def test_copies_are_grouped_and_k_not_multiplied(tok, copies_file, tmp_path):
    eng = ScriptedEngine(tok, _script)
    s = evaluate(eng, tok, copies_file, k=4, scorer=compute_score, out_dir=str(tmp_path / "o"), progress=False)
    assert s["n_problems"] == 3 and s["n_samples_total"] == 12 and s["samples_per_problem"] == 4
    assert sum(n for n, _ in eng.calls) == 3  # each problem sent once ...
    assert all(p.n == 4 for _, p in eng.calls)  # ... for 4 samples, never 4 x 4
    assert s["avg@4"] == pytest.approx(0.5 / 3)
    assert s["pass@4"] == pytest.approx(1 / 3)
    assert s["maj@4"] == pytest.approx(1 / 3)  # 2-2 tie: the earlier answer ("5") wins
    assert s["no_answer_rate"] == pytest.approx(4 / 12)
    assert s["truncation_ratio"] == 0.0
    assert SUMMARY_KEYS <= set(s)
    assert all(isinstance(v, (int, float)) for v in s.values())


class RecordingScorer:
    """A scorer that sees the whole record: a row of source "judged" needs no label."""

    def __init__(self):
        self.seen = []

    def needs_label(self, data_source):
        return data_source != "judged"

    def score(self, items):
        self.seen.extend(items)
        return [
            compute_score(inp.response, inp.metadata["want"])
            if inp.data_source == "judged"
            else compute_score(inp.response, inp.label)
            for inp in items
        ]


def test_scorer_sees_prompt_source_and_metadata(tok, tmp_path):
    judged = {**_verl_row("What is 2 + 3?", ""), "data_source": "judged", "extra_info": {"want": "5"}}
    path = _write_jsonl(tmp_path / "mixed.jsonl", [judged, _verl_row("What is 3 + 4?", "7")])
    scorer = RecordingScorer()
    s = evaluate(ScriptedEngine(tok, _script), tok, path, k=2, scorer=scorer, progress=False, apply_chat_template=False)
    assert s["avg@2"] == pytest.approx(0.5)  # "5": right, wrong; "7": always wrong
    first = scorer.seen[0]
    assert (first.label, first.data_source, first.metadata) == ("", "judged", {"want": "5"})
    assert first.prompt == DAPO_TEMPLATE.format(problem="What is 2 + 3?")
    assert {(i.label, i.data_source) for i in scorer.seen[2:]} == {("7", "toy")}
    with pytest.raises(DataError, match="row 0 has no ground truth"):  # the default reward needs a label
        evaluate(ScriptedEngine(tok, _script), tok, path, k=2, scorer=compute_score, progress=False)


def test_copies_define_n_when_k_is_smaller(tok, copies_file):
    eng = ScriptedEngine(tok, _script)
    s = evaluate(eng, tok, copies_file, k=2, scorer=compute_score, progress=False)
    assert s["samples_per_problem"] == 4 and s["k"] == 2
    assert s["pass@2"] == pytest.approx((1 - 1 / 6) / 3)  # c=2 of n=4: 1 - C(2,2)/C(4,2)
    assert s["maj@2"] == pytest.approx(1 / 3)
    assert {"avg@2", "pass@2", "maj@2"} <= set(s)


def test_one_row_per_problem_and_n_samples(tok, single_file, copies_file):
    eng = ScriptedEngine(tok, _script)
    s = evaluate(eng, tok, single_file, k=3, scorer=compute_score, progress=False)
    assert s["n_samples_total"] == 9 and [p.n for _, p in eng.calls] == [3]
    eng = ScriptedEngine(tok, _script)
    s = evaluate(eng, tok, copies_file, k=4, n_samples=6, scorer=compute_score, progress=False)
    assert s["n_samples_total"] == 18 and [p.n for _, p in eng.calls] == [6]
    with pytest.raises(ValueError, match="n_samples"):
        evaluate(eng, tok, single_file, k=4, n_samples=2, scorer=compute_score, progress=False)


def test_samples_jsonl_and_summary_json(tok, copies_file, tmp_path):
    out = tmp_path / "out"
    eng = ScriptedEngine(tok, _script)
    s = evaluate(eng, tok, copies_file, k=4, scorer=compute_score, out_dir=str(out), progress=False, batch_size=8)
    lines = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 12 and all(SAMPLE_KEYS <= set(x) for x in lines)
    assert [(x["problem_id"], x["sample_index"]) for x in lines] == [(str(i), j) for i in range(3) for j in range(4)]
    first = [x for x in lines if x["problem_id"] == "0"]
    assert [x["acc"] for x in first] == [True, True, False, False]
    assert [x["pred"] for x in first] == ["5", "5", "0", "0"]
    assert {x["reason"] for x in lines if x["problem_id"] == "2"} == {"no_answer"}
    assert all(x["response_length"] == len(tok(x["response"])["input_ids"]) for x in lines)
    # batch_size=8 with 4 samples per problem: 2 problems, then 1; unseeded rows.
    assert [n for n, _ in eng.calls] == [2, 1] and {p.seed for _, p in eng.calls} == {None}
    full = json.loads((out / "summary.json").read_text())
    assert {k: full[k] for k in s} == s
    assert full["config"]["dataset_name"] == "toy-copies" and full["config"]["k"] == 4
    assert full["config"]["temperature"] == 1.0 and full["config"]["top_p"] == 0.7


def test_seed_gives_each_problem_its_own_call_and_seed(tok, copies_file):
    eng = ScriptedEngine(tok, _script)
    evaluate(eng, tok, copies_file, k=4, scorer=compute_score, progress=False, batch_size=64, seed=3)
    assert [n for n, _ in eng.calls] == [1, 1, 1] and all(p.n == 4 for _, p in eng.calls)
    assert len({p.seed for _, p in eng.calls}) == 3 and None not in {p.seed for _, p in eng.calls}
    again = ScriptedEngine(tok, _script)
    evaluate(again, tok, copies_file, k=4, scorer=compute_score, progress=False, batch_size=4, seed=3)
    assert [p.seed for _, p in again.calls] == [p.seed for _, p in eng.calls]  # batching-independent


def test_dapo_defaults_and_context_cap(tok, single_file):
    eng = ScriptedEngine(tok, _script, context_length=10_000)
    evaluate(eng, tok, single_file, k=1, scorer=compute_score, progress=False)
    plen = {len(tok(build_prompt(p, tok, "chat")[0])["input_ids"]) for p in load_eval_problems(single_file)}
    caps = sorted(p.max_new_tokens for _, p in eng.calls)
    assert caps == sorted(min(20480, 10_000 - n) for n in plen)
    assert all(p.temperature == 1.0 and p.top_p == 0.7 for _, p in eng.calls)
    eng = ScriptedEngine(tok, _script)
    evaluate(eng, tok, single_file, k=1, scorer=compute_score, progress=False, max_new_tokens=64)
    assert {p.max_new_tokens for _, p in eng.calls} == {64}
    with pytest.raises(ValueError, match="context"):
        evaluate(
            ScriptedEngine(tok, _script, context_length=20), tok, single_file, k=1, scorer=compute_score, progress=False
        )


def test_prompt_styles(tok, tmp_path):
    path = _write_jsonl(
        tmp_path / "gsm.jsonl",
        [
            {"question": "What is 2 + 3?", "answer": "2 + 3 = <<2+3=5>>5\n#### 5"},
            {"question": "What is 4 + 5?", "answer": "It is 9.\n#### 9"},
        ],
    )
    probs = load_eval_problems(path)
    assert [p.ground_truth for p in probs] == ["5", "9"] and probs[0].problem == "What is 2 + 3?"
    text, stops, prefix = build_prompt(probs[0], tok, "fewshot")
    assert text.endswith("Question: What is 2 + 3?\nSolution:") and "\n\n" in stops and prefix == ""
    text, stops, prefix = build_prompt(probs[0], tok, "fewshot-direct")
    assert text.endswith("Question: What is 2 + 3?\nAnswer:") and stops == ["\n"] and prefix == "Answer:"
    chat = build_prompt(probs[0], tok, "chat")[0]
    raw = build_prompt(probs[0], tok, "raw")[0]
    assert raw == DAPO_TEMPLATE.format(problem="What is 2 + 3?") and raw in chat and "<|im_start|>" in chat
    # fewshot-direct: the response " 5" is scored as "Answer: 5".
    eng = ScriptedEngine(tok, lambda gt, j: f" {gt}")
    s = evaluate(eng, tok, path, k=2, prompt_style="fewshot-direct", scorer=compute_score, progress=False)
    assert s["avg@2"] == 1.0 and eng.calls[0][1].stop == ["\n"]
    with pytest.raises(ValueError, match="prompt_style"):
        evaluate(eng, tok, path, k=2, prompt_style="nope", scorer=compute_score, progress=False)


def test_row_schemas_limit_and_errors(tmp_path):
    gsm = _write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "x\n#### 1,250"}])
    assert load_eval_problems(gsm)[0].ground_truth == "1250"
    amc = _write_jsonl(tmp_path / "a.jsonl", [{"id": 0, "problem": "p?", "question": "p?", "answer": 27.0}])
    p = load_eval_problems(amc)[0]
    assert p.ground_truth == "27" and p.problem == "p?" and "p?" in p.messages[0]["content"]
    rows = [_verl_row(q, a) for q, a in QUESTIONS] * 2
    many = _write_jsonl(tmp_path / "m.jsonl", rows)
    lim = load_eval_problems(many, limit=2)
    assert [x.copies for x in lim] == [2, 2] and [x.problem for x in lim] == ["What is 2 + 3?", "What is 3 + 4?"]
    assert extract_problem("plain text") == "plain text"
    same_prompt_other_gt = _write_jsonl(tmp_path / "d.jsonl", [_verl_row("q", "1"), _verl_row("q", "2")])
    assert len(load_eval_problems(same_prompt_other_gt)) == 2
    with pytest.raises(DataError, match="row 1"):
        load_eval_problems(_write_jsonl(tmp_path / "b.jsonl", [_verl_row("q", "1"), {"prompt": "q"}]))
    with pytest.raises(DataError, match="schemas"):
        load_eval_problems(_write_jsonl(tmp_path / "c.jsonl", [{"text": "q"}]))
    assert dataset_name("/x/aime-2024.parquet") == "aime-2024"
    assert eval_log_keys({"avg@4": 0.5, "n_problems": 3, "flag": True}, "aime") == {
        "eval/aime/avg@4": 0.5,
        "eval/aime/n_problems": 3,
    }


def test_real_aime_file_grouping():
    probs = load_eval_problems(str(DATA / "eval" / "aime-2024.parquet"))
    assert len(probs) == 30 and {p.copies for p in probs} == {32}
    dedup = load_eval_problems(str(DATA / "eval" / "aime-2024-dedup30.jsonl"))
    assert sorted(p.ground_truth for p in dedup) == sorted(p.ground_truth for p in probs)


# --- a tiny random Qwen2 with the real Qwen2 tokenizer ---------------------------------------
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, tok):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    d = tmp_path_factory.mktemp("tiny_qwen2")
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def test_hf_engine_tiny_model(tok, tiny_model, copies_file, tmp_path):
    from megatron_dapo.rollout.hf_engine import HFEngine

    eng = HFEngine(tiny_model, tokenizer=tok)
    outs = []
    for bs in (4, 12):
        out = tmp_path / f"bs{bs}"
        s = evaluate(
            eng,
            tok,
            copies_file,
            k=2,
            max_new_tokens=3,
            scorer=compute_score,
            seed=7,
            progress=False,
            out_dir=str(out),
            batch_size=bs,
        )
        outs.append([json.loads(x)["response"] for x in (out / "samples.jsonl").read_text().splitlines()])
    assert s["n_problems"] == 3 and s["samples_per_problem"] == 4  # the file's 4 copies
    assert s["response_length_mean"] <= 3 and 0.0 <= s["truncation_ratio"] <= 1.0
    assert s["avg@2"] == 0.0 and s["no_answer_rate"] == 1.0  # random weights never answer
    assert outs[0] == outs[1]  # seeded: the same samples whatever the batch size
    assert len(set(outs[0][0::4])) > 1  # sample 0 of different problems: different streams


def _read_out(out):
    summary = json.loads((Path(out) / "summary.json").read_text())
    samples = [json.loads(x) for x in (Path(out) / "samples.jsonl").read_text().splitlines()]
    return summary, samples


def test_tools_eval_main(tiny_model, tmp_path):
    tool = _load_eval_tool()
    data = _write_jsonl(
        tmp_path / "gsm.jsonl",
        [{"question": "What is 2 + 3?", "answer": "#### 5"}, {"question": "What is 4 + 5?", "answer": "#### 9"}],
    )
    out = tmp_path / "out"
    rc = tool.main(
        [
            "--model",
            tiny_model,
            "--data",
            data,
            "--k",
            "2",
            "--max-new-tokens",
            "3",
            "--prompt-style",
            "fewshot",
            "--engine",
            "hf",
            "--out",
            str(out),
            "--seed",
            "1",
            "--reward-workers",
            "1",
            "--no-progress",
        ]
    )
    assert rc == 0
    summary, samples = _read_out(out)
    assert summary["n_problems"] == 2 and summary["n_samples_total"] == 4 and summary["k"] == 2
    assert {"avg@2", "pass@2", "maj@2", "truncation_ratio", "no_answer_rate", "total_wall_s"} <= set(summary)
    assert summary["config"]["prompt_style"] == "fewshot" and summary["config"]["engine"] == "hf"
    assert summary["config"]["context_length"] == 1024
    assert len(samples) == 4 and all(SAMPLE_KEYS <= set(x) for x in samples)
    assert tool.model_kind(tiny_model) == "hf"
    with pytest.raises(SystemExit):
        tool.parse_args(["--model", tiny_model, "--data", data, "--seed-per-problem"])
    with pytest.raises(SystemExit):
        tool.parse_args(["--model", tiny_model, "--data", data, "--k", "4", "--n-samples", "2"])
    with pytest.raises(SystemExit):
        tool.model_kind(str(tmp_path))


@pytest.mark.slow
def test_tools_eval_torch_dist_checkpoint(tiny_model, copies_file, tmp_path):
    """A torch_dist checkpoint is converted and gives the HF directory's greedy samples."""
    ckpt = tmp_path / "ckpt"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "convert_hf_to_megatron.py"),
            "--hf-checkpoint",
            tiny_model,
            "--save",
            str(ckpt),
            "--dtype",
            "fp32",
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    tool = _load_eval_tool()
    assert tool.model_kind(str(ckpt)) == "megatron"
    common = [
        "--data",
        copies_file,
        "--k",
        "2",
        "--n-samples",
        "2",
        "--max-new-tokens",
        "3",
        "--temperature",
        "0",
        "--engine",
        "hf",
        "--reward-workers",
        "1",
        "--no-progress",
    ]
    with pytest.raises(SystemExit):  # a torch_dist checkpoint has no tokenizer
        tool.main(["--model", str(ckpt), "--out", str(tmp_path / "x")] + common)
    assert tool.main(["--model", str(ckpt), "--tokenizer", tiny_model, "--out", str(tmp_path / "m")] + common) == 0
    assert tool.main(["--model", tiny_model, "--out", str(tmp_path / "h")] + common) == 0
    (sm, m), (_, h) = _read_out(tmp_path / "m"), _read_out(tmp_path / "h")
    assert sm["config"]["context_length"] == 1024
    assert [x["response"] for x in m] == [x["response"] for x in h]


def _load_example(name):
    spec = importlib.util.spec_from_file_location(f"_demo_{name}", ROOT / "examples" / "demo" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_demo_evaluation_uses_the_eval_runner(tiny_model, tmp_path):
    """examples/demo/evaluate_demo.py: greedy, one sample per problem, stopped at the newline,
    scored by the runner's reward pool; both phases merged with the gain test."""
    make = _load_example("make_addition_data")
    heldout = _write_jsonl(tmp_path / "heldout.jsonl", [make.row(a, b) for a, b in ((11, 22), (30, 41), (15, 27))])
    demo = _load_example("evaluate_demo")
    out = tmp_path / "run" / "demo_eval.json"
    for phase in ("before", "after"):
        demo.main(["--model", tiny_model, "--data", heldout, "--n", "3", "--out", str(out), "--phase", phase])
    res = json.loads(out.read_text())
    samples = [json.loads(x) for x in (tmp_path / "run" / "demo_eval_after" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 and all("\n" not in s["response"] for s in samples)
    assert [s["ground_truth"] for s in samples] == ["33", "71", "42"]
    assert res["after"] == {**res["after"], "acc": sum(s["acc"] for s in samples) / 3, "n": 3}
    assert res["gain"] == res["after"]["acc"] - res["before"]["acc"] and "gain_over_2se" in res
    with pytest.raises(SystemExit, match="only 3 problems"):
        demo.greedy_accuracy(tiny_model, heldout, 4)
