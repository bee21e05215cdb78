"""How a fresh recording is compared with the stored one (tests/support/recordings.py ``differences``): what differs
from one live run of a scenario to the next is not a difference, anything else is, and a recording reads the same
in a checkout in another folder.

Each case writes two small recordings and compares them, in this process.
"""

import json
import os

import pytest

from tests.support import recordings

pytestmark = pytest.mark.not_a_fact("a test of how the tooling's recordings are compared, not a fact about DDP")


def _differences(tmp_path, stored: dict, fresh: dict) -> str:
    paths = []
    for name, found in (("stored", stored), ("fresh", fresh)):
        path = tmp_path / f"{name}.json"
        path.write_text(recordings.text_of(found))
        paths.append(str(path))
    return recordings.differences(*paths)


def _tensor(dtype: str, digest: str, norm: float) -> dict:
    return {"fields": {"param.w": {"dtype": dtype, "digest": digest, "norm": norm, "values": [norm, -norm]}}}


def test_floats_that_differ_in_their_last_bits_are_the_same_value_and_a_real_change_is_shown(tmp_path):
    """0.5717777013778687 and 0.5717777609825134 (float32 neighbours, as two runs' training gives them) compare
    equal, and so do 2.8e-08 and 2.0e-08 (a sum that cancels to about zero); 0.58 against 0.5717777 and 0.001
    against 2.8e-08 are shown in the diff with both values."""
    stored = {"states": [_tensor("float32", "aaaaaaaaaaaa", 0.5717777013778687)]}
    assert _differences(tmp_path, stored, {"states": [_tensor("float32", "bbbbbbbbbbbb", 0.5717777609825134)]}) == ""
    diff = _differences(tmp_path, stored, {"states": [_tensor("float32", "aaaaaaaaaaaa", 0.58)]})
    assert "-" in diff and "0.5717777013778687" in diff and "0.58" in diff, diff
    near_zero = {"sum": 2.7939677238464355e-08}  # a sum that cancels: only its terms' rounding is left
    assert _differences(tmp_path, near_zero, {"sum": 2.0489096641540527e-08}) == ""
    assert "0.001" in _differences(tmp_path, near_zero, {"sum": 0.001})


def test_the_digest_of_an_integer_tensor_is_compared_and_of_float_tensors_only_which_are_equal(tmp_path):
    """A float tensor's digest hashes values that differ in their last bits run to run, so its value is not compared
    (its norm and values are), but which float digests of one world are equal is: two ranks' equal weights recorded
    again as equal (other bits) is no difference, recorded as different is one; two worlds' digests are compared
    apart (one process's gradient equal to the ranks' by the order of its additions). An int64 tensor's digest is
    exact, so a different one is a difference."""
    assert _differences(tmp_path, {"s": _tensor("float32", "aaa", 1.5)}, {"s": _tensor("float32", "bbb", 1.5)}) == ""
    ranks = {"ranks": [_tensor("float32", "aaa", 1.5), _tensor("float32", "aaa", 1.5)]}
    again = {"ranks": [_tensor("float32", "ccc", 1.5), _tensor("float32", "ccc", 1.5)]}
    apart = {"ranks": [_tensor("float32", "ccc", 1.5), _tensor("float32", "ddd", 1.5)]}
    assert _differences(tmp_path, ranks, again) == ""
    diff = _differences(tmp_path, ranks, apart)
    lines = [line.replace(" ", "") for line in diff.splitlines()]
    assert '-"digest":"<digest1>",' in lines and '+"digest":"<digest2>",' in lines, diff
    one = {"worlds": {"first_step": _tensor("float32", "aaa", 1.5), "world": _tensor("float32", "aaa", 1.5)}}
    other = {"worlds": {"first_step": _tensor("float32", "eee", 1.5), "world": _tensor("float32", "fff", 1.5)}}
    assert _differences(tmp_path, one, other) == "", "equal digests of two worlds are a coincidence of float order"
    diff = _differences(tmp_path, {"s": _tensor("int64", "aaa", 3.0)}, {"s": _tensor("int64", "bbb", 3.0)})
    assert '"digest": "aaa"' in diff and '"digest": "bbb"' in diff, diff


def test_a_small_value_that_is_not_a_sum_is_compared_beyond_the_sums_floor(tmp_path):
    """Only a ``"sum"`` gets the floor of 1e-06 for cancelling terms: a learning rate of 2e-07 recorded again as
    1e-06 is a difference, and the same pair under ``"sum"`` is not."""
    assert "1e-06" in _differences(tmp_path, {"lr": 2e-07}, {"lr": 1e-06})
    assert _differences(tmp_path, {"sum": 2e-07}, {"sum": 1e-06}) == ""


