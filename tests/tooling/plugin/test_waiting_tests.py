"""Tests that wait for a timeout run side by side (ddpprobe/plugin/_waiting.py): the controller finds them from
their marker in the source, ``-n auto`` adds workers for them, and the scheduler deals them into groups of their
own, sent first, while every other test is a unit of its own."""

import types

import pytest

from ddpprobe.plugin import _waiting

pytestmark = pytest.mark.not_a_fact("tests how the plugin schedules waiting tests, not a fact about DDP")

SOURCE = """
import pytest

@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.waits_for_timeout
def test_hangs(world_size):
    pass

def test_quick():
    pass

class TestGroup:
    @pytest.mark.waits_for_timeout()
    def test_method(self):
        pass
"""


def _write(folder, name: str, text: str) -> str:
    path = folder / name
    path.write_text(text)
    return str(path)


def test_the_marked_functions_of_a_file_are_found_and_the_others_are_not(tmp_path):
    path = _write(tmp_path, "test_some.py", SOURCE)
    assert _waiting.waiting_functions(path) == {"test_hangs", "test_method"}
    assert _waiting.waits("test_some.py::test_hangs[2]", str(tmp_path))
    assert _waiting.waits("test_some.py::TestGroup::test_method", str(tmp_path))
    assert not _waiting.waits("test_some.py::test_quick", str(tmp_path))


def test_a_module_pytestmark_marks_every_test_of_the_file_and_a_file_without_the_marker_none(tmp_path):
    marked = _write(tmp_path, "test_all.py", "import pytest\npytestmark = [pytest.mark.waits_for_timeout]\n")
    plain = _write(tmp_path, "test_none.py", "def test_x():\n    pass\n")
    assert _waiting.waiting_functions(marked) == {"*"}
    assert _waiting.waits("test_all.py::test_anything", str(tmp_path))
    assert _waiting.waiting_functions(plain) == frozenset()


def _config(tmp_path, args):
    return types.SimpleNamespace(
        rootpath=tmp_path,
        args=args,
        getini=lambda name: ["."] if name == "testpaths" else [],
        invocation_params=types.SimpleNamespace(dir=tmp_path),
    )


def test_auto_workers_are_the_cores_plus_the_waiting_workers_only_when_a_selected_file_waits(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setenv("DDPPROBE_WAITING_WORKERS", "3")
    (tmp_path / "waits").mkdir()
    (tmp_path / "quick").mkdir()
    _write(tmp_path / "waits", "test_some.py", SOURCE)
    _write(tmp_path / "quick", "test_none.py", "def test_x():\n    pass\n")
    assert _waiting.auto_num_workers(_config(tmp_path, [])) == _waiting.cores() + 3
    assert _waiting.auto_num_workers(_config(tmp_path, ["waits/test_some.py::test_hangs"])) == _waiting.cores() + 3
    assert _waiting.auto_num_workers(_config(tmp_path, ["quick"])) is None
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "5")
    assert _waiting.auto_num_workers(_config(tmp_path, [])) is None


def test_the_scheduler_deals_waiting_tests_into_groups_sent_first_and_keeps_every_other_test_alone(tmp_path):
    pytest.importorskip("xdist", reason="the scheduler is pytest-xdist's")
    _write(tmp_path, "test_some.py", SOURCE)
    config = types.SimpleNamespace(
        rootpath=tmp_path,
        getvalue=lambda name: {"dist": "load", "tx": ["popen"] * (_waiting.cores() + 2)}.get(name),
        option=types.SimpleNamespace(loadscopereorder=True),
    )
    config.getoption = lambda name, default=None: config.getvalue(name.lstrip("-"))
    scheduler = _waiting.make_scheduler(config, None)
    ids = ["test_some.py::test_quick", "test_some.py::test_hangs[2]", "test_some.py::test_hangs[3]"]
    ids.append("test_some.py::TestGroup::test_method")
    scopes = [scheduler._split_scope(nodeid) for nodeid in ids]
    assert scopes == ["test_some.py::test_quick", "waits-0", "waits-1", "waits-0"]
    assert [scheduler._split_scope(nodeid) for nodeid in ids] == scopes  # the same scope when a test completes
    config.getvalue = lambda name: "loadfile" if name == "dist" else None
    assert _waiting.make_scheduler(config, None) is None
