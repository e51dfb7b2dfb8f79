"""``Every``: when the settler's periodic work is due."""

import time

from modalscope.core.every import Every


def test_due_once_an_interval_from_the_first_ask():
    every = Every(10.0)
    assert every.due(now=5.0)  # no first delay: due at once, whatever the caller's clock
    assert not every.due(now=14.9)
    assert every.due(now=15.0)
    assert not every.due(now=24.0)


def test_a_first_delay_and_a_zero_interval():
    assert not Every(10.0, first_after_s=60.0).due()
    assert Every(10.0, first_after_s=0.0).due()
    never = Every(0.0)
    assert not never.due(now=0.0) and not never.due(now=1e9)


def test_again_in_moves_the_next_time():
    every = Every(3600.0)
    assert every.due()
    every.again_in(0.0)
    assert every.seconds_left() <= 0 and every.due()
    asked = time.monotonic()
    every.again_in(120.0)
    left = every.seconds_left()
    assert 120.0 - (time.monotonic() - asked) <= left <= 120.0 and not every.due()
