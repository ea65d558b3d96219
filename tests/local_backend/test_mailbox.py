"""A request's mailbox: its handler is woken once `batch` events or the last one are in, and
takes all that arrived, in order."""
from __future__ import annotations

import asyncio

from local_backend.engine.client import Mailbox
from local_backend.engine.messages import Event, Sample


def token(i: int, finish: str | None = None) -> Event:
    return Event(Sample(i), finish)


async def test_a_batch_or_the_last_event_wakes_the_handler():
    mailbox = Mailbox(batch=4)
    taking = asyncio.ensure_future(mailbox.take())
    for i in range(3):
        mailbox.put(token(i))
        await asyncio.sleep(0)
    assert not taking.done()
    mailbox.put(token(3))
    assert [e.sample.token for e in await taking] == [0, 1, 2, 3]
    mailbox.put(token(4))
    mailbox.put(token(5, "length"))
    assert [e.sample.token for e in await mailbox.take()] == [4, 5]


async def test_an_error_wakes_it_at_once_and_a_batch_of_one_is_every_event():
    mailbox = Mailbox(batch=16)
    taking = asyncio.ensure_future(mailbox.take())
    mailbox.put(token(0))
    mailbox.put(Event(error="the engine process exited"))
    assert [e.error for e in await taking] == [None, "the engine process exited"]
    single = Mailbox()
    taking = asyncio.ensure_future(single.take())
    single.put(token(7))
    assert [e.sample.token for e in await taking] == [7]
