"""Incremental detokenization on the shipped tokenizer: a character split across streamed tokens comes out whole,
and the streamed pieces joined equal the one-shot decode."""

from __future__ import annotations

import random

import pytest

from tests.conftest import smollm2_tokenizer_dir
from trtpipe_runtime.detokenize import REPLACEMENT, IncrementalDetokenizer, StopMatcher, Utf8Joiner, decode_stream

TEXTS = ["北京是中国的首都，上海是最大的城市。", "Ça va très bien, merci ! Señor Müller.", "Family: 👨‍👩‍👧‍👦 and 🎉🚀",
         "日本語のテキスト、한국어 텍스트, Ελληνικά, русский"]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir(), local_files_only=True)


def _batch_decode(tokenizer):
    return lambda windows: tokenizer.batch_decode(windows, skip_special_tokens=True)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 2, 3, "random"])
def test_streamed_pieces_join_to_the_one_shot_decode_and_split_no_character(tokenizer, text, chunk):
    ids = tokenizer.encode(text, add_special_tokens=False)
    rng = random.Random(len(text))
    chunks, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 4) if chunk == "random" else chunk
        chunks.append(ids[i:i + n])
        i += n
    naive = [tokenizer.decode(c) for c in chunks]
    if chunk == 1:  # the precondition: this text really spans tokens mid-character in this vocabulary
        assert any(REPLACEMENT in piece for piece in naive), text
    pieces = decode_stream(_batch_decode(tokenizer), chunks)
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert not any(REPLACEMENT in p for p in pieces)


def test_only_the_incomplete_character_waits_and_a_cut_one_is_never_sent(tokenizer):
    head = tokenizer.encode("Hi ", add_special_tokens=False)
    ids = tokenizer.encode("好", add_special_tokens=False)
    assert len(ids) > 1 and REPLACEMENT in tokenizer.decode(ids[:1])
    detok = IncrementalDetokenizer(_batch_decode(tokenizer))
    assert detok.push(head + ids[:1]) == "Hi " and detok.pending == 1  # the text before it goes at once
    assert detok.push(ids[1:]) == "好" and detok.pending == 0
    cut = IncrementalDetokenizer(_batch_decode(tokenizer))  # one response whose last character max_tokens cut
    assert cut.push(head + ids[:1]) == "Hi "


def test_special_tokens_the_tokenizer_skips_add_nothing(tokenizer):
    eos = tokenizer.eos_token_id
    ids = tokenizer.encode("Hi 你好", add_special_tokens=False)
    pieces = decode_stream(_batch_decode(tokenizer), [[i] for i in ids] + [[eos]])
    assert "".join(pieces) == "Hi 你好"


def test_the_utf8_joiner_holds_a_split_character_until_its_last_byte():
    data = "é好🎉".encode()
    joiner = Utf8Joiner()
    out = [joiner.push(data[i:i + 1]) for i in range(len(data))]
    assert "".join(out) + joiner.flush() == "é好🎉"
    assert all(REPLACEMENT not in o for o in out)
    assert Utf8Joiner().push(b"\xe5\xa5") == ""
    cut = Utf8Joiner()
    cut.push(b"\xe5\xa5")
    assert cut.flush() == REPLACEMENT


@pytest.mark.parametrize("pieces, stops, sent", [
    (["Hello wor", "ld. Bye"], ["world"], "Hello "),  # across pieces
    (["a", "b", "S", "T", "O", "P", "c"], ["STOP"], "ab"),  # one character a piece
    (["Paris is the capital.\n\nQuestion:"], ["\n\n", "Question"], "Paris is the capital."),  # the first of two
    (["no stop here"], ["xyz"], "no stop here"),  # nothing held back at the end
    (["北京。", "上海"], ["上"], "北京。"),
])
def test_stop_strings_match_on_the_text_and_are_left_out(pieces, stops, sent):
    m = StopMatcher(stops)
    out = "".join(m.push(p) for p in pieces) + m.flush()
    assert out == sent
    assert m.stopped == (sent != "".join(pieces))


def test_bytes_held_back_that_the_next_ids_do_not_complete_are_dropped(tokenizer):
    """A stream cut inside a character holds its first bytes; ids that do not complete it (the next request of a
    client that reuses its request id, in the postprocessing model) start the text again, without U+FFFD."""
    cut = tokenizer.encode("好", add_special_tokens=False)[:1]
    hello = tokenizer.encode("Hello 世界", add_special_tokens=False)
    detok = IncrementalDetokenizer(_batch_decode(tokenizer))
    assert detok.push(tokenizer.encode("Hi ", add_special_tokens=False) + cut) == "Hi "
    assert detok.pending == 1
    assert detok.push(hello[:2]) + detok.push(hello[2:]) == "Hello 世界"
