"""The docs tests that collect the suite in this process (``pytester.inline_run``): pytester removes the modules an
inline run imported when it returns, and numpy (imported by scipy under torchmetrics, which the probes use) refuses a
second import in one process ("cannot load module more than once per process"). The probes are imported here, once,
before any inline run, so every run finds them and their dependencies imported and keeps them."""

import ddpprobe.probes  # noqa: F401
