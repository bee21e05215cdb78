"""What ``import ddpprobe.guard`` loads in a user's training job: the guard, the trace (it classifies each
collective), the hazard registry (the fix lines) and the DDP contract (its state checks), and no other
room of ddpprobe (the launcher, the probes, the audit, the card), the way a pytest-xdist worker's
``remote.py`` imports nothing of the controller. Checked in a fresh interpreter, since this test session
has imported everything already.
"""

import json
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.not_a_fact("tests what the guard imports, not a fact about DDP"),
    pytest.mark.integration,  # a fresh interpreter importing torch and Lightning: seconds
]

#: The guard's own modules.
GUARD_MODULES = {
    f"ddpprobe.guard{m}" for m in ("", "._callback", "._entries", "._errors", "._exchange", "._state", "._writers")
}
#: What else of ddpprobe it may load: the package itself, the choice of Lightning package, the support range's
#: check (ddpprobe/_support.py), and these rooms.
ALLOWED = {"ddpprobe", "ddpprobe._lightning", "ddpprobe._support"}
ROOMS = ("ddpprobe.trace", "ddpprobe.hazards", "ddpprobe.contract")

_LOADED = (
    "import json, sys, ddpprobe.guard; "
    "print(json.dumps(sorted(m for m in sys.modules if m == 'ddpprobe' or m.startswith('ddpprobe.'))))"
)


def test_import_ddpprobe_guard_loads_the_guard_the_trace_the_hazard_registry_and_the_contract_only():
    """A fresh ``python -c "import ddpprobe.guard"`` loads exactly the seven guard modules, ``ddpprobe``,
    ``ddpprobe._lightning`` and ``ddpprobe._support``, and modules of ``ddpprobe.trace``, ``ddpprobe.hazards`` and
    ``ddpprobe.contract`` (loaded without Lightning: ddpprobe/contract/__init__.py): nothing of
    ``ddpprobe.launch``, ``ddpprobe.probes``, ``ddpprobe.audit`` or ``ddpprobe.card`` (``ddpprobe``'s own
    ``run_world`` and errors are imported from the launcher on first use)."""
    out = subprocess.run([sys.executable, "-c", _LOADED], capture_output=True, text=True, timeout=120, check=True)
    loaded = set(json.loads(out.stdout.splitlines()[-1]))

    assert {m for m in loaded if m.startswith("ddpprobe.guard")} == GUARD_MODULES, sorted(loaded)
    others = {m for m in loaded - GUARD_MODULES - ALLOWED if not any(m == r or m.startswith(r + ".") for r in ROOMS)}
    assert others == set(), f"import ddpprobe.guard also loads {sorted(others)}"
    assert {"ddpprobe.trace", "ddpprobe.hazards", "ddpprobe.contract"} <= loaded, sorted(loaded)


def test_the_launchers_names_are_still_importable_from_ddpprobe():
    """``from ddpprobe import run_world, RankFailed`` (the README's first lines) imports the launcher then."""
    code = "import sys, ddpprobe; from ddpprobe import RankFailed, run_world; print('ddpprobe.launch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["True"], out
