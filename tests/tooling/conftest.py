"""Everything under ``tests/tooling/`` tests ddpprobe itself (launcher, audit, card, skips, oracle), not
a fact about DDP: each test is marked ``not_a_fact`` here, so the semantics card leaves it out even when
a module forgets its own marker. A module's own ``not_a_fact("reason")`` keeps its more specific reason. Audit
results are shared by every worker of the run (``_shared_audit_runs``, tests/support/audit_runs.py) and read from
recorded worlds where stored (``_recorded_worlds``, tests/support/recordings.py)."""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/tooling/" in item.nodeid and item.get_closest_marker("not_a_fact") is None:
            item.add_marker(
                pytest.mark.not_a_fact("a test of ddpprobe's tooling (tests/tooling/), not a fact about DDP")
            )


@pytest.fixture(scope="session", autouse=True)
def _shared_audit_runs(request, tmp_path_factory):
    """Audit results shared by every xdist worker of the run (tests/support/audit_runs.py), in the run's
    temporary folder (the workers' own folders are inside it)."""
    from tests.support import audit_runs

    base = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):
        base = base.parent
    audit_runs.use_folder(str(base / "ddpprobe-audits"))
    yield
    audit_runs.use_folder(None)


@pytest.fixture(scope="session", autouse=True)
def _recorded_worlds(request):
    """Recorded worlds (tests/support/recordings.py) are read, or, under pytest-regressions' ``--regen-all`` or
    ``--force-regen``, rewritten from live runs."""
    from tests.support import recordings

    config = request.config
    recordings.update(config.getoption("regen_all", False) or config.getoption("force_regen", False))
    yield
    recordings.update(False)
