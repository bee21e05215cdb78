"""The audit and the external-world command line on odd input, without launching a world: options refused
before any factory runs, keys nothing stored, non-finite values in --json, --params that is not a JSON
object, a DDPPROBE_NO_EXTERNAL_WORLD that is neither on nor off."""

import json
import math
import re
import time

import pytest

from ddpprobe.audit import NOT_STORED, AuditInputError, AuditResult, audit
from ddpprobe.audit.causes import _verdict
from ddpprobe.audit.worlds._worlds import Worlds

pytestmark = pytest.mark.not_a_fact("tests the audit's and the launcher's input handling, not a fact about DDP")

#: A factory that cannot be imported: an option checked first is reported instead of this.
MISSING = "examples.missing:make_model"


@pytest.mark.parametrize(
    "options, named",
    [
        (dict(world_size=1000), r"world_size=1000 \(--world-size\).*2 <= world_size <= 64"),
        (dict(stage="fit", max_epochs=-1), r"max_epochs=-1 \(--max-epochs\) must be an int of 1 or more"),
        (dict(max_epochs=0), r"max_epochs=0 "),
        (dict(seed=-1), r"seed=-1 \(--seed\) must be an int from 0 to 4294967295"),
        (dict(seed=2**32), r"seed=4294967296 "),
        (dict(timeout=float("nan")), r"timeout=nan \(timeout= / --timeout\)"),
        (dict(timeout=-1.0), r"timeout=-1\.0 "),
        (dict(backend="mpi"), r"backend='mpi' \(backend= / --backend\).*gloo, nccl"),
    ],
)
def test_a_bad_option_is_refused_naming_it_before_any_factory_runs(options, named):
    """Each bad option raises ``AuditInputError`` naming the value and the range, in well under a second:
    before the factories are imported (an unimportable factory would be reported otherwise) and before
    the single-process world, instead of after it (world size), at the world timeout (``max_epochs=-1``
    trains forever) or in every rank (``seed_everything`` raising)."""
    start = time.monotonic()
    with pytest.raises(AuditInputError, match=named):
        audit(MISSING, MISSING, **options)
    assert time.monotonic() - start < 2


def make_validation_only_module():
    """A LightningModule with validation_step only (no training_step, test_step, predict_step or forward)."""
    import torch

    from ddpprobe._lightning import pl

    class ValidationOnly(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def validation_step(self, batch, batch_idx):
            pass

    return ValidationOnly()


def make_loader():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    return DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=2)


@pytest.mark.parametrize(
    "stage, named",
    [
        ("test", r"without test_step, which Trainer\.test needs.*--stage validate"),
        ("predict", r"without predict_step \(or forward\), which Trainer\.predict needs"),
        ("fit", r"without training_step, which Trainer\.fit needs"),
    ],
)
def test_a_module_without_the_stages_step_is_refused_naming_it_before_any_world_starts(stage, named):
    """``--stage test`` on a module without ``test_step`` (and likewise predict, fit) is bad input: the
    audit names the missing method and the stages the module has, in this process, instead of running
    three worlds that each raise Lightning's MisconfigurationException and exiting 1."""
    here = "tests.tooling.audit.test_audit_edges"
    start = time.monotonic()
    with pytest.raises(AuditInputError, match=named):
        audit(f"{here}:make_validation_only_module", f"{here}:make_loader", stage=stage)
    assert time.monotonic() - start < 10


def make_module_reading_argv():
    """A factory that parses the command line, as a training script's main would."""
    import argparse

    argparse.ArgumentParser(prog="train").parse_args(["--no-such-option"])
    return make_validation_only_module()


def test_a_factory_calling_sys_exit_is_bad_input_naming_it_instead_of_ending_the_audit():
    """A factory whose argparse rejects the audit's command line raises ``SystemExit``; the audit reports
    it as bad input naming the factory and the exit code, instead of exiting with argparse's usage text
    of another program as its only output."""
    here = "tests.tooling.audit.test_audit_edges"
    named = r"the model factory '.*:make_module_reading_argv' called sys\.exit\(2\).*without reading sys\.argv"
    with pytest.raises(AuditInputError, match=named):
        audit(f"{here}:make_module_reading_argv", f"{here}:make_loader")


def _record(callback_metrics: dict) -> dict:
    call = {
        "name": "v",
        "hook": "validation_step",
        "on_step": False,
        "on_epoch": True,
        "sync_dist": True,
        "reduce_fx": "mean",
        "rank_zero_only": False,
        "metric_object": False,
        "calls": 2,
    }
    return {"log_calls": [call], "callback_metrics": callback_metrics}


def test_a_key_no_run_stored_is_a_problem_naming_the_dataloader_keys_not_equal_to_single_process():
    """With several validation dataloaders Lightning stores ``self.log("v", ...)`` as
    ``v/dataloader_idx_0`` and ``v/dataloader_idx_1``: ``callback_metrics["v"]`` is missing at W=1 and on
    every rank. Two missing values compare nothing, so the row is ``NOT_STORED`` (a problem) naming the
    keys that were stored, not "synced, equals single-process"."""
    stored = {"v/dataloader_idx_0": 1.0, "v/dataloader_idx_1": 2.0}
    (row,) = _verdict.rows(Worlds.of_records(_record(stored), [_record(stored), _record(stored)]))

    assert row.verdict == NOT_STORED and row.problem, row
    assert "['v/dataloader_idx_0', 'v/dataloader_idx_1']" in row.cause, row.cause