def test_where_the_packages_are_installed_is_not_a_difference_and_the_users_file_is(tmp_path):
    """A traceback through ``/tmp/tmp.X/venv/lib/python3.11/site-packages/`` (CI's fresh environment) and through
    the checkout's ``.venv`` compare equal; a frame in another user file does not."""
    frame = '  File "{}/pytorch_lightning/trainer/trainer.py", line 702, in validate\n'
    ci = {"traceback": [frame.format("/tmp/tmp.ZgYu7wy2GB/venv/lib/python3.11/site-packages")]}
    here = {"traceback": [frame.format(os.path.join(recordings.ROOT, ".venv/lib/python3.11/site-packages"))]}
    assert _differences(tmp_path, here, ci) == ""
    user = {"traceback": ['  File "examples/reported_cases.py", line 228, in on_validation_epoch_end\n']}
    other = {"traceback": ['  File "examples/reported_cases.py", line 229, in on_validation_epoch_end\n']}
    assert "line 229" in _differences(tmp_path, user, other)


def test_a_recording_stores_the_checkouts_paths_as_the_checkout_mark_and_reads_them_back_under_this_checkout(tmp_path):
    """A path under the checkout is stored as ``<checkout>/...`` and one under the standard library as
    ``<stdlib>/...``, so a clone in another folder, or another interpreter's install, reads them under its own; a
    path elsewhere is stored as it is."""
    inside = f'  File "{os.path.join(recordings.ROOT, "examples", "reported_cases.py")}", line 228\n'
    stdlib = f'  File "{os.path.join(recordings.STDLIB, "threading.py")}", line 1\n'
    outside = '  File "/opt/elsewhere/threading.py", line 1\n'
    text = recordings.text_of({"traceback": [inside, stdlib, outside]})
    assert recordings.ROOT not in text and f'File \\"{recordings.ROOT_MARK}/examples/reported_cases.py' in text, text
    assert recordings.STDLIB not in text and f'File \\"{recordings.STDLIB_MARK}/threading.py' in text, text
    path = tmp_path / "r.json"
    path.write_text(text)
    assert recordings.read(str(path)) == {"traceback": [inside, stdlib, outside]}
    assert json.loads(text)["traceback"][2] == outside


class _Regression:
    """A stand-in for pytest-regressions' ``file_regression``: records what it was asked to compare."""

    def __init__(self):
        self.checked = []

    def check(self, text, fullpath, check_fn):
        self.checked.append(text)


def _hazard_recording(message: str, value: float) -> dict:
    world = {"error": None, "records": [{"raised": {"message": message}, "value": value}], "traces": []}
    return recordings.make("audit", {"model": "m", "stage": "validate", "world_size": 2}, worlds={"world": world})


def test_a_raising_world_that_ends_another_way_is_accepted_only_with_the_same_outcome(tmp_path):
    """A stored hazard world (a rank raised "Connection closed by peer") recorded again with another error text
    ("Timed out waiting") is the same scenario when the tool's outcome on both is the same, so nothing is compared
    byte for byte; with another outcome, or for a world that did not raise, the fresh recording goes to
    pytest-regressions, which shows the diff."""
    path = tmp_path / "stored.json"
    path.write_text(recordings.text_of(_hazard_recording("Connection closed by peer", 1.0)))
    fresh = _hazard_recording("Timed out waiting 6000ms", 1.0)

    same = _Regression()
    recordings.check_rerecorded(str(path), lambda scenario: fresh, same, outcome=lambda r: "diverge")
    assert same.checked == []

    other = _Regression()
    outcomes = iter(["diverge", "no problem"] * recordings.ATTEMPTS)
    recordings.check_rerecorded(str(path), lambda scenario: fresh, other, outcome=lambda r: next(outcomes))
    assert other.checked == [recordings.text_of(fresh)]

    calm = _hazard_recording("x", 1.0)
    calm["worlds"]["world"]["records"][0]["raised"] = None
    path.write_text(recordings.text_of(calm))
    calm_fresh = _Regression()
    recordings.check_rerecorded(str(path), lambda scenario: {**calm, "n": 1}, calm_fresh, outcome=lambda r: "same")
    assert len(calm_fresh.checked) == 1
