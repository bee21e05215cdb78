"""What a launch makes differ between the processes of one world, read without importing torch or Lightning, so
that the real-``torchrun`` side of the fidelity test (tests/tooling/audit/test_audit_fidelity.py) starts in a second.

Run as a script under ``torchrun`` (``python -m torch.distributed.run --standalone --nproc-per-node=2
tests/support/process_traits.py OUT``), each rank writes ``OUT/rank<RANK>.json``; as a ``run_world`` scenario
(:func:`process_traits`), each rank returns the same record.
"""

from __future__ import annotations

import json
import os
import sys

#: Strings whose ``set`` iterates in an order that depends on the interpreter's string-hash secret.
HASHED_NAMES = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")


def process_traits(info=None) -> dict:
    """``{"hash", "set_order", "pid", "rank"}``: the string-hash of a fixed string, the iteration order of a ``set``
    of :data:`HASHED_NAMES`, the pid and the environment's ``RANK``."""
    return {
        "hash": hash("ddpprobe"),
        "set_order": list(set(HASHED_NAMES)),
        "pid": os.getpid(),
        "rank": os.environ.get("RANK"),
    }


def set_order_under(seed: str) -> list:
    """The iteration order of ``set(HASHED_NAMES)`` in a fresh interpreter started with ``PYTHONHASHSEED=seed``."""
    import subprocess

    code = f"import json; print(json.dumps(list(set({HASHED_NAMES!r}))))"
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


if __name__ == "__main__":
    folder = sys.argv[1]
    with open(os.path.join(folder, f"rank{os.environ['RANK']}.json"), "w", encoding="utf-8") as fh:
        json.dump(process_traits(), fh)
