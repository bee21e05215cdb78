"""Tests of the audit (ddpprobe/audit/): its inputs, evidence, diagnoses, fixes and report."""
