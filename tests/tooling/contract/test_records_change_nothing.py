"""A state record never changes the run it records and never fails it (ddpprobe/contract/_state.py): a dataset is
recorded by its own state (type, length, the tensors, arrays, index and file lists it holds), without reading an
item, drawing a random number or running a forward, and without the random generators it holds; a field that
cannot be read (a lazy layer's parameter before its first forward, a meta tensor) is recorded as
``{"unreadable": reason}``.

The audit's ranks (the trace's ``state`` events) and the guard's state checks take these records, so what holds
here holds for both. One process, no world: the records are functions of the objects they read, and the one fit
below runs in this process."""

from __future__ import annotations

import random

import numpy
import pytest
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset, TensorDataset

from ddpprobe import contract

pytestmark = pytest.mark.not_a_fact("tests the contract's records, not a fact about DDP")


class AugmentedDataset(Dataset):
    """Eight samples ``x[i]`` plus noise drawn, at every read, from the three global generators (torch's, NumPy's
    and ``random``'s): a random augmentation. ``reads`` (a list the test holds) gets each index read."""

    def __init__(self, reads: list, seed: int = 0):
        self.x = torch.arange(8.0) + seed * 100
        self.files = [f"img_{i:03d}.png" for i in range(8)]
        self._reads = reads

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        self._reads.append(index)
        return self.x[index] + torch.randn(()) + float(numpy.random.rand()) + random.random()


def _random_states() -> tuple:
    return (torch.get_rng_state(), numpy.random.get_state()[1].copy(), random.getstate())


def _same_states(before: tuple, after: tuple) -> bool:
    return torch.equal(before[0], after[0]) and numpy.array_equal(before[1], after[1]) and before[2] == after[2]


def test_recording_a_dataset_that_augments_from_the_global_generators_reads_no_item_and_draws_nothing():
    """``dataset_value`` of the augmenting dataset, and of a ``Subset`` and a ``ConcatDataset`` holding it: no
    ``__getitem__`` call, and torch's, NumPy's and ``random``'s states are those before the record."""
    reads: list = []
    dataset = AugmentedDataset(reads)
    torch.manual_seed(3), numpy.random.seed(3), random.seed(3)
    before = _random_states()

    values = [contract.dataset_value(d) for d in (dataset, Subset(dataset, [0, 2]), ConcatDataset([dataset, dataset]))]

    assert reads == [], f"the record read items {reads}"
    assert _same_states(before, _random_states()), "the record drew from a global random generator"
    assert [(v["type"], v["len"]) for v in values] == [("AugmentedDataset", 8), ("Subset", 2), ("ConcatDataset", 16)]


class Recorded(torch.nn.Module):
    pass


