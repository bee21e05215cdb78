"""Where the user's code last set an attribute of the module or the datamodule (ddpprobe/trace/_writers.py), the
line a contract break of that attribute names. In-process, no world."""

import sys

import pytest
import torch

from ddpprobe.trace._writers import AttributeWriters

pytestmark = pytest.mark.not_a_fact("tests the trace's record of attribute writers, not a fact about DDP")


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight_of_loss = 1.0


def test_the_last_set_of_each_public_attribute_of_the_watched_object_names_the_line_and_hook():
    watched, other = Holder(), Holder()
    writers = AttributeWriters(lambda frame: frame, lambda: "setup")
    writers.watch(watched, "module")
    try:
        watched.weight_of_loss = 2.0
        line = sys._getframe().f_lineno + 1
        watched.weight_of_loss = 3.0
        watched._private = 1
        other.weight_of_loss = 5.0
    finally:
        writers.unwatch()
    here = sys._getframe().f_code.co_name
    assert writers.last == {"module.attr.weight_of_loss": f"test_trace_writers.py:{line} in {here} (in setup)"}
    assert (watched.weight_of_loss, other.weight_of_loss, watched._private) == (3.0, 5.0, 1)


def test_library_sets_are_not_noted_and_unwatch_puts_the_classs_own_setattr_back():
    watched = Holder()
    writers = AttributeWriters(lambda frame: None, lambda: None)
    writers.watch(watched, "datamodule")
    writers.watch(None, "datamodule")
    try:
        watched.weight_of_loss = 2.0
    finally:
        writers.unwatch()
    assert writers.last == {}
    assert "__setattr__" not in Holder.__dict__ and Holder.__setattr__ is torch.nn.Module.__setattr__
