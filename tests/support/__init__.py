"""What the facts and the tooling tests share: :mod:`tests.support.oracle` computes expected values
without Lightning; :mod:`tests.support.scenarios` holds well-behaved and deliberately broken scenarios
for the launcher's own tests."""
