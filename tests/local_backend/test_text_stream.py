"""Incremental detokenization with stop strings, against the real byte-level BPE tokenizer."""
from __future__ import annotations

from conftest import SPECIALS, bpe_tokenizer

from local_backend.text_stream import TextStream

TOK = bpe_tokenizer(SPECIALS["qwen3"], None)


def decode(ids):
    return TOK.decode(ids, skip_special_tokens=True)


def run(ids, stops, context=()):
    stream = TextStream(decode, stops, list(context))
    pieces = [stream.push(t) for t in ids]
    if not stream.stopped:
        pieces.append(stream.flush())
    return pieces, stream.stopped


def test_without_stops_the_pieces_are_the_decoded_text():
    ids = TOK.encode("Café, naïve 😀 日本語 and the lazy dog.").ids
    pieces, stopped = run(ids, [])
    assert "".join(pieces) == decode(ids) and not stopped
    assert all("\ufffd" not in p for p in pieces)   # multi-byte characters arrive whole


def test_a_multibyte_character_split_over_byte_tokens_arrives_whole():
    byte_ids = [TOK.token_to_id(ch) for ch in "ðŁĺĢ"]   # the four byte tokens of 😀
    assert None not in byte_ids
    pieces, _ = run(byte_ids, [])
    assert pieces == ["", "", "", "😀", ""]


def test_an_unfinished_character_is_flushed_as_a_full_decode_would():
    ids = TOK.encode("ok").ids + [TOK.token_to_id("ð")]
    pieces, _ = run(ids, [])
    assert "".join(pieces) == decode(ids) == "ok\ufffd"


def test_stop_string_spanning_tokens_is_cut_and_held_back_text_never_leaks():
    text = "The quick brown fox jumps over the lazy dog."
    ids = TOK.encode(text).ids
    # Pick a stop that starts inside one token and ends inside a later one.
    ends = [len(decode(ids[:i + 1])) for i in range(len(ids))]
    multi = next(i for i in range(1, len(ids)) if ends[i] - ends[i - 1] >= 2 and ends[i + 1] - ends[i] >= 2)
    stop = text[ends[multi] - 1:ends[multi] + 1]
    assert stop not in text[:ends[multi] - 1]
    pieces, stopped = run(ids, ["never there", stop])
    assert stopped and "".join(pieces) == text[:text.index(stop)]


def test_earliest_of_several_stops_wins_and_later_tokens_are_ignored():
    stream = TextStream(decode, ["dog", "quick"])
    out = "".join(stream.push(t) for t in TOK.encode("The quick brown dog").ids)
    assert out == "The " and stream.stopped
    assert stream.push(TOK.encode("x").ids[0]) == "" and stream.flush() == ""


def test_context_tokens_are_not_emitted():
    prompt = TOK.encode("hello there").ids
    ids = TOK.encode(" how are you").ids
    pieces, _ = run(ids, [], context=prompt)
    assert "".join(pieces) == " how are you"
