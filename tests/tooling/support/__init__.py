"""Tests of the tests' own support code (tests/support/): the oracle and gloo's error wording."""
