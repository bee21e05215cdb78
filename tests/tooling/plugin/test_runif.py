"""The skip vocabulary (ddpprobe/plugin/runif.py ``run_if``) and the checks the pytest plugin makes before a
run (ddpprobe/plugin/pytest_plugin.py): reasons built from a fact's needs, skips reported at the skipped test,
``--backend nccl`` refused where the CUDA devices are missing unless ``--skip-unavailable``, and
``--world-size`` values refused before any test runs. CUDA device counts are faked (monkeypatch), so
the GPU paths are proven on machines without a GPU too."""

import re
import types

import pytest
import torch

from ddpprobe import _lightning
from ddpprobe.plugin import runif
from ddpprobe.plugin.runif import Requirements, RunEnvironment, run_if

pytest_plugins = ["pytester"]

PLUGIN = ["-p", "ddpprobe.plugin.pytest_plugin", "-p", "no:cacheprovider", "-rs", "--strict-markers"]


def _fake_cuda(monkeypatch, count: int) -> None:
    """Make torch report ``count`` CUDA devices (``is_available`` is true when ``count > 0``)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


# --- reasons, built from the needs --------------------------------------------------------------


@pytest.mark.parametrize(
    "needs, here, expected",
    [
        (Requirements(), RunEnvironment(), None),
        (Requirements(min_gpus=2), RunEnvironment(cuda_devices=0), "needs >= 2 CUDA devices (found 0)"),
        (Requirements(min_gpus=2), RunEnvironment(cuda_devices=2), None),
        (
            Requirements(backend="nccl"),
            RunEnvironment(backend="gloo", cuda_devices=8),
            "needs --backend nccl (this run: gloo)",
        ),
        (
            Requirements(backend="gloo"),
            RunEnvironment(backend="nccl", cuda_devices=8),
            "needs --backend gloo (this run: nccl)",
        ),
        (
            Requirements(lightning="<2.0"),
            RunEnvironment(lightning_version="2.6.6"),
            "applies to pytorch-lightning <2.0; installed 2.6.6",
        ),
        (Requirements(lightning=">=2.0"), RunEnvironment(lightning_version="2.0.9.post0"), None),
        (
            Requirements(lightning=">=2.6"),
            RunEnvironment(lightning_distribution="lightning", lightning_version="2.5.6"),
            "applies to lightning >=2.6; installed 2.5.6",
        ),
        (
            Requirements(lightning=">=2.6", feature="EarlyStopping.stopping_reason"),
            RunEnvironment(lightning_version="2.0.9.post0"),
            "applies to pytorch-lightning >=2.6 (EarlyStopping.stopping_reason); installed 2.0.9.post0",
        ),
        (
            Requirements(lightning=">=2.6", feature="EarlyStopping.stopping_reason"),
            RunEnvironment(lightning_version="2.6.6"),
            None,
        ),
        (
            Requirements(lightning=">=2.0"),
            RunEnvironment(lightning_version=None),
            "applies to pytorch-lightning >=2.0; installed none",
        ),
        (
            Requirements(min_gpus=2, backend="nccl"),
            RunEnvironment(backend="gloo", cuda_devices=1),
            "needs >= 2 CUDA devices (found 1); needs --backend nccl (this run: gloo)",
        ),
    ],
)
def test_the_skip_reason_names_every_unmet_need_and_what_this_run_has(needs, here, expected):
    """One reason per unmet need (devices, backend, Lightning range), each naming what is needed and
    what this run has, joined by "; "; None when the fact can run."""
    assert runif.skip_reason(needs, here) == expected


@pytest.mark.parametrize(
    "backend, world_size, devices, expected",
    [
        ("gloo", 3, 0, None),
        ("nccl", 2, 2, None),
        ("nccl", 2, 4, None),
        ("nccl", 3, 2, "backend nccl with world size 3 needs 3 CUDA devices, found 2"),
        ("nccl", 1, 0, "backend nccl with world size 1 needs 1 CUDA devices, found 0"),
    ],
)
def test_a_world_under_nccl_needs_one_cuda_device_per_rank(backend, world_size, devices, expected):
    """``world_skip_reason``: a world skips under nccl only when it has more ranks than there are devices."""
    assert runif.world_skip_reason(backend, world_size, devices) == expected


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"min_gpus": -1}, "min_gpus=-1"),
        ({"min_gpus": True}, "min_gpus=True"),
        ({"backend": "mpi"}, "'mpi'"),
        ({"lightning": "2.x"}, "'2.x'"),
        ({"feature": "EarlyStopping.stopping_reason"}, "give the range too"),
        ({"lightning": ">=2.6", "feature": " "}, "feature=' '"),
    ],
)
def test_a_malformed_need_is_refused_naming_the_value(kwargs, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        run_if(**kwargs)


def test_needs_from_the_module_class_and_function_merge_into_one():
    """The most GPUs, the backend, and every version range (intersected) of all ``run_if`` markers, with
    every feature named."""
    marks = [
        run_if(min_gpus=1, lightning=">=2.0", feature="2.x loops").mark,
        run_if(min_gpus=2, backend="nccl").mark,
        run_if(lightning="<3").mark,
    ]
    item = types.SimpleNamespace(nodeid="t.py::test", iter_markers=lambda name: iter(marks))
    assert runif.requirements_of(item) == Requirements(
        min_gpus=2, backend="nccl", lightning=">=2.0,<3", feature="2.x loops"
    )


def test_the_environment_here_counts_cuda_devices_whatever_the_backend(monkeypatch):
    """Devices are counted for a gloo run too: a fact that needs GPUs (``run_if(min_gpus=2)``, or a world
    with ``backend="nccl"``) is judged by the devices present, not by the run's backend."""
    _fake_cuda(monkeypatch, 3)
    assert RunEnvironment.here("gloo").cuda_devices == 3
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert RunEnvironment.here("nccl").cuda_devices == 0, "a build that reports devices it cannot use counts 0"


