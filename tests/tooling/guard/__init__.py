"""Tests of the guard (ddpprobe/guard/): hazards it catches, fixed twins unchanged, its store protocol."""