def _fit_draws(record: bool) -> dict:
    """One process, ``seed_everything(0)``, 2 epochs of 4 batches of 2 over ``AugmentedDataset``: every augmented
    sample the steps saw and the three global generators' states after the fit, with the contract's recorder (every
    boundary's record) or without it."""
    from ddpprobe._lightning import pl
    from ddpprobe.probes.common import seed_everything

    seen: list = []

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            seen.extend(batch.tolist())
            return self.layer(batch[:, None]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    seed_everything(0)  # without `verbose`, which releases before 2.4 lack
    reads: list = []
    records: list = []
    trainer = pl.Trainer(
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[contract.state_recorder(records.append)] if record else [],
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(Module(), DataLoader(AugmentedDataset(reads), batch_size=2, shuffle=True))
    datasets = [r["fields"].get("loader.train[0].dataset") for r in records if r["boundary"] != "first_step"]
    return {"seen": seen, "reads": len(reads), "states": _random_states(), "datasets": [d for d in datasets if d]}


def test_a_fit_recorded_at_every_boundary_draws_and_reads_exactly_what_the_same_fit_unrecorded_does():
    """The recorder takes a record at every boundary of the fit (the dataset among its fields): the augmented
    samples every step saw, the number of items read (16: the loader's, nothing more) and the generators' states
    after the fit are those of the fit without the recorder."""
    plain, recorded = _fit_draws(record=False), _fit_draws(record=True)

    assert len(recorded["datasets"]) >= 8, recorded["datasets"]  # the dataset was recorded at every batch's end
    assert plain["reads"] == recorded["reads"] == 2 * 8, (plain["reads"], recorded["reads"])
    assert recorded["seen"] == plain["seen"], f"recorded {recorded['seen']}\nplain    {plain['seen']}"
    assert _same_states(plain["states"], recorded["states"]), "the recorded fit left other random states"


def _at_train_start(per_rank: list, loops_ran=()) -> list:
    return [
        [
            {
                "boundary": "train_start",
                "hook": "on_train_batch_start",
                "step": 0,
                "epoch": 0,
                "batches_ran": bool(loops_ran),
                "loops_ran": list(loops_ran),
                "fields": {"loader.train[0].dataset": contract.dataset_value(d)},
            }
        ]
        for d in per_rank
    ]


class HeldDataset(Dataset):
    """A dataset holding its samples (``data``, as ``BoringModel``'s ``RandomDataset`` does), its own generator for
    augmentation (``generator``, ``rng``, ``py_random``) and a cache its ``__getitem__`` fills."""

    def __init__(self, data: torch.Tensor, generator_seed: int):
        self.data = data
        self.generator = torch.Generator().manual_seed(generator_seed)
        self.rng = numpy.random.default_rng(generator_seed)
        self.py_random = random.Random(generator_seed)
        self.cache: dict = {}

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        if index not in self.cache:
            self.cache[index] = self.data[index] + torch.randn((), generator=self.generator)
        return self.cache[index]


def test_ranks_holding_different_data_differ_and_ranks_with_their_own_generators_do_not():
    """Rank 0 and rank 1 each draw their data from their own unseeded state (``torch.randn``, as an unseeded
    launch gives): the datasets differ, and ``breaks`` names the dataset at ``train_start``. The same data with a
    generator seeded per rank (each rank its own augmentation) is no difference: the generators are left out and
    named as such."""
    own = [HeldDataset(torch.randn(6, 2, generator=torch.Generator().manual_seed(r)), r) for r in (0, 1)]
    shared = torch.randn(6, 2, generator=torch.Generator().manual_seed(0))
    per_rank_generators = [HeldDataset(shared.clone(), r) for r in (0, 1)]
    assert not torch.equal(own[0].data, own[1].data)  # the data tell the two cases apart

    found = contract.breaks(_at_train_start(own))
    assert [(b.field, b.boundary) for b in found] == [("loader.train[0].dataset", "train_start")], found
    assert found[0].per_rank[0]["digest"] != found[0].per_rank[1]["digest"], found[0].per_rank

    assert contract.breaks(_at_train_start(per_rank_generators)) == []
    left_out = contract.dataset_value(per_rank_generators[0])["left_out"]
    assert left_out == ["dataset.generator", "dataset.py_random", "dataset.rng"], left_out


def test_a_subsets_indices_and_a_concatenations_parts_are_part_of_the_record():
    base = TensorDataset(torch.arange(10.0))
    assert contract.dataset_value(Subset(base, [0, 2, 4])) != contract.dataset_value(Subset(base, [1, 3, 5]))
    other = TensorDataset(torch.arange(10.0) + 1)
    assert contract.dataset_value(ConcatDataset([base, base])) != contract.dataset_value(ConcatDataset([base, other]))
    files = [f"shard_{i}.tar" for i in range(4)]

    class Files(Dataset):
        def __init__(self, names):
            self.names = names

    assert contract.dataset_value(Files(files)) != contract.dataset_value(Files(files[::-1]))
    assert contract.dataset_value(Files(files)) == contract.dataset_value(Files(list(files)))


def test_a_dataset_its_loop_read_is_compared_by_type_and_length_only():
    """Each rank's ``__getitem__`` filled its cache with its own shard's items: before the loop ran, a cache that
    differs is a break; once the train loop ran batches (``loops_ran``), the train dataset's state may hold what
    its reads left, and only its type and length are compared. Another loop's batches change nothing for it."""
    shared = torch.randn(6, 2, generator=torch.Generator().manual_seed(0))
    ranks = [HeldDataset(shared.clone(), 0) for _ in (0, 1)]
    ranks[0][0], ranks[1][1]  # each rank read its own shard's first item
    assert contract.breaks(_at_train_start(ranks, loops_ran=())) != []
    assert contract.breaks(_at_train_start(ranks, loops_ran=("val",))) != []
    assert contract.breaks(_at_train_start(ranks, loops_ran=("train",))) == []
    shorter = [ranks[0], HeldDataset(shared[:5].clone(), 0)]
    assert [b.per_rank for b in contract.breaks(_at_train_start(shorter, loops_ran=("train",)))] == [
        [{"type": "HeldDataset", "len": 6}, {"type": "HeldDataset", "len": 5}]
    ]


def test_a_lazy_layer_and_a_meta_tensor_are_recorded_unreadable_and_the_fit_goes_on():
    """A ``LazyLinear`` before its first forward has an ``UninitializedParameter`` (reading it raises in torch), a
    meta tensor holds no data: the ``setup`` record names them unreadable, with the reason; the fit runs to its
    end, and once the forward ran the parameter is recorded by its values."""
    from ddpprobe._lightning import pl

    class Lazy(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.LazyLinear(1)
            self.planned = torch.empty(3, 4, device="meta")

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    records: list = []
    trainer = pl.Trainer(
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[contract.state_recorder(records.append)],
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(Lazy(), DataLoader(TensorDataset(torch.ones(4, 3)), batch_size=2))

    setup = records[0]["fields"]
    assert records[0]["boundary"] == "setup" and "snapshot" not in setup, records[0]
    assert "UninitializedParameter" in setup["param.layer.weight"]["unreadable"], setup["param.layer.weight"]
    assert "meta tensor of shape [3, 4]" in setup["module.attr.planned"]["unreadable"], setup["module.attr.planned"]
    assert trainer.global_step == 2
    last = records[-1]["fields"]
    assert last["param.layer.weight"]["shape"] == [1, 3], last["param.layer.weight"]
    assert contract.show(setup["param.layer.weight"]) == "unreadable"


@pytest.mark.parametrize(
    "values, per_rank_name",
    [
        (["/tmp/run7a1/predictions_rank0.csv", "/tmp/run7a1/predictions_rank1.csv"], True),
        (["epoch10_rank0.pt", "epoch10_rank1.pt"], True),
        (["out/shard-00", "out/shard-01", "out/shard-02"], True),
        (["run_0", "run_2"], False),  # rank 1 holds another rank's number
        (["rank0_lr0.1", "rank1_lr0.2"], False),  # a number besides the rank differs
        (["cosine", "linear"], False),
        ([0.1, 0.2], False),
        ([0, 1, 2], True),  # the rank's own number kept in an attribute
        ([1, 0], False),  # not each rank's own number
        ([0, 2], False),
    ],
)
def test_an_attribute_that_differs_only_by_each_ranks_own_number_is_a_name_made_per_rank(values, per_rank_name):
    """A module attribute set before training must be equal on every rank, except a name each rank makes with its
    own number (a file it writes): then ``breaks`` finds nothing; any other difference is a break."""
    records = [
        [{"boundary": "start", "hook": "on_fit_start", "step": 0, "epoch": 0, "fields": {"module.attr.path": v}}]
        for v in values
    ]
    assert contract.named_by_rank(values) is per_rank_name
    assert (contract.breaks(records) == []) is per_rank_name
