"""Hidden variables (timestamps, ids) in prompts: warned about on misses, through the gateway."""
from __future__ import annotations

import datetime as dt
import uuid

from gw_http import post
from noisy_gw import metric


def test_a_prompt_with_todays_date_and_a_uuid_is_warned_about_on_the_miss_only(upstream, gateway):
    gw = gateway()
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    body = {"model": "fake/m1", "messages": [{"role": "user", "content": f"Today is {today}. Request {uuid.uuid4()}."}]}
    miss = post(gw.url, "/v1/chat/completions", body)
    assert miss.cache == "miss"
    assert "request holds values that change per request (date, uuid; first at messages[0].content" \
        in miss.headers["x-detgate-warnings"]
    assert metric(gw, 'detgate_hidden_variables_total{kind="date"}') == 1
    assert metric(gw, 'detgate_hidden_variables_total{kind="uuid"}') == 1
    hit = post(gw.url, "/v1/chat/completions", body)
    assert hit.cache == "hit" and "request holds" not in hit.headers.get("x-detgate-warnings", "")
    assert metric(gw, 'detgate_hidden_variables_total{kind="date"}') == 1


def test_an_ordinary_prompt_gets_no_hidden_variable_warning(upstream, gateway):
    gw = gateway()
    body = {"model": "fake/m1", "messages": [{"role": "user", "content": "The treaty of 1648 ended a war."}],
            "temperature": 0, "top_p": 1, "seed": 3}
    reply = post(gw.url, "/v1/chat/completions", body)
    assert reply.cache == "miss" and "x-detgate-warnings" not in reply.headers
