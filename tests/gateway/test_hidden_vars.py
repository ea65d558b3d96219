import base64
import datetime as dt
import random
import tomllib
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gateway.policy.hidden_vars as hv
from gateway.apis import SURFACES
from gateway.policy.hidden_vars import find, scan, warning
from gateway.policy.key_rules import KeyRule, apply

NOW_DT = dt.datetime(2026, 11, 22, 16, 17, 30, tzinfo=dt.timezone.utc)
NOW = NOW_DT.timestamp()


def kinds(text, now=NOW):
    return [f.kind for f in find(text, now)]


@pytest.mark.parametrize("text, kind", [
    ("Current time: 2026-11-22T16:17:30Z.", "datetime"),
    ("now=2026-11-22 16:17:30.123456+00:00", "datetime"),
    ("as of 2026-11-21T23:59", "datetime"),
    ("Today is 2026-11-22.", "date"),
    ("Date: 2026/11/22", "date"),
    ("Heute ist der 22.11.2026", "date"),
    ("today (11/22/2026)", "date"),
    ("Today is Sunday, November 22, 2026.", "date"),
    ("Today is Nov. 23rd, 2026", "date"),
    ("It is the 22nd of November 2026", "date"),
    ("Date: Sun, 22 Nov 2026 16:17:30 GMT", "date"),
    ("ts=1795364250", "epoch"),
    ("ts=1795364250.734", "epoch"),
    ("ms 1795364250123", "epoch"),
    ("us 1795364250123456", "epoch"),
    ("ns 1795364250123456789", "epoch"),
    ("request 3f2b8c1e-9a4d-4c2b-8f1e-2b3c4d5e6f70 started", "uuid"),
    ("trace id 9F86D081884C7D659A2FEAA0C55AD015", "hex_id"),
    ("nonce: 4b1a9c0e7d2f8a31", "hex_id"),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9", "token_id"),
    ("req_8Xk2LpQ9zR4mTw7vYb1N", "token_id"),
])
def test_each_kind_is_found(text, kind):
    assert kinds(text) == [kind]


def test_span_covers_exactly_the_value():
    text = "id=3f2b8c1e-9a4d-4c2b-8f1e-2b3c4d5e6f70;"
    [f] = find(text, NOW)
    assert text[f.start:f.end] == "3f2b8c1e-9a4d-4c2b-8f1e-2b3c4d5e6f70"


def test_findings_are_in_text_order_and_never_overlap():
    text = "at 2026-11-22 16:17 (2026-11-22) id 9f86d081884c7d659a2feaa0c55ad015 t=1795364250"
    found = find(text, NOW)
    assert [f.kind for f in found] == ["datetime", "date", "hex_id", "epoch"]
    assert all(a.end <= b.start for a, b in zip(found, found[1:]))


