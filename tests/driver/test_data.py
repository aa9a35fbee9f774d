"""Prompt data: verl schema, de-duplication, overflow policy, bad rows, resumable sampler, fingerprint."""

from __future__ import annotations

import json

import pytest

from megatron_dapo.data import DataError, ResumableSampler, check_fingerprint, load_prompt_dataset


class CharTok:
    """One token per character (enough to test lengths), no chat template."""

    chat_template = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 256 for c in text]}


def _write(tmp_path, rows, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


def _row(text, gt="1"):
    return {"data_source": "t", "prompt": [{"role": "user", "content": text}], "reward_model": {"ground_truth": gt}}


def test_real_dapo_and_aime_files():
    from transformers import AutoTokenizer

    from tests.data import DATA, qwen2_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(qwen2_tokenizer_dir())
    aime = load_prompt_dataset(str(DATA / "eval" / "aime-2024.parquet"), tok, 2048)
    assert len(aime) == 30 and aime.stats.duplicates_removed == 930  # 30 problems x 32 copies
    assert "Answer:" in aime[0].prompt_text and aime[0].ground_truth
    dapo = load_prompt_dataset(str(DATA / "train" / "dapo-math-17k-head16.parquet"), tok, 2048)
    assert len(dapo) == 16


def test_duplicates_overflow_and_truncation(tmp_path):
    rows = [_row("a" * 10), _row("a" * 10), _row("b" * 50), _row("c" * 5)]
    p = _write(tmp_path, rows)
    d = load_prompt_dataset(p, CharTok(), max_prompt_length=20, apply_chat_template=False)
    assert len(d) == 2 and d.stats.duplicates_removed == 1 and d.stats.skipped_long == 1
    t = load_prompt_dataset(
        p, CharTok(), max_prompt_length=20, prompt_overflow="truncate-left", apply_chat_template=False
    )
    assert len(t) == 3 and t.stats.truncated == 1 and len(t[1].prompt_ids) == 20  # kept the end of the prompt


def test_bad_rows_named_or_skipped(tmp_path):
    rows = [
        _row("ok"),
        {"prompt": [{"role": "user", "content": "x"}], "reward_model": {}},
        {"reward_model": {"ground_truth": "2"}},
    ]
    p = _write(tmp_path, rows)
    with pytest.raises(DataError, match=r"row 1 has no 'reward_model.ground_truth'"):
        load_prompt_dataset(p, CharTok(), 100, apply_chat_template=False)
    d = load_prompt_dataset(p, CharTok(), 100, apply_chat_template=False, skip_bad_rows=True)
    assert len(d) == 1 and d.stats.bad_rows == 2


def test_records_carry_source_and_metadata_and_labels_only_where_needed(tmp_path):
    rows = [
        {**_row("judge me", gt=""), "data_source": "rm", "extra_info": {"rubric": "polite"}},
        {**_row("add", gt="3"), "data_source": "math", "extra_info": {"index": 7}},
        {"data_source": "math", "prompt": "no label", "reward_model": {}},
    ]
    p = _write(tmp_path, rows)
    needs = lambda source: source != "rm"  # noqa: E731 - the reward router's answer
    with pytest.raises(DataError, match=r"row 2 has no 'reward_model.ground_truth'; the reward of data source 'math'"):
        load_prompt_dataset(p, CharTok(), 100, apply_chat_template=False, needs_label=needs)
    d = load_prompt_dataset(p, CharTok(), 100, apply_chat_template=False, needs_label=needs, skip_bad_rows=True)
    assert [(r.prompt_text, r.ground_truth, r.data_source, r.metadata) for r in d.records] == [
        ("judge me", "", "rm", {"rubric": "polite"}),
        ("add", "3", "math", {"index": 7}),
    ]
    with pytest.raises(DataError, match="row 0 has no 'reward_model.ground_truth'"):  # by default every row needs one
        load_prompt_dataset(p, CharTok(), 100, apply_chat_template=False)
    bad = _write(tmp_path, [{**_row("x"), "extra_info": "not a dict"}], "bad.jsonl")
    with pytest.raises(DataError, match="row 0 field 'extra_info' must be an object"):
        load_prompt_dataset(bad, CharTok(), 100, apply_chat_template=False)


def test_missing_and_unsupported_files(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_prompt_dataset(str(tmp_path / "nope.jsonl"), CharTok(), 10)
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported"):
        load_prompt_dataset(str(tmp_path / "x.csv"), CharTok(), 10)


def test_sampler_is_deterministic_and_resumes_exactly():
    a = ResumableSampler(10, seed=3)
    first = a.next_indices(7)
    state = a.state_dict()
    rest = a.next_indices(9)  # crosses into epoch 1
    b = ResumableSampler(10, seed=3)
    b.load_state_dict(state)
    assert b.next_indices(9) == rest
    assert sorted(first + rest[:3]) == list(range(10))  # one epoch is a permutation
    with pytest.raises(DataError, match="dataset of 10"):
        ResumableSampler(11, seed=3).load_state_dict(state)


def test_changed_dataset_refused_on_resume(tmp_path):
    p1 = _write(tmp_path, [_row("a"), _row("b")], "a.jsonl")
    p2 = _write(tmp_path, [_row("a"), _row("c")], "b.jsonl")
    f1 = load_prompt_dataset(p1, CharTok(), 10, apply_chat_template=False).fingerprint
    f2 = load_prompt_dataset(p2, CharTok(), 10, apply_chat_template=False).fingerprint
    assert f1 != f2
    with pytest.raises(DataError, match="--allow-data-change"):
        check_fingerprint(f1, f2, allow_change=False, path=p2)
    check_fingerprint(f1, f2, allow_change=True, path=p2)
    check_fingerprint(f1, f1, allow_change=False, path=p1)


def _broken_files(tmp_path):
    """Real ways a data file is unusable, each built from the real DAPO-Math sample."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.data import DATA

    good = (DATA / "train" / "dapo-math-17k-head16.parquet").read_bytes()
    files = {}
    files["empty"] = tmp_path / "empty.parquet"
    files["empty"].write_bytes(b"")
    files["truncated"] = tmp_path / "truncated.parquet"
    files["truncated"].write_bytes(good[: len(good) // 2])  # a download cut short
    files["csv"] = tmp_path / "renamed.parquet"
    files["csv"].write_text("prompt,answer\nWhat is 1+1?,2\n")  # a CSV renamed to .parquet
    files["columns"] = tmp_path / "columns.parquet"
    pq.write_table(pa.table({"question": ["What is 1+1?"], "answer": ["2"]}), files["columns"])
    files["no_rows"] = tmp_path / "no_rows.parquet"
    pq.write_table(pq.read_table(DATA / "train" / "dapo-math-17k-head16.parquet").slice(0, 0), files["no_rows"])
    files["binary"] = tmp_path / "binary.jsonl"
    files["binary"].write_bytes(good[:200])  # a parquet file renamed to .jsonl
    files["not_list"] = tmp_path / "object.json"
    files["not_list"].write_text(json.dumps({"prompt": "x"}))
    files["directory"] = tmp_path / "dir.parquet"
    files["directory"].mkdir()
    return {k: str(v) for k, v in files.items()}


def test_unusable_files_are_one_data_error_naming_the_file_and_the_fix(tmp_path):
    files = _broken_files(tmp_path)
    expect = {
        "empty": "the file is empty (0 bytes)",
        "truncated": "not a parquet file, or truncated",
        "csv": "not a parquet file, or truncated",
        "columns": "no 'prompt' column (columns: answer, question)",
        "no_rows": "the file holds no rows",
        "binary": "not a UTF-8 text file",
        "not_list": "must hold a list of rows",
        "directory": "is a directory",
    }
    for kind, path in files.items():
        with pytest.raises(DataError) as e:
            load_prompt_dataset(path, CharTok(), 100, apply_chat_template=False)
        msg = str(e.value)
        assert msg.startswith(path + ": ") and expect[kind] in msg and "\n" not in msg, (kind, msg)
        if kind in ("empty", "truncated", "csv", "binary"):
            assert "re-download or re-export it" in msg, msg


def test_identical_rows_are_rendered_once_and_the_result_is_unchanged(tmp_path):
    """The raw-row de-duplication skips rendering repeats; the records and fingerprint are those of
    de-duplication by rendered text (the real AIME file: 30 problems x 32 copies)."""
    from transformers import AutoTokenizer

    from tests.data import DATA, qwen2_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(qwen2_tokenizer_dir())
    calls = []

    class Counting:
        chat_template = tok.chat_template

        def apply_chat_template(self, *a, **k):
            calls.append(1)
            return tok.apply_chat_template(*a, **k)

        def __call__(self, *a, **k):
            return tok(*a, **k)

    path = str(DATA / "eval" / "aime-2024.parquet")
    d = load_prompt_dataset(path, Counting(), 2048)
    assert len(d) == 30 and d.stats.duplicates_removed == 930 and len(calls) == 30
    # the same records, in the same order, as rendering every row (the fingerprint hashes them)
    import hashlib

    from megatron_dapo.data import read_rows, render_prompt

    seen, h, texts = set(), hashlib.sha256(), []
    for row in read_rows(path):
        text = render_prompt(row["prompt"], tok, True)
        gt = row["reward_model"]["ground_truth"]
        if (text, gt) in seen:
            continue
        seen.add((text, gt))
        texts.append(text)
        h.update(text.encode() + b"\0" + str(gt).encode() + b"\1")
    assert [r.prompt_text for r in d.records] == texts and d.fingerprint == h.hexdigest()[:16]


def test_chat_api_rows_and_labels_that_are_not_strings(tmp_path):
    """Issue 38: content written as a list of parts (text joined; any other part refused by its
    type), null or empty content refused, a label that is a number kept as written, one that is
    a list, a boolean or NaN refused (``Answer: True`` must not score +1), each naming the row."""
    parts = {"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "2 + 3?"}]}
    ok = [
        {"prompt": [parts], "reward_model": {"ground_truth": "5"}},
        {"prompt": [{"role": "user", "content": "forty-two"}], "reward_model": {"ground_truth": 42}},
        {"prompt": [{"role": "user", "content": "half"}], "reward_model": {"ground_truth": 0.5}},
    ]
    d = load_prompt_dataset(_write(tmp_path, ok), CharTok(), 100, apply_chat_template=False)
    assert [r.prompt_text for r in d.records] == ["What is\n2 + 3?", "forty-two", "half"]
    assert [r.ground_truth for r in d.records] == ["5", "42", "0.5"]

    image = {"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {}}]}
    bad = [
        (
            {"prompt": [image], "reward_model": {"ground_truth": "1"}},
            "message 0 has a content part of type 'image_url'",
        ),
        (
            {"prompt": [{"role": "user", "content": None}], "reward_model": {"ground_truth": "1"}},
            "no text content (null)",
        ),
        (
            {"prompt": [{"role": "user", "content": " "}], "reward_model": {"ground_truth": "1"}},
            "no text content (empty)",
        ),
        ({"prompt": "   ", "reward_model": {"ground_truth": "1"}}, "has no 'prompt'"),
        (_row("a", [1, 2]), "must be a string or a finite number, got list [1, 2]"),
        (_row("b", True), "got bool True"),
        (_row("c", float("nan")), "got float nan"),
        (_row("d", {"x": 1}), "got dict"),
    ]
    for row, needle in bad:
        p = _write(tmp_path, [_row("fine"), row], name="bad.jsonl")
        with pytest.raises(DataError) as e:
            load_prompt_dataset(p, CharTok(), 100, apply_chat_template=False)
        msg = str(e.value)
        assert "\n" not in msg and "bad.jsonl: row 1 " in msg and needle in msg, (needle, msg)
        d = load_prompt_dataset(p, CharTok(), 100, apply_chat_template=False, skip_bad_rows=True)
        assert len(d) == 1 and d.stats.bad_rows == 1
