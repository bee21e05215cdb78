"""pytest plugin: command-line options, the ``run_world`` fixture, and ``run_if`` markers (ddpprobe/plugin/runif.py)
turned into skips at collection.

Enable it from a ``conftest.py`` with ``pytest_plugins = ["ddpprobe.plugin.pytest_plugin"]``.

Options (each also readable from an environment variable, the option wins; backend, timeouts and start
method are resolved by ``ddpprobe.launch.resolve_settings``, as ``run_world`` resolves them):

=====================  ============================  ===============================================
option                 environment variable          meaning
=====================  ============================  ===============================================
``--backend``          ``DDPPROBE_BACKEND``          ``gloo`` (default, CPU) or ``nccl`` (a GPU per rank)
``--world-size``       ``DDPPROBE_WORLD_SIZES``      comma list; run only facts parametrised by these W
``--world-timeout``    ``DDPPROBE_TIMEOUT``          seconds one world may run (default 120)
``--pg-timeout``       ``DDPPROBE_PG_TIMEOUT``       seconds a collective may block (default: half)
``--start-method``     ``DDPPROBE_START_METHOD``     ``forkserver`` (default for gloo) or ``spawn``
``--lightning``        ``DDPPROBE_LIGHTNING``        ``pytorch_lightning`` (default when installed) or
                                                     ``lightning`` (``import lightning.pytorch``)
``--skip-unavailable`` ``DDPPROBE_SKIP_UNAVAILABLE``  under nccl, skip facts needing more CUDA devices
                                                     than this machine has, instead of refusing the run
``--fresh-worlds``     ``DDPPROBE_FRESH_WORLDS``     start a new world at every ``run_world`` call (no
                                                     world is shared between tests, none is warm)
``--warm-worlds``      ``DDPPROBE_WARM_WORLDS``      run scenarios on warm worlds: ranks that stay up
                                                     and run scenario after scenario (ddpprobe/plugin/_warm.py)
=====================  ============================  ===============================================

Shared worlds: a world that completed is started once per session. A later ``run_world`` call with the same
scenario, world size, parameters, settings and environment, in any test and any xdist worker of the run,
gets a copy of its result (ddpprobe/plugin/_shared_worlds.py); a world that raised is never shared. A test that
needs worlds of its own (it compares two worlds, or counts processes) says so with
``@pytest.mark.fresh_world("reason")``.

Warm worlds (the default; ``--fresh-worlds`` or ``DDPPROBE_WARM_WORLDS=0`` turn them off): a world that is
started runs on the ranks of a warm world of its kind when one answers for it (ddpprobe/plugin/_warm.py),
else fresh; a failed warm world is ended and the call runs again in a fresh world (when that one succeeds,
a ``WarmWorldLeakSuspect`` warning names the scenario in pytest's summary). A test that fails a world by
design gets fresh worlds at once: marked ``fresh_world`` or ``waits_for_timeout``, or whose code passes
``pg_timeout=``, names a ``WorldError`` (``RankFailed``, ``RankDied``, ``WorldTimeout``) or reads the ranks'
processes (``pid``, ``exitcode``); so does a call given its own ``timeout=`` or ``pg_timeout=``.

Under pytest-xdist: the controller starts one preloaded forkserver that every worker on this host forks
its ranks from (``pytest_configure_node``). The tests that wait for a timeout by design (marked
``waits_for_timeout``) wait side by side with the CPU-bound ones: ``-n auto`` gives a worker more than the
cores when such tests are selected, and in place of xdist's default ``load`` distribution they go, in groups,
to workers of their own from the start while every other test goes to whichever worker is free
(ddpprobe/plugin/_waiting.py); they are also collected first (``ddpprobe/plugin/_test_code.py``).

Refused before any test runs, with pytest's usage error (exit code 4) naming the value and the fix: an
unknown backend, start method or Lightning package; timeouts that are not seconds; a world size that is
not a whole number >= 1 or matches no collected test; and ``--backend nccl`` on a machine with fewer CUDA
devices than the selected facts need (one per rank), unless ``--skip-unavailable`` is given. Under
pytest-xdist the workers collect, so a refusal found at collection is reported by the controller at the
end of the run (``ERROR: ...``, exit code 4), with no test run.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Optional

import pytest

from ddpprobe import _lightning
from ddpprobe.launch import (
    BACKENDS,
    START_METHODS,
    SettingsError,
    attach_forkserver,
    cuda_device_count,
    external_world,
    leave_external_world,
    resolve_settings,
    run_world as _run_world,
    start_shared_forkserver,
    world_usage,
)
from ddpprobe.plugin import _budget, _shared_worlds, _test_code, _waiting, _warm, runif

#: How each launch setting is named in a usage error: the option (its variable is named by the resolver).
_OPTIONS = {
    "backend": "--backend",
    "timeout": "--world-timeout",
    "pg_timeout": "--pg-timeout",
    "start_method": "--start-method",
}

_SETTINGS = pytest.StashKey[dict]()
_REFUSED = pytest.StashKey[list]()
_SHARED_FORKSERVER = pytest.StashKey[Optional[dict]]()
_OVER_BUDGET = pytest.StashKey[str]()
_WORLDS_BEFORE = pytest.StashKey[int]()
#: The session's world budget while it runs (``{"limit", "paths", "worlds"}``), set at configure where one applies.
_BUDGET_STATE: dict = {}
_WORKER_KEY = "ddpprobe_refused"
_FORKSERVER_KEY = "ddpprobe_forkserver"


def pytest_addoption(parser) -> None:
    group = parser.getgroup("ddpprobe", "ddpprobe: launching DDP worlds")
    group.addoption(
        "--backend",
        default=None,
        metavar="|".join(BACKENDS),
        help="process-group backend of every world: gloo (CPU, default) or nccl (one CUDA device per rank); "
        "default DDPPROBE_BACKEND or gloo",
    )
    group.addoption(
        "--world-size",
        default=os.environ.get("DDPPROBE_WORLD_SIZES", ""),
        metavar="W[,W...]",
        help="run only the facts parametrised by these world sizes (default: all); a size no test is "
        "parametrised with is refused",
    )
    group.addoption(
        "--world-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds one world may run before its ranks' stacks are taken and all are killed "
        "(default DDPPROBE_TIMEOUT or 120)",
    )
    group.addoption(
        "--pg-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds a collective may block before the process group raises (default DDPPROBE_PG_TIMEOUT "
        "or half the world timeout)",
    )
    group.addoption(
        "--start-method",
        default=None,
        metavar="|".join(START_METHODS),
        help="how ranks start: forkserver (preloaded, fast; default for gloo) or spawn (fresh interpreters); "
        "default DDPPROBE_START_METHOD, else by backend",
    )
    group.addoption(
        "--lightning",
        default=None,
        metavar="PACKAGE",
        help="the Lightning package the facts run: pytorch_lightning (import pytorch_lightning) or lightning "
        "(import lightning.pytorch); default DDPPROBE_LIGHTNING, else pytorch_lightning when installed",
    )
    group.addoption(
        "--skip-unavailable",
        action="store_true",
        default=os.environ.get("DDPPROBE_SKIP_UNAVAILABLE", "").strip().lower() in ("1", "true", "yes"),
        help="with --backend nccl, skip (with the reason) the facts that need more CUDA devices than this "
        "machine has, instead of refusing the run (default DDPPROBE_SKIP_UNAVAILABLE=1)",
    )
    group.addoption(
        "--fresh-worlds",
        action="store_true",
        default=os.environ.get("DDPPROBE_FRESH_WORLDS", "").strip().lower() in ("1", "true", "yes"),
        help="start a new world at every run_world call instead of sharing a completed world between the "
        "tests that ask for the same one or running it on a warm world (default DDPPROBE_FRESH_WORLDS=1)",
    )
    group.addoption(
        "--world-budget",
        type=int,
        default=None,
        help="fail the run when the tests under world_budget_paths start more live worlds than this (default: the "
        "world_budget ini setting; 0: no budget; ddpprobe/plugin/_budget.py)",
    )
    parser.addini("world_budget", "live worlds the tests under world_budget_paths may start (empty or 0: no budget)")
    parser.addini("world_budget_paths", "folders whose tests count against world_budget", type="args", default=[])
    group.addoption(
        "--warm-worlds",
        action="store_true",
        default=False,
        help="run each world on the ranks of a warm world of its kind, kept up from scenario to scenario; a "
        "failed warm world reruns the call fresh (the default; DDPPROBE_WARM_WORLDS=0 turns it off)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "run_if(min_gpus=0, backend=None, lightning=None, feature=None): run only where these needs are met, else skip "
        "with the reason (use ddpprobe.plugin.runif.run_if to build it)",
    )
    config.addinivalue_line(
        "markers",
        "waits_for_timeout: the test waits seconds for a process-group or world timeout by design, using almost "
        "no CPU; under pytest-xdist such tests start first, on workers of their own (ddpprobe/plugin/_waiting.py)",
    )
    config.addinivalue_line(
        "markers",
        "fresh_world(reason): every run_world call of this test starts a new world, never one another test "
        "completed (for tests that compare worlds or watch their processes)",
    )
    _choose_lightning(config)
    settings = _check_options(config)
    config.option.backend = settings["backend"]  # --backend reads as resolved for other plugins (the card)
    settings["world_sizes"] = runif.parse_world_sizes(config.getoption("--world-size"))
    config.stash[_SETTINGS] = settings
    config.stash[_REFUSED] = []
    shared = getattr(config, "workerinput", {}).get(_FORKSERVER_KEY)
    if shared:
        attach_forkserver(**shared)
    if settings["backend"] == "nccl" and not config.getoption("--skip-unavailable"):
        runif.check_devices(settings["world_sizes"])


def _choose_lightning(config) -> None:
    """Choose the Lightning package before any test module imports a probe (xdist workers run this too)."""
    try:
        _lightning.use(config.getoption("--lightning") or _lightning.chosen())
    except ValueError as exc:
        raise pytest.UsageError(f"--lightning / {_lightning.ENV_VAR}: {exc}") from None


def _check_options(config) -> dict:
    """Resolve the launch settings once, before any test runs (``ddpprobe.launch.resolve_settings``:
    option > environment variable > default), refusing a bad one with its source and the fix."""
    given = {name: config.getoption(option) for name, option in _OPTIONS.items()}
    try:
        settings = resolve_settings(**given, names=_OPTIONS)
    except SettingsError as exc:
        raise pytest.UsageError(str(exc)) from None
    # Worlds get the resolved backend and what the command line gave; run_world resolves the rest from
    # the same variables, so a fact's own timeout= still gets half of it as its process-group timeout.
    return {
        "backend": settings.backend,
        "resolved_start_method": settings.start_method,
        **{k: v for k, v in given.items() if k != "backend"},
    }


def _world_size_of(item) -> Optional[int]:
    callspec = getattr(item, "callspec", None)
    size = callspec.params.get("world_size") if callspec is not None else None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def pytest_collection_modifyitems(config, items) -> None:
    """Keep the facts of the chosen world sizes, then mark every fact this run cannot run with a
    ``skipif`` carrying its reason (so the skip is reported at the test), or refuse the run. Under
    pytest-xdist, the tests that wait for a timeout go first (``ddpprobe/plugin/_test_code.py``)."""
    settings = config.stash[_SETTINGS]
    sizes = settings["world_sizes"]
    if sizes:
        present = {_world_size_of(item) for item in items} - {None}
        missing = sorted(sizes - present)
        if missing:
            given = ",".join(map(str, sorted(sizes)))
            absent = ", ".join(map(str, missing))
            found = ", ".join(map(str, sorted(present))) or "none"
            _refuse(
                config,
                items,
                f"--world-size {given}: no collected test is parametrised with world size {absent} "
                f"(world sizes present: {found})",
            )
            return
        keep, drop = [], []
        for item in items:
            size = _world_size_of(item)
            (drop if size is not None and size not in sizes else keep).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    environment = runif.RunEnvironment.here(settings["backend"])
    outside = external_world()
    short = []
    for item in items:
        try:
            unmet = runif.unmet(runif.requirements_of(item), environment)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        size = _world_size_of(item)
        if size is not None:
            if outside is not None and size != outside.world_size:
                unmet.append(
                    (
                        "world",
                        f"fact runs at world size {size}; this {outside.launcher} world has {outside.world_size} ranks",
                    )
                )
            elif outside is None:
                reason = runif.world_skip_reason(environment.backend, size, environment.cuda_devices)
                if reason:
                    unmet.append((runif.DEVICES, reason))
        if not unmet:
            continue
        kinds = {kind for kind, _ in unmet}
        if kinds == {runif.DEVICES} and environment.backend == "nccl" and not config.getoption("--skip-unavailable"):
            short.append(f"{item.nodeid}: {'; '.join(reason for _, reason in unmet)}")
        else:
            item.add_marker(pytest.mark.skipif(True, reason="; ".join(reason for _, reason in unmet)))
    if short:
        listed = "\n  ".join(short[:5]) + (f"\n  ... and {len(short) - 5} more" if len(short) > 5 else "")
        _refuse(
            config,
            items,
            f"--backend nccl: {len(short)} selected test(s) need more CUDA devices than the "
            f"{environment.cuda_devices} found here:\n  {listed}\nRun on a machine with more GPUs, narrow "
            "the run (e.g. --world-size), or pass --skip-unavailable to skip them, each with its reason",
        )
        return
    if hasattr(config, "workerinput"):
        _test_code.start_waiting_tests_first(items)


def _refuse(config, items, message: str) -> None:
    """Stop the run before any test: a usage error, or under xdist (where a worker collects and cannot
    stop the controller) no test for this worker and the message for the controller."""
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is None:
        raise pytest.UsageError(message)
    workeroutput[_WORKER_KEY] = message
    config.hook.pytest_deselected(items=list(items))
    items[:] = []


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """Under xdist (controller): the workers of this run fork their ranks from one forkserver, started
    here once (``ddpprobe.launch.start_shared_forkserver``) rather than one per worker, when worlds start
    from a forkserver by default and the worker runs on this host with this interpreter."""
    config = node.config
    spec = node.gateway.spec
    if not (spec.popen and not spec.via and spec.python in (None, sys.executable)):
        return
    if config.stash[_SETTINGS]["resolved_start_method"] != "forkserver" or config.option.collectonly:
        return
    if external_world() is not None:
        return
    if _SHARED_FORKSERVER not in config.stash:
        config.stash[_SHARED_FORKSERVER] = start_shared_forkserver()
    node.workerinput[_FORKSERVER_KEY] = config.stash[_SHARED_FORKSERVER]


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """Under ``-n auto``: the cores plus ``_waiting.WAITING_WORKERS`` when waiting tests are selected."""
    return _waiting.auto_num_workers(config)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """In place of xdist's ``load`` distribution: the waiting tests in groups of their own, sent first."""
    return _waiting.make_scheduler(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """Under xdist (controller): collect what the workers refused."""
    message = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
    refused = node.config.stash.get(_REFUSED, None)
    if message and refused is not None and message not in refused:
        refused.append(message)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    for message in config.stash.get(_REFUSED, []):
        terminalreporter.write_line(f"ERROR: {message}", red=True, bold=True)
    over = config.stash.get(_OVER_BUDGET, None)
    if over:
        terminalreporter.write_line(f"ERROR: {over}", red=True, bold=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    """A run the workers refused exits with pytest's usage-error code 4. Inside a torchrun/srun world,
    leave it together so no rank aborts at exit."""
    if session.config.stash.get(_REFUSED, None):
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
    budget = _BUDGET_STATE.pop("config", None)
    if budget is not None:
        over = _budget.over_budget(budget["worlds"], budget["limit"])
        if over:
            session.config.stash[_OVER_BUDGET] = over
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if external_world() is not None:
        leave_external_world()
    workerinput = getattr(session.config, "workerinput", None)
    in_xdist = workerinput is not None or session.config.getoption("dist", "no") != "no"
    _shared_worlds.log_process(workerinput["workerid"] if workerinput else "controller" if in_xdist else "main")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``DDPPROBE_WORLD_LOG`` set: log each test's wall time, CPU and worlds (``_shared_worlds.timed``)."""
    item.stash[_WORLDS_BEFORE] = world_usage()["worlds"]
    with _shared_worlds.timed(item.nodeid):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The worlds a test started (setup, call and teardown), on its teardown report (ddpprobe/plugin/_budget.py)."""
    outcome = yield
    if call.when == "teardown" and _WORLDS_BEFORE in item.stash:
        started = world_usage()["worlds"] - item.stash[_WORLDS_BEFORE]
        report = outcome.get_result()
        report.user_properties.append((_budget.PROPERTY, started))
        report.user_properties.append((_budget.MARKERS, sorted({m.name for m in item.iter_markers()})))


def pytest_sessionstart(session) -> None:
    """Start the world budget's tally where one applies (after every ``pytest_configure``, so a conftest may turn it
    off: ``config.option.world_budget = 0``)."""
    limit = _world_budget(session.config)
    if limit is not None:
        paths = session.config.getini("world_budget_paths")
        _BUDGET_STATE["config"] = {"limit": limit, "paths": paths, "worlds": {}}


def pytest_runtest_logreport(report) -> None:
    """Tally each counted test's worlds (in the controller under xdist, which receives every report)."""
    budget = _BUDGET_STATE.get("config")
    if budget is None or report.when != "teardown":
        return
    properties = dict(report.user_properties)
    if _budget.PROPERTY in properties:
        if _budget.counted(report.nodeid, properties.get(_budget.MARKERS, ()), budget["paths"]):
            budget["worlds"][report.nodeid] = properties[_budget.PROPERTY]


def _world_budget(config) -> Optional[int]:
    """The run's budget: ``--world-budget``, else the ``world_budget`` ini setting; None where off (0, unset, a
    re-recording run under pytest-regressions' ``--regen-all``/``--force-regen``, or a worker)."""
    if hasattr(config, "workerinput"):
        return None
    if config.getoption("regen_all", False) or config.getoption("force_regen", False):
        return None
    given = config.getoption("--world-budget")
    if given is None:
        text = str(config.getini("world_budget") or "").strip()
        try:
            given = int(text) if text else None
        except ValueError:
            raise pytest.UsageError(f"world_budget = {text!r} is not a whole number of worlds; give e.g. 60") from None
    return given or None


def _skip_at_the_test(reason: str):
    """A skip reported at the test's own line, not at this plugin's (as pytest does for ``skipif``)."""
    return pytest.skip.Exception(reason, _use_item_location=True)


@pytest.fixture
def backend(request) -> str:
    """The backend chosen with ``--backend`` (``"gloo"`` or ``"nccl"``)."""
    return request.config.stash[_SETTINGS]["backend"]


@pytest.fixture(scope="session")
def _shared_worlds_store(request, tmp_path_factory) -> _shared_worlds.SharedWorlds:
    """This run's completed worlds, in a folder every xdist worker of the run shares (the run's temporary
    folder: the workers' own folders are inside it)."""
    base = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):
        base = base.parent
    return _shared_worlds.SharedWorlds(str(base / "ddpprobe-worlds"))


