"""``CollectiveGuard`` in a world torchrun launched: the guard finds the world's store through the process
group Lightning joined (torchrun's agent store, ``TORCHELASTIC_USE_AGENT_STORE``), whoever launched it."""

import pytest

from tests.support.torchrun import pytest_under_torchrun

pytestmark = pytest.mark.not_a_fact("tests the guard in a torchrun world, not a fact about DDP")


@pytest.mark.integration
def test_under_torchrun_the_guard_raises_on_both_ranks_and_its_fixed_twin_passes(tmp_path):
    """``torchrun --nproc-per-node 2 -m pytest`` on two guard tests: on both ranks the W=2 variant of
    "keys named after the rank raise CollectiveMismatch on every rank" and of its fixed twin pass (the
    records and errors came from both torchrun ranks, ddpprobe/launch/_external.py: inside torchrun the hazard's
    world runs there, not from its recording), and the W=3 variants skip with the reason (the integration run's
    variants selected too)."""
    selected = "(test_keys_named_after_the_rank_raise or test_the_same_keys_in_the_same_order_give) and validation_step"
    files = ["tests/tooling/guard/test_guard_hazards.py", "tests/tooling/guard/test_guard_twins.py"]
    proc, outputs = pytest_under_torchrun(
        tmp_path / "logs", [*files, "-m", "integration or not integration", "-k", selected], timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + "".join(o[-3000:] for o in outputs)
    assert len(outputs) == 2
    for out in outputs:
        assert "2 passed, 2 skipped" in out, out[-3000:]
        assert "this torchrun world has 2 ranks" in out
