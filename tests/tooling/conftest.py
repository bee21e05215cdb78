"""Everything under ``tests/tooling/`` tests ddpprobe itself (launcher, audit, card, skips, oracle), not
a fact about DDP: each test is marked ``not_a_fact`` here, so the semantics card leaves it out even when
a module forgets its own marker. A module's own ``not_a_fact("reason")`` keeps its more specific reason."""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/tooling/" in item.nodeid and item.get_closest_marker("not_a_fact") is None:
            item.add_marker(
                pytest.mark.not_a_fact("a test of ddpprobe's tooling (tests/tooling/), not a fact about DDP")
            )