ORDINARY = [
    "The Treaty of Versailles was signed on 28 June 1919, and the Berlin Wall fell on 1989-11-09.",
    "Apollo 11 landed on July 20, 1969 at 20:17:40 UTC.",
    "Release v2.13.0 (build 20240115) fixes CVE-2024-3094; see PEP 8 and RFC 9110.",
    "Call me at 415 555 1234 or +44 20 7946 0958; my account number is 0123456789.",
    "The ISBN is 0306406152 and the price went from $1,299.99 to 1299.00 EUR.",
    "Use XMLHttpRequest2Factory or getUserById in src/components/UserProfile2Card.tsx.",
    "Call getUserByIdAndEmail2Async from MyComponent2WithLongName via XMLHttpRequest2FactoryBean.",
    "Meet at 14:05:33 sharp; the race lasted 02:11:09 and the timer read 00:00:30.",
    "state-of-the-art-2024-model, gpt-4o-2024-08-06, llama-3.1-8b-instruct, Qwen2.5-72B",
    "Colors: #ff8800 and #00ff00; sizes 1920x1080, 3840x2160; deadbeefcafebabe is a classic.",
    "Pi is 3.14159265358979323846 and e is 2.71828182845904523536.",
    "SELECT id, created_at FROM orders WHERE total > 100 ORDER BY created_at DESC LIMIT 10;",
    "Bonjour, ça va ? Grüße aus München. 東京は晴れです。Привет, мир!",
    "The meeting moved from 3/4/2021 to 12/05/2019, and the deadline is Q3 2031.",
    "Chapter 12, verse 1776; population 8,100,000,000 and 1 000 000 000 people.",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_has_no_findings(text):
    assert find(text, NOW) == []


def test_dates_far_from_now_are_content_but_near_now_they_are_clocks():
    assert kinds("Today is 2026-11-22.", now=NOW + 30 * 86_400) == []
    assert kinds("Yesterday was 2026-11-21.") == ["date"]
    assert kinds("2026-11-19") == []


def test_impossible_dates_are_ignored():
    assert find("2026-02-30 and 31.04.2026 and 2026-13-01", NOW) == []


def test_measured_detection_rate_of_random_ids():
    rng = random.Random(7)
    samples = {
        "uuid": [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(500)],
        "hex_id": [rng.getrandbits(128).to_bytes(16, "big").hex() for _ in range(500)],
        "token_id": [base64.urlsafe_b64encode(rng.randbytes(24)).decode() for _ in range(500)],
    }
    for kind, tokens in samples.items():
        hits = sum(kinds(f"request {t} done") == [kind] for t in tokens)
        assert hits / len(tokens) >= 0.95, (kind, hits)


@settings(max_examples=100, deadline=None)
@given(st.integers(-86_000, 86_000), st.sampled_from([1, 1000, 10**6]))
def test_epochs_near_now_are_found_in_any_unit(offset, scale):
    assert kinds(f"t={(int(NOW) + offset) * scale}") == ["epoch"]


@settings(max_examples=100, deadline=None)
@given(st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2100, 1, 1)))
def test_iso_timestamps_are_flagged_exactly_when_near_now(moment):
    near = abs((moment.date() - NOW_DT.date()).days) <= 1
    assert kinds(f"at {moment.isoformat(timespec='seconds')}Z") == (["datetime"] if near else [])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(
    "the of and to in is was for on that with as by at from it this be are an or not have "
    "model answer question data 42 7 2019 3.5 x, y. (a) - : ;".split()), max_size=40))
def test_prose_made_of_words_and_small_numbers_is_never_flagged(words):
    assert find(" ".join(words), NOW) == []


def keyed(route, body):
    """What the key is signed over for `body`: the tree the gateway scans."""
    return SURFACES[route].canonical(body, True).key


def test_scan_walks_the_whole_keyed_body_with_paths():
    body = {"model": "m", "messages": [
        {"role": "system", "content": "Current date: 2026-11-22"},
        {"role": "user", "content": [{"type": "text", "text": "hi"},
                                     {"type": "text", "text": "rid 4b1a9c0e7d2f8a31"}]},
    ], "x_trace": {"started_ms": 1795364250123, "run": "3f2b8c1e-9a4d-4c2b-8f1e-2b3c4d5e6f70"}}
    assert [(f.kind, f.start, f.end, f.path) for f in scan(keyed("chat.completions", body), NOW)] == [
        ("date", 14, 24, "messages[0].content"),
        ("hex_id", 4, 20, "messages[1].content[1].text"),
        ("epoch", 0, 13, "x_trace.started_ms"),  # a JSON number
        ("uuid", 0, 36, "x_trace.run"),
    ]
    assert [f.path for f in scan(keyed("completions", {"model": "m", "prompt": ["a", "t=1795364250"]}), NOW)] == \
        ["prompt[1]"]
    assert [f.path for f in scan(keyed("embeddings", {"model": "m", "input": "2026-11-22"}), NOW)] == ["input"]
    assert scan(keyed("chat.completions", {"model": "m", "messages": "not a list"}), NOW) == []


def test_tool_outputs_are_scanned_but_what_the_upstream_said_earlier_is_not():
    surface = SURFACES["messages"]
    body = {"model": "m", "max_tokens": 9, "messages": [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": [{"type": "text", "text": "at 2026-11-22"},
                                          {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "Bash",
                                           "input": {"command": "date +%s%N"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
                                      "content": "1795364250902660121"}]},
    ]}
    found = scan(keyed("messages", body), NOW, surface.resent)
    assert [(f.kind, f.path) for f in found] == [("epoch", "messages[2].content[0].content")]
    codex = {"model": "m", "input": [
        {"type": "custom_tool_call", "call_id": "call_AbC1dEf2GhI3jKl4MnO5pQr6", "name": "exec", "input": "x"},
        {"type": "custom_tool_call_output", "call_id": "call_AbC1dEf2GhI3jKl4MnO5pQr6",
         "output": [{"type": "input_text", "text": "done at 2026-11-22T16:00:00Z"}]},
        {"type": "reasoning", "id": "rs_AbC1dEf2GhI3jKl4MnO5pQr6", "encrypted_content": "gAAAAbC1dEf2GhI3jKl4MnO5pQr6"}]}
    found = scan(keyed("responses", codex), NOW, SURFACES["responses"].resent)
    assert [(f.kind, f.path) for f in found] == [("datetime", "input[1].output")]


