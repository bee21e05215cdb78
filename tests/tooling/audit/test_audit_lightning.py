"""The audit runs the Lightning package the user's module is written for: ``pytorch_lightning`` or the
unified ``lightning`` (``import lightning as L``). It reads the package from the module's base class
(``ddpprobe._lightning.trainer_package_of``) and chooses it before any world starts, so the ranks run
that package's Trainer. Each audit here is a fresh ``python -m ddpprobe audit`` process: one process
runs one of the two packages."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from ddpprobe import audit as ddp_audit

pytestmark = [
    pytest.mark.not_a_fact("tests the audit command, not a fact about DDP"),
    pytest.mark.skipif(
        importlib.util.find_spec("lightning") is None,
        reason="the lightning package is not installed (pip install -e '.[lightning]')",
    ),
]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _cli_json(module: str, *extra) -> tuple:
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("DDPPROBE_LIGHTNING", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddpprobe",
            "audit",
            f"{module}:make_model",
            "--data",
            f"{module}:make_data",
            "--json",
            *extra,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.integration
def test_the_lightning_version_of_the_seed_module_gets_the_same_verdicts_and_values_as_the_pytorch_lightning_one():
    """``examples/seed_f1_module_lightning.py`` (``L.LightningModule``) and ``examples/seed_f1_module.py``
    (``pytorch_lightning.LightningModule``): the audit runs ``lightning`` for the first and
    ``pytorch_lightning`` for the second, and both give the same rows (verdicts, per-rank values),
    the same experiment writes and exit code 1."""
    runs = {}
    for module in ("examples.seed_f1_module_lightning", "examples.seed_f1_module"):
        code, out, err = _cli_json(module)
        assert code == 1, err[-3000:]
        runs[module] = json.loads(out)
    lightning, classic = runs["examples.seed_f1_module_lightning"], runs["examples.seed_f1_module"]
    assert (lightning["lightning"], classic["lightning"]) == ("lightning", "pytorch_lightning")

    def rows(report):
        return [(r["key"], r["level"], r["verdict"], r["single"], r["per_rank"]) for r in report["rows"]]

    assert rows(lightning) == rows(classic)
    assert {r["key"]: r["verdict"] for r in lightning["rows"]} == {
        "val_f1_batch": ddp_audit.SYNCED_DIFFERS,
        "val_f1": ddp_audit.RANK_DIVERGENT,
    }
    assert lightning["experiment_calls"] == classic["experiment_calls"]
    assert lightning["removed_hooks"] == classic["removed_hooks"]


@pytest.mark.integration
def test_a_module_mixing_both_packages_is_refused_with_exit_code_2():
    """``examples/mixed_packages_module.py``: a LightningModule class deriving from both packages'
    classes. Exit code 2 before any world starts, the message says to import every Lightning class
    from one package."""
    code, out, err = _cli_json("examples.mixed_packages_module", "--world-size", "2")
    assert code == 2 and out == "", err
    assert "both pytorch_lightning and lightning.pytorch" in err and "one package" in err, err


#: Loads what ``ddpprobe audit`` loads before it reads the user's module (the audit's runner and the trace),
#: then prints which Lightning trainer packages are imported.
_LOADED_BEFORE_CHOICE = (
    "import json, sys, ddpprobe.audit, ddpprobe.audit._pipeline, ddpprobe.trace; "
    "print(json.dumps(sorted(m for m in ('pytorch_lightning', 'lightning.pytorch') if m in sys.modules)))"
)


@pytest.mark.integration
def test_loading_the_audit_and_the_trace_imports_no_lightning_package_so_the_users_module_can_choose():
    """The audit chooses ``lightning`` or ``pytorch_lightning`` from the user's module *after* loading its own
    runner and the trace; had loading them imported ``pytorch_lightning`` (a module-level
    ``from ddpprobe._lightning import pl``), a ``lightning.pytorch`` module would be refused with "ddpprobe
    already runs 'pytorch_lightning' in this process" in a fresh process. A fresh interpreter that loads
    ``ddpprobe.audit``, its runner and ``ddpprobe.trace`` has imported neither trainer package."""
    env = {k: v for k, v in os.environ.items() if k != "DDPPROBE_LIGHTNING"}
    out = subprocess.run(
        [sys.executable, "-c", _LOADED_BEFORE_CHOICE], capture_output=True, text=True, timeout=120, env=env, check=True
    )
    assert json.loads(out.stdout.splitlines()[-1]) == [], out.stdout
