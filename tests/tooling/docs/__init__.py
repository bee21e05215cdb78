"""Tests that the README and docs/ say what the suite does: counts, console transcripts, the install advice."""
