import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.apis import SURFACES
from gateway.strategies.vote import (
    Ballot,
    ballot,
    decide,
    extractor_from_dict,
    group_of,
    normalize,
)


# ---------------------------------------------------------------- normalization

@pytest.mark.parametrize("a, b", [
    ('{"b": 1, "a": [1.0, 2]}', '{"a":[1,2],"b":1}'),
    ("  42\n", "42.0"),
    ('```json\n{"x": true}\n```', '{ "x" : true }'),
    ("```\n[1, 2]\n```", "[1,2]"),
    ("  Paris.  \n", "Paris."),
])
def test_equal_answers_normalize_equal(a, b):
    assert normalize(a) == normalize(b)


@pytest.mark.parametrize("a, b", [
    ('{"a": 1}', '{"a": 2}'),
    ("Paris", "paris"),
    ('"1"', "1"),
    ("[1, 2]", "[2, 1]"),
])
def test_different_answers_normalize_different(a, b):
    assert normalize(a) != normalize(b)


def test_regex_extractor_prefers_the_answer_group_then_group_one_then_the_match():
    named = extractor_from_dict({"regex": r"(?s)reasoning:.*?answer:\s*(?P<answer>\w+)"})
    assert normalize("reasoning: long...\nanswer: B", named) == normalize("reasoning: other\nanswer:  B", named) == "B"
    first = extractor_from_dict({"regex": r"final=(\d+)"})
    assert normalize("blah final=7 blah", first) == "7"
    whole = extractor_from_dict({"regex": r"\d+"})
    assert normalize("it is 12 apples", whole) == "12"


def test_json_pointer_extractor_compares_one_field():
    extractor = extractor_from_dict({"json_pointer": "/answer/0"})
    a = normalize('{"reasoning": "x", "answer": [3, "m"]}', extractor)
    b = normalize('```json\n{"answer": [3.0], "reasoning": "entirely different"}\n```', extractor)
    assert a == b == "3"
    slashes = extractor_from_dict({"json_pointer": "/a~1b/c~0d"})
    assert normalize('{"a/b": {"c~d": {"z": 1, "y": 2}}}', slashes) == '{"y":2,"z":1}'


def test_an_answer_the_extractor_cannot_read_falls_back_to_the_whole_answer():
    regex = extractor_from_dict({"regex": r"answer: (\w+)"})
    assert normalize(" no answer here ", regex) == "no answer here"
    pointer = extractor_from_dict({"json_pointer": "/missing"})
    assert normalize('{"b": 1, "a": 2}', pointer) == '{"a":2,"b":1}'
    assert normalize("not json", pointer) == "not json"
    assert normalize("[1]", extractor_from_dict({"json_pointer": "/01"})) == "[1]"


@pytest.mark.parametrize("spec", [{}, {"regex": "("}, {"regex": "a", "json_pointer": "/a"},
                                  {"json_pointer": "a"}, {"jsonpath": "$.a"}, {"regex": 5}])
def test_bad_extractor_specs_are_refused(spec):
    with pytest.raises(ValueError):
        extractor_from_dict(spec)


def test_groups_are_digests_of_the_normalized_form():
    assert ballot(1, '{"a":1}').group == ballot(2, ' { "a" : 1.0 } ').group == group_of('{"a":1}')
    assert len(group_of("x")) == 32


answer_text = SURFACES["chat.completions"].answer_text


def test_answer_text_reads_chat_text_and_tool_calls():
    assert answer_text({"choices": [{"message": {"content": "hi"}}]}) == "hi"
    assert SURFACES["completions"].answer_text({"choices": [{"text": "done"}]}) == "done"
    call = lambda args: {"choices": [{"message": {"content": None, "tool_calls": [
        {"id": "random-id", "type": "function", "function": {"name": "f", "arguments": args}}]}}]}
    assert answer_text(call('{"b": 2, "a": 1}')) == answer_text(call('{"a":1,"b":2.0}'))
    assert answer_text(call("{broken")) == '[{"arguments":"{broken","name":"f"}]'
    assert answer_text({"choices": []}) == "" and answer_text({}) == ""