# --- the plugin: skips at collection, reported at the test ---------------------------------------

FACTS = """
import pytest
from ddpprobe.plugin.runif import run_if

@run_if(min_gpus=2, backend="nccl")
def test_gpu_only():
    assert False, "ran where it cannot"

@run_if(lightning="<1.0")
def test_for_an_old_release():
    assert False, "ran on the wrong release"

@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_world(run_world, world_size):
    pass

def test_asks_for_nccl_itself(run_world):
    from tests.support import scenarios

    run_world(scenarios.identity, 2, backend="nccl")
    assert False, "an nccl world ran without 2 CUDA devices"
"""


def _skip_lines(result) -> list:
    return [line for line in result.stdout.lines if line.startswith("SKIPPED")]


def test_skips_are_reported_at_the_skipped_test_not_at_the_plugin(pytester, monkeypatch):
    """Under gloo on a machine without GPUs: the GPU-only fact, the fact for another release and the
    fact whose world asks for nccl skip, each with its reason (the release's under the distribution this run
    imports: pytorch-lightning, or lightning with ``--lightning lightning``), and every ``-ra`` line points at the test
    module, never at ``ddpprobe/plugin/pytest_plugin.py``."""
    _fake_cuda(monkeypatch, 0)
    pytester.makepyfile(test_facts=FACTS)

    result = pytester.runpytest(*PLUGIN, "--backend", "gloo")

    result.assert_outcomes(passed=3, skipped=3)
    lines = _skip_lines(result)
    assert len(lines) == 3 and all("test_facts.py:" in line and "pytest_plugin" not in line for line in lines), lines
    result.stdout.fnmatch_lines_random(
        [
            "*needs >= 2 CUDA devices (found 0); needs --backend nccl (this run: gloo)*",
            f"*applies to {_lightning.PACKAGES[_lightning.chosen()][2]} <1.0; installed *",
            "*backend nccl with world size 2 needs 2 CUDA devices, found 0*",
        ]
    )


def test_a_world_asking_for_nccl_in_a_gloo_run_counts_the_devices_present(pytester, monkeypatch):
    """``run_world(..., backend="nccl")`` in a gloo run is judged by the CUDA devices present: with 1
    device its 2-rank world skips saying "found 1" (it used to say "found 0" on any machine, because
    devices were counted only when the run's ``--backend`` was nccl)."""
    _fake_cuda(monkeypatch, 1)
    pytester.makepyfile(test_facts=FACTS)

    result = pytester.runpytest(*PLUGIN, "--backend", "gloo", "-k", "asks_for_nccl")

    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*test_facts.py:*backend nccl with world size 2 needs 2 CUDA devices, found 1*"])


def test_backend_nccl_without_cuda_devices_is_refused_at_once(pytester, monkeypatch):
    """``--backend nccl`` on a machine without CUDA devices stops before collection with a usage error
    (exit code 4) naming the devices needed and found, instead of skipping every fact and exiting 0."""
    _fake_cuda(monkeypatch, 0)
    pytester.makepyfile(test_facts=FACTS)

    result = pytester.runpytest(*PLUGIN, "--backend", "nccl")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--backend nccl runs one CUDA device per rank: 1 needed*found 0*--skip-unavailable*"])
    assert "collected" not in result.stdout.str()


def test_backend_nccl_with_too_few_devices_for_some_facts_is_refused_naming_them(pytester, monkeypatch):
    """With 2 devices, the 3-rank world is refused at collection, naming the test, devices needed and found."""
    _fake_cuda(monkeypatch, 2)
    pytester.makepyfile(test_facts=FACTS)

    result = pytester.runpytest(*PLUGIN, "--backend", "nccl")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*--backend nccl: 1 selected test(s) need more CUDA devices than the 2 found here:*",
            "*test_world[[]3[]]: backend nccl with world size 3 needs 3 CUDA devices, found 2*",
        ]
    )


