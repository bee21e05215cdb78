"""Every fix line the audit prints names a fact test that shows the fix gives the right value; these
tests check that each named test exists, and list the fixes that have none yet."""

import os
import re

import pytest

from ddpprobe.audit.causes._fixes import FIXES

pytestmark = pytest.mark.not_a_fact("tests the audit's advice, not a fact about DDP")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.mark.parametrize("fix", sorted(name for name, (_, test) in FIXES.items() if test))
def test_each_fix_line_names_a_fact_test_that_exists(fix):
    """The ``path::name`` of the fix's proving test is a file under tests/facts/ defining that test."""
    path, _, name = FIXES[fix][1].partition("::")
    assert path.startswith("tests/facts/"), path
    with open(os.path.join(REPO, path), encoding="utf-8") as handle:
        source = handle.read()
    assert re.search(rf"^def {re.escape(name)}\(", source, re.M), f"{name} is not defined in {path}"
