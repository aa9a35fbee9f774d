"""Repetition-loop detection and repetition_rate."""

import numpy as np
import pytest
import torch

from megatron_dapo.diagnostics import find_repetition_loop, has_repetition_loop, repetition_rate


def varied(n, seed=0, vocab=50_000):
    """Token ids without any back-to-back repeat structure."""
    return np.random.default_rng(seed).integers(0, vocab, size=n).tolist()


def test_no_loop_in_ordinary_text():
    assert not has_repetition_loop([])
    assert not has_repetition_loop([7])
    assert not has_repetition_loop(varied(3000))
    assert not has_repetition_loop(list(range(2000)))


def test_single_token_loop_needs_min_span():
    base = varied(200)
    assert has_repetition_loop(base + [5] * 64)
    assert not has_repetition_loop(base + [5] * 63)  # 63 < min_span
    assert not has_repetition_loop(base + [0] * 6 + varied(50, 1))  # "000000" in a number


def test_sentence_loop_until_truncation():
    sentence = varied(23, seed=3)
    tokens = varied(500) + sentence * 10
    n, start, repeats = find_repetition_loop(tokens)
    assert n == 23 and repeats == 10 and start == 500
    assert has_repetition_loop(varied(500) + sentence * 4)
    assert not has_repetition_loop(varied(500) + sentence * 3)  # 3 < min_repeats
    # a loop followed by a few trailing tokens (e.g. a final partial copy) is still found
    assert has_repetition_loop(varied(500) + sentence * 6 + sentence[:7])


def test_short_ngram_needs_more_repeats():
    pair = [11, 12]
    assert not has_repetition_loop(varied(100) + pair * 10 + varied(100, 1))  # span 20 < 64
    assert has_repetition_loop(varied(100) + pair * 32 + varied(100, 1))  # span 64


def test_only_the_tail_is_examined():
    loop = [1, 2, 3, 4, 5, 6, 7, 8] * 20
    early_loop = varied(100) + loop + varied(2000, 1)
    assert not has_repetition_loop(early_loop)
    assert has_repetition_loop(early_loop, tail=None)
    assert has_repetition_loop(early_loop, tail=3000)


def test_parameters():
    tokens = varied(100) + [9, 8, 7] * 5 + varied(100, 1)
    assert not has_repetition_loop(tokens)
    assert has_repetition_loop(tokens, min_span=15, min_repeats=5)
    assert not has_repetition_loop(tokens, min_span=15, min_repeats=6)
    assert not has_repetition_loop(tokens, ngram=2, min_span=15, min_repeats=5)  # 3-gram excluded
    with pytest.raises(ValueError):
        has_repetition_loop(tokens, min_repeats=1)
    with pytest.raises(ValueError):
        has_repetition_loop(tokens, ngram=0)


def test_accepts_arrays_and_tensors():
    tokens = varied(100) + [3, 4, 5, 6] * 20
    assert has_repetition_loop(np.array(tokens))
    assert has_repetition_loop(torch.tensor(tokens))
    assert has_repetition_loop(tuple(tokens))


def test_repetition_rate():
    loop = varied(50) + [1, 2, 3, 4, 5, 6, 7, 8, 9, 10] * 8
    ok = varied(300, 4)
    assert repetition_rate([]) == 0.0
    assert repetition_rate([ok, ok, loop, ok]) == 0.25
    assert repetition_rate([loop] * 3) == 1.0
    assert repetition_rate(iter([ok, loop])) == 0.5
    assert repetition_rate([ok, loop], min_repeats=9) == 0.0