@pytest.mark.parametrize("opt_in", ["--skip-unavailable", "DDPPROBE_SKIP_UNAVAILABLE=1"])
def test_skip_unavailable_turns_the_refusal_into_skips_with_reasons(pytester, monkeypatch, opt_in):
    """``--skip-unavailable`` (or ``DDPPROBE_SKIP_UNAVAILABLE=1``) is the explicit opt-in: the same run
    skips what cannot run, with reasons."""
    _fake_cuda(monkeypatch, 2)
    pytester.makepyfile(test_facts=FACTS)
    args = [opt_in] if opt_in.startswith("--") else []
    if not args:
        monkeypatch.setenv(*opt_in.split("="))

    result = pytester.runpytest(*PLUGIN, "--backend", "nccl", *args, "-k", "world")

    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*test_facts.py:*backend nccl with world size 3 needs 3 CUDA devices, found 2*"])


# --- --world-size ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-1", "abc", "2,x"])
def test_a_world_size_that_is_not_a_whole_number_from_1_is_refused_before_collection(pytester, value):
    pytester.makepyfile(test_facts=FACTS)

    result = pytester.runpytest(*PLUGIN, f"--world-size={value}")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--world-size / DDPPROBE_WORLD_SIZES={value!r}*whole numbers >= 1*"])
    assert "collected" not in result.stdout.str()


def test_a_world_size_no_test_is_parametrised_with_is_refused(pytester):
    """``--world-size 5`` when facts exist only at 1, 2 and 3: a usage error saying so, and nothing runs
    (it used to exit 0 after running only the tests without a world size)."""
    pytester.makepyfile(test_facts=FACTS)

    result = pytester.runpytest(*PLUGIN, "--world-size", "5")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--world-size 5: no collected test is parametrised with world size 5 (world sizes present: 1, 2, 3)*"]
    )


@pytest.mark.integration
def test_a_world_size_no_test_has_is_refused_under_xdist_too(pytester):
    """Under pytest-xdist the workers collect; the controller reports their refusal and exits with 4."""
    pytester.makepyfile(test_facts=FACTS)

    result = pytester.runpytest_subprocess(*PLUGIN, "-n", "2", "--world-size", "2,5")

    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stdout.fnmatch_lines(["*ERROR: --world-size 2,5: no collected test is parametrised with world size 5*"])
    result.assert_outcomes()


def test_a_world_size_keeps_its_facts_and_the_tests_without_a_world_size(pytester, monkeypatch):
    _fake_cuda(monkeypatch, 0)
    pytester.makepyfile(test_facts=FACTS)

    result = pytester.runpytest(*PLUGIN, "--world-size", "2", "-v")

    result.assert_outcomes(passed=1, skipped=3, deselected=2)
    result.stdout.fnmatch_lines(["*test_world[[]2[]] PASSED*"])


# --- --lightning ------------------------------------------------------------------------------------


def test_an_unknown_lightning_package_is_refused_naming_the_value(pytester):
    pytester.makepyfile(test_facts="def test_x(): pass\n")

    result = pytester.runpytest(*PLUGIN, "--lightning", "lightning_fabric")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*--lightning / DDPPROBE_LIGHTNING: Lightning package 'lightning_fabric'*"
            "is not one of pytorch_lightning, lightning*"
        ]
    )


# --- launch settings: one resolver, refused as usage errors ----------------------------------------


@pytest.mark.parametrize(
    "args, environ, message",
    [
        (
            ["--world-timeout", "5", "--pg-timeout", "10"],
            {},
            "*pg_timeout=10s (--pg-timeout) must be shorter than timeout=5s (--world-timeout)*",
        ),
        (["--backend", "mpi"], {}, "*backend='mpi' (--backend) is not supported; use one of gloo, nccl*"),
        ([], {"DDPPROBE_BACKEND": "mpi"}, "*backend='mpi' (environment variable DDPPROBE_BACKEND)*"),
        ([], {"DDPPROBE_TIMEOUT": "soon"}, "*timeout='soon' (environment variable DDPPROBE_TIMEOUT) is not a number*"),
        (["--start-method", "fork"], {}, "*start_method='fork' (--start-method) is not supported*"),
    ],
)
def test_a_bad_launch_setting_is_a_usage_error_naming_the_option_or_variable(
    pytester, monkeypatch, args, environ, message
):
    """The plugin resolves the settings with ``ddpprobe.launch.resolve_settings`` before collection and
    turns its ``SettingsError`` into pytest's usage error (exit code 4), message unchanged."""
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    pytester.makepyfile(test_facts="def test_x(): pass\n")

    result = pytester.runpytest(*PLUGIN, *args)

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
