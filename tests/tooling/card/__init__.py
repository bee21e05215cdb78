"""Tests of the semantics card and the version matrix (ddpprobe/card/)."""
