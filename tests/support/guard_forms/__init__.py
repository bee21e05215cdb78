"""Training scripts a new user writes from the README (``Trainer(strategy="ddp", callbacks=[CollectiveGuard()])``,
``python train.py``), one hazard each, for tests/tooling/guard/test_guard_forms_*.py. Each module holds the
user's LightningModule and its data as the user wrote them, and ``train(info, ...)``: the script's body, with
the Trainer joining the launcher's world (``ddp_trainer``: ``Trainer(strategy="ddp")`` with the world's
process-group timeout) and ``CollectiveGuard(timeout=...)`` short, so a hazard the guard missed ends in
seconds. They live in the test tree, outside the ``ddpprobe`` package, so their lines read as a user's code."""
