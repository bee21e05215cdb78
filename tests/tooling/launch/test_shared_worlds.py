"""Worlds shared between tests (ddpprobe/plugin/_shared_worlds.py, used by the ``run_world`` fixture): a world that
completed is started once per session and every later call with the same key gets its own copy of the
result; a world that raised is never shared; ``fresh_world`` and ``--fresh-worlds`` start every world anew."""

import pytest

from ddpprobe import RankFailed
from ddpprobe.plugin._shared_worlds import SharedWorlds, world_key
from tests.support import scenarios

pytestmark = pytest.mark.not_a_fact("tests how the run_world fixture shares worlds, not a fact about DDP")

REF = "tests.support.scenarios:identity"


def test_a_second_call_with_the_same_key_gets_a_copy_of_the_first_worlds_result(run_world):
    """The same processes' records come back (same pids: no second world started), and changing one
    copy's record does not change the other's."""
    first = run_world(scenarios.identity, 2, tag="shared-copy")
    first.records[0]["rank"] = "changed by the first caller"
    first[1].files["added"] = "by the first caller"
    second = run_world(scenarios.identity, 2, tag="shared-copy")

    assert second.pids == first.pids
    assert [rec["rank"] for rec in second.records] == [0, 1]
    assert "added" not in second[1].files


@pytest.mark.integration
def test_other_parameters_settings_or_environment_start_another_world(run_world, monkeypatch):
    first = run_world(scenarios.identity, 2, tag="shared-keys")
    other_tag = run_world(scenarios.identity, 2, tag="shared-keys-2")
    other_timeout = run_world(scenarios.identity, 2, tag="shared-keys", timeout=90)
    monkeypatch.setenv("DDPPROBE_SHARED_WORLDS_TEST", "1")
    other_environment = run_world(scenarios.identity, 2, tag="shared-keys")

    pids = [tuple(world.pids) for world in (first, other_tag, other_timeout, other_environment)]
    assert len(set(pids)) == 4, pids


@pytest.mark.integration
def test_a_world_that_raised_is_not_shared(run_world):
    """Each call of a failing world starts its own processes and raises again."""
    errors = []
    for _ in range(2):
        with pytest.raises(RankFailed) as failure:
            run_world(scenarios.raise_on, 2, rank=1, timeout=60)
        errors.append(failure.value)

    assert errors[0].pids != errors[1].pids


@pytest.mark.integration
@pytest.mark.fresh_world("checks that the marker starts a new world")
def test_a_test_marked_fresh_world_starts_a_new_world_at_every_call(run_world):
    worlds = [run_world(scenarios.identity, 2, tag="shared-fresh") for _ in range(2)]

    assert worlds[0].pids != worlds[1].pids


@pytest.mark.parametrize(
    "a, b",
    [
        ({"n": 1}, {"n": 1.0}),
        ({"n": 1}, {"n": True}),
        ({"plan": [1, 2]}, {"plan": (1, 2)}),
        ({"n": 1}, {"n": 1, "timeout": 60}),
        ({"env": {"A": "1"}}, {"env": {"A": "2"}}),
    ],
)
def test_keys_tell_apart_values_python_calls_equal_and_every_keyword(a, b):
    """``1``, ``1.0`` and ``True`` are equal in Python but may make a scenario behave differently, as may
    a list and a tuple; a setting or ``env`` entry is part of the key too."""
    environ = {"HOME": "/x"}
    assert world_key(REF, 2, a, environ) != world_key(REF, 2, b, environ)
    assert world_key(REF, 2, a, environ) == world_key(REF, 2, dict(a), dict(environ))


def test_keys_ignore_the_current_test_name_and_nothing_else_of_the_environment():
    assert world_key(REF, 2, {}, {"PYTEST_CURRENT_TEST": "a"}) == world_key(REF, 2, {}, {"PYTEST_CURRENT_TEST": "b"})
    assert world_key(REF, 2, {}, {"X": "1"}) != world_key(REF, 2, {}, {"X": "2"})
    assert world_key(REF, 2, {}, {}) != world_key(REF, 3, {}, {})


def test_the_store_starts_once_per_key_and_counts_started_and_reused_worlds(tmp_path):
    store = SharedWorlds(str(tmp_path / "worlds"))
    calls = []

    def start():
        calls.append(1)
        return {"records": [len(calls)]}

    results = [store.run("k", start)[0] for _ in range(3)] + [store.run("k", start, reuse=False)[0]]

    assert results == [{"records": [1]}] * 3 + [{"records": [2]}]
    assert (store.started, store.reused) == (2, 2)
    assert results[0] is not results[1]