@pytest.mark.parametrize("response", [
    {"choices": None}, {"choices": [None]}, {"choices": [{"message": "hi"}]},
    {"choices": [{"message": {"tool_calls": [None, {"function": 3}]}}]},
    {"choices": [{"message": {"tool_calls": "f()"}}]},
])
def test_answer_text_never_raises_on_a_malformed_upstream_response(response):
    assert isinstance(answer_text(response), str)


# ---------------------------------------------------------------- deciding

def B(seed, group):
    return Ballot(seed, group)


def test_k3_two_that_agree_settle_it():
    assert decide([B(0, "a")], 3) is None
    assert decide([B(0, "a"), B(1, "b")], 3) is None
    vote = decide([B(2, "a"), B(0, "a")], 3)
    assert vote.winner == B(0, "a") and vote.header() == "2/3" and vote.cast == 2 and not vote.tie_break


def test_all_disagree_the_lowest_seed_wins():
    vote = decide([B(12, "c"), B(10, "b"), B(11, "a")], 3)
    assert vote.winner == B(10, "b") and vote.tie_break and vote.header() == "1/3"
    assert vote.counts == (("b", 1), ("a", 1), ("c", 1))


def test_even_split_largest_groups_tie_on_lowest_seed():
    vote = decide([B(1, "x"), B(3, "x"), B(0, "y"), B(2, "y")], 4)
    assert vote.winner == B(0, "y") and vote.tie_break


def test_plurality_that_cannot_be_caught_is_certain_before_a_majority():
    assert decide([B(0, "a"), B(1, "a"), B(2, "b"), B(3, "c")], 5) is None
    vote = decide([B(0, "a"), B(1, "a"), B(2, "b"), B(3, "c"), B(4, "d")], 5)
    assert vote.winner.group == "a" and vote.votes == 2 and not vote.tie_break
    assert decide([B(0, "a"), B(1, "a"), B(2, "a")], 5).header() == "3/5"


def test_k1_takes_the_only_answer():
    assert decide([B(7, "z")], 1).winner == B(7, "z")


def test_record_is_json_ready():
    vote = decide([B(0, "a"), B(1, "b"), B(2, "a")], 3)
    assert vote.record() == {"votes": "2/3", "k": 3, "cast": 3, "seed": 0, "tie_break": False,
                             "groups": [["a", 2], ["b", 1]]}


def test_bad_arguments():
    with pytest.raises(ValueError):
        decide([], 0)
    with pytest.raises(ValueError):
        decide([B(0, "a"), B(1, "a")], 1)
    assert decide([], 3) is None


groups = st.sampled_from("abcd")


@st.composite
def full_vote(draw):
    k = draw(st.integers(1, 7))
    labels = draw(st.lists(groups, min_size=k, max_size=k))
    order = draw(st.permutations(range(k)))
    return k, [B(100 + i, labels[i]) for i in order]


@settings(max_examples=300, deadline=None)
@given(full_vote(), st.randoms(use_true_random=False))
def test_outcome_never_depends_on_arrival_order(vote, rng):
    k, ballots = vote
    shuffled = list(ballots)
    rng.shuffle(shuffled)
    assert decide(ballots, k) == decide(shuffled, k)


@settings(max_examples=300, deadline=None)
@given(full_vote())
def test_an_early_decision_is_the_decision_all_k_would_make(vote):
    k, arrivals = vote
    final = decide(arrivals, k)
    assert final is not None
    early = next(v for n in range(1, k + 1) if (v := decide(arrivals[:n], k)) is not None)
    assert early.winner.group == final.winner.group
    if not early.tie_break:
        majority_or_lead = [c for _, c in final.counts]
        assert majority_or_lead[0] > (majority_or_lead[1] if len(majority_or_lead) > 1 else 0)


@settings(max_examples=200, deadline=None)
@given(full_vote())
def test_a_strict_majority_always_wins(vote):
    k, ballots = vote
    counts = {}
    for b in ballots:
        counts[b.group] = counts.get(b.group, 0) + 1
    top = max(counts, key=counts.get)
    if counts[top] > k // 2:
        assert decide(ballots, k).winner.group == top
