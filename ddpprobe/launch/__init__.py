"""Room 1 — launch a world: W fresh rank processes joined in one process group, and their records.

``run_world(scenario, world_size, **params)`` starts the ranks, runs ``scenario(RankInfo, **params)``
in each and returns a ``WorldResult`` (or raises ``RankFailed`` / ``RankDied`` / ``WorldTimeout``, each
a ``WorldError`` with ``rank_errors``: every failed rank's full error text).

Several nodes on one host: ``run_world(scenario, world_size=4, num_nodes=2)`` forks 4 ranks that look
to Lightning like 2 nodes of 2: rank ``r`` gets ``RANK=r``, ``NODE_RANK=GROUP_RANK=r // 2``,
``LOCAL_RANK=r % 2``, ``WORLD_SIZE=4``, ``LOCAL_WORLD_SIZE=2``, and its ``RankInfo`` carries
``node_rank``, ``local_rank``, ``num_nodes`` (``devices`` = ranks per node), which
``ddpprobe.probes.ddp_trainer`` passes as ``Trainer(devices=..., num_nodes=...)``. Lightning's
``LightningEnvironment`` reads these (lightning_fabric/plugins/environments/lightning.py): global rank
= node_rank * devices + local_rank; ``num_nodes`` must divide ``world_size``; gloo only.

Settings (backend, timeout, process-group timeout, start method) are resolved in one place,
:func:`resolve_settings` (argument > ``DDPPROBE_*`` environment variable > default), which raises
:class:`SettingsError` naming the bad value, its source and the fix.

Public names (``__all__``): what users and the other rooms import. Users: ``run_world``, its results
(``WorldResult``, ``RankResult``) and errors (``WorldError``, ``RankFailed``, ``RankDied``, ``WorldTimeout``),
``RankInfo`` (what a scenario receives). The probes, the audit, the card, ``runif`` and the pytest plugin:
``resolve_settings``, ``Settings``, ``SettingsError``, ``BACKENDS``, ``START_METHODS``, ``DEFAULT_TIMEOUT_S``,
``MAX_WORLD_SIZE``, ``cuda_device_count``, ``external_world``, ``leave_external_world``; the pytest plugin's
one forkserver per run: ``start_shared_forkserver``, ``attach_forkserver``; its warm worlds: ``WarmWorld``,
``warm_call``, ``WarmCall``; its per-test log for benchmarks/bench_suite.py: ``world_usage``. The launcher's own
tests: ``RankMessage``, ``build_result``, ``STDERR_TAIL_LINES``.

Layout (everything prefixed with ``_`` is private; other modules import only the names above):

- ``_world.py``: ``run_world`` and the supervision of one launched world (start, wait, kill, reap);
- ``_arguments.py``: checks of the scenario, its parameters, world size, nodes, env, devices;
- ``_settings.py``: ``resolve_settings``, ``Settings``, ``SettingsError`` and the defaults;
- ``_rendezvous.py``: the loopback-only ``TCPStore`` and the world's private folder;
- ``_forkserver.py``: the preloaded forkserver ranks fork from, ended at exit, or one several processes
  share (``start_shared_forkserver`` / ``attach_forkserver``);
- ``_rank.py``: the body of one rank process (environment, output capture, stacks on request);
- ``_message.py``: ``RankMessage``, the one message a rank's run produces, and ``run_scenario``;
- ``_results.py``: ``RankResult``, ``WorldResult``, the errors and ``build_result``, the one builder;
- ``_warm.py``: ``WarmWorld``, ranks that stay up and run scenario after scenario as fresh worlds would;
  ``_warm_rank.py``: the body of such a rank (the reset before each scenario);
- ``_external.py``: running inside a world torchrun or srun launched; ``python -m ddpprobe.launch``;
- ``_files.py``: reading what a rank left on disk; ``_spec.py``: ``RankInfo`` and what a rank needs.
"""

from ddpprobe.launch._arguments import cuda_device_count
from ddpprobe.launch._external import external_world, shutdown as leave_external_world
from ddpprobe.launch._forkserver import attach_forkserver, start_shared_forkserver
from ddpprobe.launch._message import RankMessage, world_usage
from ddpprobe.launch._results import (
    STDERR_TAIL_LINES,
    RankDied,
    RankFailed,
    RankResult,
    WorldError,
    WorldResult,
    WorldTimeout,
    build_result,
)
from ddpprobe.launch._settings import (
    BACKENDS,
    DEFAULT_TIMEOUT_S,
    START_METHODS,
    Settings,
    SettingsError,
    resolve_settings,
)
from ddpprobe.launch._spec import MAX_WORLD_SIZE, RankInfo
from ddpprobe.launch._warm import WarmCall, WarmWorld, warm_call
from ddpprobe.launch._world import run_world

__all__ = [
    "BACKENDS",
    "DEFAULT_TIMEOUT_S",
    "MAX_WORLD_SIZE",
    "START_METHODS",
    "STDERR_TAIL_LINES",
    "RankDied",
    "RankFailed",
    "RankInfo",
    "RankMessage",
    "RankResult",
    "Settings",
    "SettingsError",
    "WarmCall",
    "WarmWorld",
    "WorldError",
    "WorldResult",
    "WorldTimeout",
    "attach_forkserver",
    "build_result",
    "cuda_device_count",
    "external_world",
    "leave_external_world",
    "resolve_settings",
    "run_world",
    "start_shared_forkserver",
    "warm_call",
    "world_usage",
]
