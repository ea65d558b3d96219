"""Majority vote through the gateway, with the official openai client over loopback HTTP."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import orjson
import pytest

from fakes.noisy_upstream import NoisyUpstream
from gw_http import SECRET, client, post
from noisy_gw import ANSWER, QUESTION, metric, noisy_gateway

VOTE3 = {"x-detgate-vote": "3"}
ANSWER_RULE = {"*": {"extractor": ANSWER}}


def ask(gw, headers=VOTE3, **kwargs):
    return client(gw.url).chat.completions.with_raw_response.create(model="m1", messages=QUESTION,
                                                                    extra_headers=headers, **kwargs)


def answer_of(raw) -> str:
    return orjson.loads(raw.parse().choices[0].message.content)["answer"]


def test_two_agreeing_answers_settle_a_vote_of_three_and_hits_report_it():
    fake = NoisyUpstream(by_seed={0: "yes", 1: "yes"})
    with noisy_gateway(fake, strategies=ANSWER_RULE) as gw:
        first, second = ask(gw), ask(gw)
        assert [c["seed"] for c in fake.calls] == [0, 1]  # no third call: it could not change the outcome
        assert (first.headers["x-detgate-cache"], second.headers["x-detgate-cache"]) == ("miss", "hit")
        assert first.headers["x-detgate-votes"] == second.headers["x-detgate-votes"] == "2/3"
        assert first.http_response.content == second.http_response.content
        assert answer_of(first) == "yes"
        assert metric(gw, 'detgate_vote_total{model="m1",outcome="majority"}') == 1
        assert metric(gw, "detgate_vote_agreement_count") == 1


def test_a_disagreement_calls_a_third_voter_and_the_majority_wins():
    fake = NoisyUpstream(by_seed={0: "yes", 1: "no", 2: "no"})
    with noisy_gateway(fake, strategies=ANSWER_RULE) as gw:
        raw = ask(gw)
        assert sorted(c["seed"] for c in fake.calls) == [0, 1, 2]
        assert raw.headers["x-detgate-votes"] == "2/3" and answer_of(raw) == "no"


def test_a_tie_goes_to_the_group_holding_the_lowest_seed():
    fake = NoisyUpstream(by_seed={0: "yes", 1: "no", 2: "no", 3: "yes"})
    with noisy_gateway(fake, strategies=ANSWER_RULE) as gw:
        raw = ask(gw, {"x-detgate-vote": "4"})
        assert sorted(c["seed"] for c in fake.calls) == [0, 1, 2, 3]
        assert raw.headers["x-detgate-votes"] == "2/4" and answer_of(raw) == "yes"
        assert metric(gw, 'detgate_vote_total{model="m1",outcome="tie_break"}') == 1


def test_without_an_extractor_answers_that_differ_in_any_byte_never_agree():
    fake = NoisyUpstream(by_seed={0: "yes", 1: "yes", 2: "yes"})  # same answer, fresh note every call
    with noisy_gateway(fake) as gw:
        raw = ask(gw)
        assert len(fake.calls) == 3 and raw.headers["x-detgate-votes"] == "1/3"


def test_the_vote_is_part_of_the_key_and_bad_vote_headers_are_400():
    fake = NoisyUpstream()
    with noisy_gateway(fake, strategies=ANSWER_RULE) as gw:
        keys = {ask(gw, h).headers["x-detgate-key"] for h in ({}, {"x-detgate-vote": "1"}, VOTE3, {"x-detgate-vote": "5"})}
        assert len(keys) == 3  # no header and a vote of 1 are the same single call
        for bad in ("0", "10", "three", ""):
            reply = post(gw.url, "/v1/chat/completions", {"model": "m1", "messages": QUESTION}, {"x-detgate-vote": bad})
            assert reply.status == 400 and reply.json()["error"]["param"] == "x-detgate-vote"


def test_a_vote_configured_per_model_runs_without_a_header():
    fake = NoisyUpstream(by_seed={0: "yes", 1: "yes"})
    with noisy_gateway(fake, strategies={"m*": {"vote": 3, "extractor": ANSWER}}) as gw:
        assert ask(gw, {}).headers["x-detgate-votes"] == "2/3"
        other = client(gw.url).chat.completions.with_raw_response.create(model="other", messages=QUESTION)
        assert "x-detgate-votes" not in other.headers


def test_an_upstream_failure_fails_the_vote_and_is_never_cached():
    fake = NoisyUpstream(fail_status=503)
    # Without the gateway's own retries and circuit breaker: this is about the vote.
    with noisy_gateway(fake, strategies=ANSWER_RULE, upstream_max_attempts=1, breaker_failures=0) as gw:
        with pytest.raises(openai.InternalServerError) as failed:
            ask(gw)
        assert failed.value.status_code == 503 and failed.value.body["code"] == "noisy"
        fake.fail_status = None
        assert ask(gw).headers["x-detgate-cache"] == "miss"


def test_a_streaming_request_gets_the_winner_as_a_stream():
    fake = NoisyUpstream(by_seed={0: "no", 1: "yes", 2: "yes"})
    with noisy_gateway(fake, strategies=ANSWER_RULE) as gw:
        raw = ask(gw, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
        assert raw.headers["x-detgate-votes"] == "2/3" and orjson.loads(text)["answer"] == "yes"
        assert not any(c.get("stream") for c in fake.calls)  # votes are fetched whole
        assert "stream buffered: vote:3" in raw.headers["x-detgate-warnings"]  # and the stream was told
        whole = ask(gw)
        assert whole.headers["x-detgate-cache"] == "hit" and whole.parse().choices[0].message.content == text


def test_a_whitebox_upstream_is_not_voted_on():
    fake = NoisyUpstream()
    with noisy_gateway(fake, upstream={"profile": "whitebox"}) as gw:
        raw = ask(gw)
        assert len(fake.calls) == 1 and "x-detgate-votes" not in raw.headers
        assert "vote of 3 not run" in raw.headers["x-detgate-warnings"]


def test_vote_records_survive_a_restart(redis_url):
    fake = NoisyUpstream(by_seed={0: "no", 1: "yes", 2: "yes"})
    settings = {"redis_url": redis_url, "secret": SECRET, "strategies": ANSWER_RULE}
    with noisy_gateway(fake, **settings) as gw:
        first = ask(gw)
    with noisy_gateway(fake, **settings) as gw:
        again = ask(gw)
    assert again.headers["x-detgate-cache"] == "hit" and len(fake.calls) == 3
    assert again.headers["x-detgate-votes"] == first.headers["x-detgate-votes"] == "2/3"
    assert again.http_response.content == first.http_response.content


def test_against_an_upstream_that_ignores_seeds_the_first_vote_is_every_later_answer():
    fake = NoisyUpstream(p_flip=0.5, seed=11)  # a coin toss per call, whatever the seed
    with noisy_gateway(fake, strategies=ANSWER_RULE) as gw:
        replies = [ask(gw, {"x-detgate-vote": "5"}) for _ in range(6)]
        assert len({r.http_response.content for r in replies}) == 1
        assert len({r.headers["x-detgate-votes"] for r in replies}) == 1
        assert [r.headers["x-detgate-cache"] for r in replies] == ["miss"] + ["hit"] * 5
        assert 3 <= len(fake.calls) <= 5


def test_identical_requests_in_flight_together_share_one_vote():
    fake = NoisyUpstream(by_seed={0: "yes", 1: "no", 2: "yes"}, delay_s=0.2)
    with noisy_gateway(fake, strategies=ANSWER_RULE) as gw:
        with ThreadPoolExecutor(6) as pool:
            replies = list(pool.map(lambda _: ask(gw), range(6)))
        assert len(fake.calls) == 3 and len({r.http_response.content for r in replies}) == 1
        assert sorted(r.headers["x-detgate-cache"] for r in replies) == ["coalesced"] * 5 + ["miss"]
        assert {r.headers["x-detgate-votes"] for r in replies} == {"2/3"}
