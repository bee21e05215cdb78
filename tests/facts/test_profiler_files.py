"""Which file does the profiler write on each rank? One report per rank, named by its local rank, so on two
nodes ranks 0 and 2 write the same name (pytorch_lightning/profilers/profiler.py ``Profiler._prepare_filename``
joins the stage, the filename and the local rank).

The probe module is ddpprobe/probes/loggers_per_rank.py (``fit_with_profiler``).
"""

import pytest

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import loggers_per_rank
from tests.support import oracle


def profiler_files(run_world, world_size: int, num_nodes: int, backend=None) -> list:
    """Run ``fit_with_profiler`` on ``world_size`` ranks over ``num_nodes`` nodes; assert every rank wrote one
    report named by its local rank, and nothing else. Returns ``[(global, local rank, [files])]``."""
    world = run_world(
        loggers_per_rank.fit_with_profiler,
        world_size,
        num_nodes=num_nodes,
        backend=backend,
        n=4 * world_size,
        batch_size=2,
    )

    per_node = world_size // num_nodes
    local = [g % per_node for g in range(world_size)]
    got = [(rec["global_rank"], rec["local_rank"], sorted(rank.files)) for rec, rank in zip(world.records, world)]
    want = [(g, local[g], [f"fit-perf-{local[g]}.txt"]) for g in range(world_size)]
    assert got == want, oracle.side_by_side("global rank, local rank, files", got)
    assert all("Action" in rank.files[f"fit-perf-{local[rank.rank]}.txt"] for rank in world), (
        "a report without its table"
    )
    return got


@pytest.mark.mirrors("tests_pytorch/profilers/test_profiler.py::test_pytorch_profiler_trainer_ddp")
def test_the_profiler_writes_one_file_per_rank_named_by_its_local_rank(run_world, semantics):
    """``Trainer(profiler=SimpleProfiler(dirpath=".", filename="perf"))`` on 2 nodes of 2 ranks (forked
    "nodes" on this host, ``num_nodes=2``): every rank writes its own report in its own working directory,
    named by its *local* rank: global ranks 0 and 2 write ``fit-perf-0.txt``, 1 and 3 ``fit-perf-1.txt``
    (not ``fit-perf-2.txt``, ``fit-perf-3.txt``, as a global rank would name them), and nothing else there.
    So on a shared file system two nodes write the same names. Mirrors Lightning's
    tests_pytorch/profilers/test_profiler.py::test_pytorch_profiler_trainer_ddp (2 GPUs, one node,
    ``PyTorchProfiler``: the file name comes from the same base class). Source:
    pytorch_lightning/profilers/profiler.py ``Profiler._prepare_filename`` (stage, filename, local rank);
    pytorch_lightning/trainer/trainer.py (``profiler.setup(..., local_rank=...)``)."""
    world_size, num_nodes = 4, 2
    global_named = [f"fit-perf-{g}.txt" for g in range(world_size)]
    got = profiler_files(run_world, world_size, num_nodes, backend="gloo")  # forked nodes share this host: gloo

    assert [files for _, _, files in got] != [[name] for name in global_named], "local and global rank must differ"
    names = {f for _, _, files in got for f in files}
    semantics.number("profiler file names on 2 nodes of 2", len(names), vs=("ranks", world_size))


@run_if(min_gpus=2, backend="nccl")
@pytest.mark.mirrors("tests_pytorch/profilers/test_profiler.py::test_pytorch_profiler_trainer_ddp")
def test_the_profiler_writes_one_file_per_gpu(run_world, semantics):
    """test_profiler_files.py::test_the_profiler_writes_one_file_per_rank_named_by_its_local_rank
    on one node of two GPUs over NCCL. Mirrors
    tests_pytorch/profilers/test_profiler.py::test_pytorch_profiler_trainer_ddp."""
    got = profiler_files(run_world, 2, 1)
    semantics.number("profiler files on two GPUs", sum(len(files) for _, _, files in got), vs=("ranks", 2))
