"""A world's key fills in the defaults of the scenario and of ``run_world`` (ddpprobe/plugin/_shared_worlds.py
``with_defaults``): a call that gives a default and one that leaves it out are one world, shared by the
``run_world`` fixture; any other value is another world."""

import pytest

from ddpprobe import run_world as api_run_world
from ddpprobe.plugin._shared_worlds import with_defaults, world_key
from tests.support import scenarios

pytestmark = pytest.mark.not_a_fact("tests how the run_world fixture keys worlds, not a fact about DDP")

REF = "tests.support.scenarios:identity"


def _fit(info, n, lr=0.05, *args, plan=(), **more):
    return n, lr, args, plan, more


def test_with_defaults_completes_the_keywords_left_out_and_keeps_those_given():
    assert with_defaults(_fit, {"n": 8}) == {"n": 8, "lr": 0.05, "plan": ()}
    assert with_defaults(_fit, {"n": 8, "lr": 0.1}) == {"n": 8, "lr": 0.1, "plan": ()}
    assert with_defaults(api_run_world, {"backend": "gloo"}, skip=("scenario", "world_size")) == {
        "backend": "gloo",
        "timeout": None,
        "pg_timeout": None,
        "start_method": None,
        "env": None,
        "keep_cluster_env": False,
        "num_nodes": 1,
        "hash_seeds": None,
    }


def test_a_default_given_and_left_out_is_one_key_and_another_value_is_another():
    environ = {"HOME": "/x"}
    left_out = world_key(REF, 2, with_defaults(scenarios.identity, {}), environ)
    given = world_key(REF, 2, with_defaults(scenarios.identity, {"tag": "x"}), environ)
    other = world_key(REF, 2, with_defaults(scenarios.identity, {"tag": "y"}), environ)
    assert left_out == given != other


def test_the_fixture_shares_one_world_between_a_default_given_and_left_out(run_world):
    """The world's folder (each rank's working directory) names the world: a shared result repeats it."""
    left_out = run_world(scenarios.identity, 2)
    given = run_world(scenarios.identity, 2, tag="x", num_nodes=1, keep_cluster_env=False)
    other = run_world(scenarios.identity, 2, tag="keys-other")

    assert [r["cwd"] for r in given.records] == [r["cwd"] for r in left_out.records]
    assert [r["cwd"] for r in other.records] != [r["cwd"] for r in left_out.records]


def test_the_xdist_worker_running_the_call_is_not_part_of_the_key_so_every_worker_shares_a_world():
    kwargs = with_defaults(scenarios.identity, {})
    gw0 = world_key(REF, 2, kwargs, {"HOME": "/x", "PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "2"})
    gw1 = world_key(REF, 2, kwargs, {"HOME": "/x", "PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "4"})
    other_home = world_key(
        REF, 2, kwargs, {"HOME": "/y", "PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "2"}
    )
    assert gw0 == gw1 != other_home