def test_json_output_is_standard_json_with_non_finite_values_as_strings():
    """A logged NaN or infinity is written as ``"nan"`` / ``"inf"`` / ``"-inf"``: ``--json`` stays
    parseable by strict JSON readers (RFC 8259 has no NaN), and the value is still readable."""
    (row,) = _verdict.rows(
        Worlds.of_records(_record({"v": float("nan")}), [_record({"v": float("inf")}), _record({"v": float("-inf")})])
    )
    result = AuditResult(
        model="m:f",
        data="d:f",
        stage="validate",
        world_size=2,
        backend="gloo",
        rows=[row],
        stdout_lines={},
        stdout_samples=[],
        removed_hooks=[],
        loaders={},
        raised={"single": None, "world": [None, None]},
        experiment_calls=[],
        logger_metrics=[],
        sync_dist_warnings=[],
    )

    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    report = json.loads(result.to_json(), parse_constant=refuse)
    assert (report["rows"][0]["single"], report["rows"][0]["per_rank"]) == ("nan", ["inf", "-inf"])
    assert math.isnan(row.single)  # the result itself keeps floats


@pytest.mark.parametrize(
    "params, named",
    [
        ("notjson", r"--params 'notjson' is not JSON"),
        ("[1]", r"--params '\[1\]' is a JSON list, not an object"),
    ],
)
def test_launch_command_line_refuses_params_that_are_not_a_json_object_naming_them(params, named, capsys):
    """``python -m ddpprobe.launch SCENARIO --params ...`` exits 2 with a usage error naming the text,
    checked before it looks for the external world, instead of a JSONDecodeError traceback on every rank."""
    from ddpprobe.launch._external import main

    with pytest.raises(SystemExit) as exited:
        main(["tests.support.scenarios:identity", "--params", params])
    assert exited.value.code == 2
    assert re.search(named, capsys.readouterr().err)


TORCHRUN_RANK_1_OF_2 = {
    "TORCHELASTIC_RUN_ID": "x",
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "GROUP_RANK": "0",
    "LOCAL_WORLD_SIZE": "2",
}


@pytest.mark.parametrize(
    "value, detected",
    [("1", False), ("YES", False), ("true", False), ("0", True), ("false", True), ("no", True), ("", True)],
)
def test_no_external_world_switch_reads_0_and_false_as_off_not_as_set(value, detected):
    """``DDPPROBE_NO_EXTERNAL_WORLD=0`` (or ``false``, ``no``) leaves the detection of a torchrun/srun world
    on, as the name promises; only 1/true/yes turn it off (a non-empty ``0`` used to turn it off)."""
    from ddpprobe.launch import external_world

    world = external_world({**TORCHRUN_RANK_1_OF_2, "DDPPROBE_NO_EXTERNAL_WORLD": value})
    assert (world is not None) == detected, world


def test_no_external_world_switch_with_junk_is_refused_naming_it():
    from ddpprobe.launch import external_world

    with pytest.raises(ValueError, match=r"DDPPROBE_NO_EXTERNAL_WORLD='maybe' is neither on nor off; set it to 1"):
        external_world({**TORCHRUN_RANK_1_OF_2, "DDPPROBE_NO_EXTERNAL_WORLD": "maybe"})


def test_the_audit_says_which_world_it_starts_and_its_time_limit_before_each_world():
    """``progress`` gets one line before each world (the command line prints them to stderr), naming the
    stage, W and the time limit, so a module that hangs is not waited for in silence."""
    here = "tests.tooling.audit.test_audit_edges"
    lines = []
    audit(f"{here}:make_validation_only_module", f"{here}:make_loader", timeout=60, progress=lines.append)

    assert lines == [
        f"running validate of {here}:make_validation_only_module at W=1 (single process, at most 60 s; "
        "--timeout changes it)",
        f"running validate of {here}:make_validation_only_module at W=2 (2 ranks, at most 60 s; --timeout changes it)",
    ], lines


def test_nccl_with_fewer_cuda_devices_than_ranks_is_refused_naming_the_world_size(monkeypatch):
    """``--backend nccl --world-size 2`` on a machine with fewer than 2 CUDA devices is refused before the
    factories run, naming the requested world size (not the W=1 world's) and ``--backend gloo``."""
    import ddpprobe.launch

    monkeypatch.setattr(ddpprobe.launch, "cuda_device_count", lambda: 1)
    named = r"--world-size 2 but this machine has 1 CUDA device\(s\); use --backend gloo"
    with pytest.raises(AuditInputError, match=named):
        audit(MISSING, MISSING, backend="nccl")


@pytest.mark.parametrize(
    "env",
    [
        {"GLOO_SOCKET_IFNAME": "eth0"},
        {"MASTER_ADDR": "0.0.0.0"},
        {"RANK": "0"},
        {"WORLD_SIZE": "3", "OMP_NUM_THREADS": "2"},
    ],
)
def test_run_world_env_cannot_replace_the_launchers_own_variables(env):
    """``run_world(env=...)`` that sets a variable the launcher sets to describe the world (rank, world size,
    the loopback rendezvous, gloo's interface) is refused before any rank starts, naming it: otherwise two
    ranks could both be rank 0 and wait for each other until the process-group timeout, or gloo could
    listen on a non-loopback interface. Other variables (``OMP_NUM_THREADS``) stay allowed."""
    from ddpprobe import run_world
    from tests.support import scenarios

    clash = next(k for k in env if k != "OMP_NUM_THREADS")
    with pytest.raises(ValueError, match=rf"env sets {clash}={env[clash]!r}, which the launcher sets in every rank"):
        run_world(scenarios.identity, 2, env=env)