def test_blobs_are_data_not_hidden_variables():
    image = "data:image/png;base64," + base64.b64encode(random.Random(1).randbytes(300)).decode()
    signature = base64.b64encode(random.Random(2).randbytes(300)).decode()
    assert scan({"url": image, "signature": signature}, NOW) == []
    assert [f.kind for f in scan({"signature": signature[:40]}, NOW)] == ["token_id"]


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": "# currentDate\nToday's date is 2026-11-22.\n"}]},
    {"input": [{"role": "user", "content": "<current_date>2026-11-22</current_date>"}]},
    {"client": {"turn_started_at_unix_ms": 1795364250123}},
    {"items": [{"id": "msg_3f2b8c1e-9a4d-4c2b-8f1e-2b3c4d5e6f70"}, {"id": "msg_4b1a9c0e-7d2f-4a31-8f1e-2b3c4d5e6f70"}]},
    {"log": "started 22 November 2026 at noon, run eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"},
])
def test_the_suggested_key_rule_parses_and_leaves_what_it_names_out(body):
    found = scan(body, NOW)
    line = warning(found)
    assert line.isascii() and "\n" not in line
    suggested = tomllib.loads(line.split("leaves the first out: ", 1)[1])["key_rules"]
    rule = KeyRule(**suggested[0])
    cleaned, fired = apply(body, (rule,))
    assert fired == (rule,)
    assert not [f for f in scan(cleaned, NOW) if (f.path, f.kind) == (found[0].path, found[0].kind)]


def test_warning_is_one_ascii_line_naming_kinds_and_places():
    assert warning([]) is None
    found = scan(keyed("chat.completions", {"model": "m", "messages": [
        {"role": "user", "content": "id 4b1a9c0e7d2f8a31 at 2026-11-22T10:00:00Z"}],
        "x_ids": ["3f2b8c1e-9a4d-4c2b-8f1e-2b3c4d5e6f70"] * 5, "x\u00e9\n\"": "4b1a9c0e7d2f8a31"}), NOW)
    line = warning(found)
    assert line.isascii() and "\n" not in line and line.isprintable()
    assert "datetime, uuid, hex_id" in line and "first at messages[0].content[3:19]" in line
    assert "also at x_ids[0], x_ids[1], x_ids[2] and 3 more" in line  # each path named, the list cut short
    assert "key_rules = [{name = " in line


def _unwindowed(text):
    # The same detectors over the whole text: what searching only near digits must equal.
    found = [*hv._dates(text, NOW, hv.DEFAULT_WINDOW_S), *hv._epochs(text, NOW, hv.DEFAULT_WINDOW_S),
             *hv._ids(text)]
    found.sort(key=lambda f: (hv.KINDS.index(f.kind), f.start))
    kept = []
    for f in found:
        if all(f.end <= k.start or f.start >= k.end for k in kept):
            kept.append(f)
    return sorted(kept, key=lambda f: f.start)


fragments = st.sampled_from([
    "3f2b8c1e-9a4d-4c2b-8f1e-2b3c4d5e6f70", "4b1a9c0e7d2f8a31", "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9",
    "2026-11-22", "2026-11-22T16:17:30Z", "November", "22nd", "of", "2026", "1795364250", "Nov.",
    "the", "quarterly", "report", "x" * 40, "a1" * 30, "AbC1dEf2GhI3jKl4MnO5pQr6StU7vWx8", "=", "/", "-",
    "Sunday, November 22, 2026", "the 22nd of November 2026",
    # Digits only far from the start: a window must widen back to the token's beginning.
    "aBcDeFgHiJkLmNoPqRsTuVwXyZaBcDeFgHiJ1", "abcdefabcdefabcdefabcdefabcdefabcdef12",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(fragments, st.sampled_from(["", " ", "\n", ", ", "\t"])), max_size=25))
def test_searching_near_digits_finds_what_a_full_search_finds(parts):
    text = "".join(f + sep for f, sep in parts)
    assert find(text, NOW) == _unwindowed(text)