@pytest.fixture(scope="session")
def _warm_pool(request):
    """This process's warm worlds (``--warm-worlds``), ended at the session's end; None when off."""
    config = request.config
    if config.getoption("--fresh-worlds") or not _warm.enabled(config.getoption("--warm-worlds")):
        yield None
        return
    pool = _warm.WarmPool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def run_world(request, backend, _shared_worlds_store, _warm_pool):
    """``ddpprobe.run_world`` with this session's backend, timeouts and start method filled in.

    A world that needs more CUDA devices than this machine has (``backend="nccl"``, given to the call or
    with ``--backend nccl``; one device per rank) skips the test with the reason, or fails it when the
    run itself asked for nccl without ``--skip-unavailable``. Facts parametrised by ``world_size`` are
    checked at collection instead. Inside a torchrun/srun world (every rank running this pytest session
    in lockstep), scenarios run in-process and a fact needing another world size skips on every rank.
    """
    config = request.config
    settings = config.stash[_SETTINGS]
    defaults = {key: settings[key] for key in ("backend", "timeout", "pg_timeout", "start_method")}
    reuse = not config.getoption("--fresh-worlds") and request.node.get_closest_marker("fresh_world") is None
    pool = _warm_pool if _warm_pool is not None and not _test_code.fails_by_design(request.node) else None

    @functools.wraps(_run_world)
    def run(scenario, world_size: int = 2, **kwargs):
        outside = external_world()
        if outside is not None:
            if world_size != outside.world_size:
                raise _skip_at_the_test(
                    f"fact runs at world size {world_size}; this {outside.launcher} world has "
                    f"{outside.world_size} ranks"
                )
        elif isinstance(world_size, int) and not isinstance(world_size, bool):
            chosen = kwargs.get("backend", backend)
            reason = runif.world_skip_reason(chosen, world_size, cuda_device_count() if chosen == "nccl" else 0)
            if reason:
                if backend == "nccl" and not config.getoption("--skip-unavailable"):
                    pytest.fail(f"{reason}; pass --skip-unavailable to skip such facts", pytrace=False)
                raise _skip_at_the_test(reason)
        merged = {k: v for k, v in defaults.items() if v is not None}
        merged.update(kwargs)
        if outside is not None:
            return _run_world(scenario, world_size, **merged)
        ref = f"{getattr(scenario, '__module__', None)}:{getattr(scenario, '__qualname__', None)}"
        filled = _shared_worlds.with_defaults(_run_world, merged, skip=("scenario", "world_size"))
        key = _shared_worlds.world_key(ref, world_size, _shared_worlds.with_defaults(scenario, filled))
        started, outcome = time.monotonic(), {"reused": False, "ok": False, "warm": False, "fell_back": False}
        warm = pool if pool is not None and not {"timeout", "pg_timeout"} & set(kwargs) else None

        def start():
            failed_before = warm.fell_back if warm is not None else 0
            result = warm.run(scenario, world_size, merged) if warm is not None else None
            # fell back: a warm world ran the call and failed (not one the pool refused, e.g. nccl)
            outcome["warm"], outcome["fell_back"] = (
                result is not None,
                warm is not None and warm.fell_back > failed_before,
            )
            if result is not None:
                return result
            result = _run_world(scenario, world_size, **merged)
            if outcome["fell_back"]:
                _warm.warn_leak_suspect(ref, world_size)
            return result

        try:
            result, outcome["reused"] = _shared_worlds_store.run(key, start, reuse=reuse)
            outcome["ok"] = True
            return result
        finally:
            _shared_worlds.log_call(request.node.nodeid, ref, world_size, key, time.monotonic() - started, **outcome)

    return run
