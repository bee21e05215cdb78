"""One settings resolver: backend, world timeout, process-group timeout and start method come from the
argument, else the ``DDPPROBE_*`` environment variable, else the default, for ``run_world``, the pytest
plugin and ``python -m ddpprobe.launch`` alike; a bad value is refused with one error type naming the
value, where it came from and the fix. (ddpprobe/launch/_settings.py ``resolve_settings``.)"""

import pytest

from ddpprobe.launch import (
    DEFAULT_TIMEOUT_S,
    Settings,
    SettingsError,
    WorldTimeout,
    resolve_settings,
    run_world as api_run_world,
)
from ddpprobe.launch._external import main as launch_main
from tests.support import scenarios

pytestmark = pytest.mark.not_a_fact("tests how the launcher reads its settings, not a fact about DDP")


@pytest.mark.parametrize(
    "arguments, environ, expected",
    [
        ({}, {}, Settings("gloo", DEFAULT_TIMEOUT_S, DEFAULT_TIMEOUT_S / 2, "forkserver")),
        ({}, {"DDPPROBE_TIMEOUT": "30"}, Settings("gloo", 30.0, 15.0, "forkserver")),
        ({"timeout": 40}, {"DDPPROBE_TIMEOUT": "30"}, Settings("gloo", 40.0, 20.0, "forkserver")),
        ({}, {"DDPPROBE_TIMEOUT": "30", "DDPPROBE_PG_TIMEOUT": "7"}, Settings("gloo", 30.0, 7.0, "forkserver")),
        ({"pg_timeout": 3}, {"DDPPROBE_PG_TIMEOUT": "7"}, Settings("gloo", 120.0, 3.0, "forkserver")),
        ({}, {"DDPPROBE_BACKEND": "nccl"}, Settings("nccl", 120.0, 60.0, "spawn")),
        ({"backend": "gloo"}, {"DDPPROBE_BACKEND": "nccl"}, Settings("gloo", 120.0, 60.0, "forkserver")),
        ({}, {"DDPPROBE_START_METHOD": "spawn"}, Settings("gloo", 120.0, 60.0, "spawn")),
        (
            {"start_method": "forkserver"},
            {"DDPPROBE_START_METHOD": "spawn"},
            Settings("gloo", 120.0, 60.0, "forkserver"),
        ),
        ({}, {"DDPPROBE_TIMEOUT": "", "DDPPROBE_BACKEND": ""}, Settings("gloo", 120.0, 60.0, "forkserver")),
    ],
)
def test_each_setting_comes_from_the_argument_else_the_environment_else_the_default(arguments, environ, expected):
    assert resolve_settings(**arguments, environ=environ) == expected


@pytest.mark.parametrize(
    "arguments, environ, names",
    [
        ({"backend": "mpi"}, {}, ["backend='mpi'", "argument backend", "gloo, nccl"]),
        ({}, {"DDPPROBE_BACKEND": "mpi"}, ["backend='mpi'", "DDPPROBE_BACKEND", "gloo, nccl"]),
        ({}, {"DDPPROBE_TIMEOUT": "abc"}, ["timeout='abc'", "DDPPROBE_TIMEOUT", "e.g. 60"]),
        ({}, {"DDPPROBE_TIMEOUT": "-5"}, ["timeout='-5'", "DDPPROBE_TIMEOUT", "from 0.01 to 604800"]),
        ({}, {"DDPPROBE_PG_TIMEOUT": "nan"}, ["pg_timeout='nan'", "DDPPROBE_PG_TIMEOUT"]),
        ({"timeout": 0}, {}, ["timeout=0", "argument timeout", "from 0.01"]),
        (
            {"timeout": 10},
            {"DDPPROBE_PG_TIMEOUT": "10"},
            ["pg_timeout=10s", "DDPPROBE_PG_TIMEOUT", "argument timeout", "lower pg_timeout or raise timeout"],
        ),
        ({}, {"DDPPROBE_START_METHOD": "fork"}, ["start_method='fork'", "DDPPROBE_START_METHOD", "forkserver, spawn"]),
    ],
)
def test_a_bad_setting_is_refused_naming_the_value_its_source_and_the_fix(arguments, environ, names):
    with pytest.raises(SettingsError) as refused:
        resolve_settings(**arguments, environ=environ)
    for name in names:
        assert name in str(refused.value), str(refused.value)


def test_a_setting_of_the_wrong_type_is_also_a_type_error_and_an_option_is_named_as_given():
    with pytest.raises(TypeError, match=r"timeout must be a number of seconds, got str '5'"):
        resolve_settings(timeout="5", environ={})
    with pytest.raises(SettingsError, match=r"timeout=0 \(--world-timeout\)"):
        resolve_settings(timeout=0, environ={}, names={"timeout": "--world-timeout"})


@pytest.mark.integration
def test_run_world_takes_its_timeouts_from_the_environment(monkeypatch):
    """``DDPPROBE_TIMEOUT`` and ``DDPPROBE_PG_TIMEOUT`` reach ``run_world`` when no argument is given:
    a world whose rank 1 never joins rank 0's all_reduce is ended after 2 s, not 120."""
    monkeypatch.setenv("DDPPROBE_TIMEOUT", "2")
    monkeypatch.setenv("DDPPROBE_PG_TIMEOUT", "1.5")
    with pytest.raises(WorldTimeout, match=r"timed out after 2s"):
        api_run_world(scenarios.hang_on, 2, rank=1)


@pytest.mark.parametrize(
    "argv, environ, names",
    [
        (["--timeout", "0"], {}, ["timeout=0", "--timeout"]),
        ([], {"DDPPROBE_TIMEOUT": "soon"}, ["timeout='soon'", "DDPPROBE_TIMEOUT"]),
        (["--timeout", "10", "--pg-timeout", "20"], {}, ["pg_timeout=20s", "--pg-timeout", "--timeout"]),
    ],
)
def test_python_m_ddpprobe_launch_reads_the_same_settings(argv, environ, names, monkeypatch, capsys):
    """``python -m ddpprobe.launch`` (under torchrun) refuses bad settings like ``run_world``, with exit
    code 2, before looking for the external world; its timeout follows ``DDPPROBE_TIMEOUT``."""
    for name in ("DDPPROBE_TIMEOUT", "DDPPROBE_PG_TIMEOUT", "DDPPROBE_BACKEND", "DDPPROBE_START_METHOD"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        launch_main(["tests.support.scenarios:identity", *argv])

    assert exited.value.code == 2
    err = capsys.readouterr().err
    for name in names:
        assert name in err, err
