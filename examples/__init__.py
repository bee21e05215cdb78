"""Example LightningModules for ``ddpprobe audit``.

- ``seed_f1_module`` / ``seed_f1_module_lightning``: the seed question's F1 module, written with
  ``pytorch_lightning`` and with ``lightning`` (``import lightning as L``); ``corrected_f1_module``: its
  correction with torchmetrics objects.
- ``multilabel_original_module`` / ``multilabel_corrected_module``: the original question's per-label
  best-threshold F1, precision and recall, and its correction.
- ``reported_cases``: small modules modelled on public DDP bug reports, each a test input of the audit.
- ``mixed_packages_module``: a module mixing both Lightning packages, which the audit refuses.

Where your code writes ``import pytorch_lightning as pl``, these modules take ``pl`` from ``ddpprobe._lightning``:
``pytorch_lightning``, or ``lightning.pytorch`` when ddpprobe runs that (``DDPPROBE_LIGHTNING=lightning``), so the
tests audit the same example under either package (one process runs one of them). ``seed_f1_module_lightning`` and
``mixed_packages_module`` import their packages themselves: the package is their point.

Run them with, e.g.::

    python -m ddpprobe audit examples.seed_f1_module:make_model --data examples.seed_f1_module:make_data
    python -m ddpprobe audit examples.corrected_f1_module:make_model --data examples.corrected_f1_module:make_data
"""
