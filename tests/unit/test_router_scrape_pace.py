"""When the router scrapes a replica again (router/scrape.py's pure rules):

- an answer on time is followed by the next round's scrape;
- a late answer spaces the next scrape by PACE times its duration, never
  beyond half the staleness bound nor under one interval;
- a wait that came back a whole deadline late means the router's own loop
  was held, not that an engine was slow.
"""

from __future__ import annotations

import pytest

from shoal.router.scrape import PACE, loop_was_late, next_scrape


def test_an_answer_on_time_is_scraped_again_at_the_next_round() -> None:
    assert next_scrape(began=10.0, ended=10.15, late=False, interval=0.25, stale=2.0) == 10.25


def test_a_late_answer_spaces_the_next_scrape_by_its_duration() -> None:
    due = next_scrape(began=10.0, ended=10.05, late=True, interval=0.25, stale=10.0)
    assert due == pytest.approx(10.05 + PACE * 0.05)


def test_a_very_late_answer_is_scraped_again_before_its_readings_go_stale() -> None:
    assert next_scrape(began=10.0, ended=11.5, late=True, interval=0.25, stale=2.0) == 12.5


def test_a_late_answer_waits_at_least_an_interval() -> None:
    assert next_scrape(began=10.0, ended=10.01, late=True, interval=1.0, stale=8.0) == 11.01


def test_only_a_wait_a_whole_deadline_late_is_the_routers_own_lag() -> None:
    assert not loop_was_late(waited=0.35, deadline=0.2)
    assert loop_was_late(waited=0.45, deadline=0.2)
