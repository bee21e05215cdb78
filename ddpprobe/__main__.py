"""Command line: ``python -m ddpprobe audit MODEL_FACTORY [--data DATA_FACTORY] [options]`` (or ``ddpprobe audit``);
without ``--data`` the module's own ``*_dataloader`` methods give the data.

Exit codes: 0 no problem found; 1 a problem found (a logged key rank-divergent, differing from the
single-process value or logged on some ranks only; the ranks' collectives diverging; data not sharded;
the stage raising or the world failing; a logged key no run stored); 2 bad input, reported before any
world starts (a factory that cannot be imported, raises or returns the wrong type; a module mixing both
Lightning packages; a Lightning release below the support range, ddpprobe/_support.py; a module without
the stage's step method; ``--world-size`` outside 2..64, since 1 would compare nothing; ``--max-epochs`` below
1; ``--seed`` outside 0..2**32-1; a bad ``--timeout``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddpprobe", description="Executable answers about PyTorch Lightning DDP.")
    sub = parser.add_subparsers(dest="command", required=True)
    audit = sub.add_parser(
        "audit",
        help="run your LightningModule at W=1 and W=N and report which logged values are rank-local, padded or wrong",
        description="Run one stage of your LightningModule in a single process and on --world-size ranks "
        "(fresh process groups), and report each logged key: its hook and self.log options, the value at "
        "W=1 and on every rank, and a verdict. Exit code 1 if a problem is found, 2 for bad input.",
    )
    audit.add_argument(
        "model",
        metavar="MODEL_FACTORY",
        help="'package.module:function' returning a LightningModule (called with no arguments)",
    )
    audit.add_argument(
        "--data",
        default=None,
        metavar="DATA_FACTORY",
        help="'package.module:function' returning a LightningDataModule, a DataLoader, "
        "or {'train': DataLoader, 'val': DataLoader} (default: the module's own *_dataloader methods)",
    )
    audit.add_argument(
        "--world-size", type=int, default=2, metavar="W", help="ranks of the distributed run, 2 or more (default 2)"
    )
    audit.add_argument(
        "--stage",
        choices=("validate", "fit", "test", "predict"),
        default="validate",
        help="Trainer method to run (default validate)",
    )
    audit.add_argument(
        "--limit-batches",
        type=int,
        default=None,
        metavar="K",
        help="run only the first K batches of each loader on each rank",
    )
    audit.add_argument("--max-epochs", type=int, default=1, metavar="E", help="epochs for --stage fit (default 1)")
    audit.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default="gloo",
        help="process-group backend: gloo (CPU, default) or nccl (one GPU per rank)",
    )
    audit.add_argument("--seed", type=int, default=0, help="seed_everything seed before the factories run (default 0)")
    audit.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds each world may run (default DDPPROBE_TIMEOUT or 120)",
    )
    audit.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    return parser


def main(argv: Optional[list] = None) -> int:
    """Run the command line; return the exit code (``python -m ddpprobe`` exits with it)."""
    args = _parser().parse_args(argv)
    from ddpprobe._support import UnsupportedLightning, require

    try:
        require("ddpprobe audit")  # before anything imports Lightning: a refusal takes milliseconds
    except UnsupportedLightning as exc:
        print(f"ddpprobe audit: error: {exc}", file=sys.stderr)
        return 2
    from ddpprobe.audit import AuditInputError, audit

    try:
        result = audit(
            args.model,
            args.data,
            world_size=args.world_size,
            stage=args.stage,
            backend=args.backend,
            limit_batches=args.limit_batches,
            max_epochs=args.max_epochs,
            seed=args.seed,
            timeout=args.timeout,
            progress=lambda line: print(f"ddpprobe audit: {line}", file=sys.stderr, flush=True),
        )
    except AuditInputError as exc:
        print(f"ddpprobe audit: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, RuntimeError) as exc:
        from ddpprobe.launch import RankFailed, WorldError

        print(f"ddpprobe audit: error: {exc}", file=sys.stderr)
        # run_world's own argument checks, and a factory raising in the ranks, are bad input (2); a world
        # that died or hung outside the stage is a finding about the module (1).
        return 1 if isinstance(exc, WorldError) and not isinstance(exc, RankFailed) else 2
    print(result.to_json() if args.json else result.format())
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
