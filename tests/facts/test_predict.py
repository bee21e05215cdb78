"""Predict: which samples each rank predicts, what ``trainer.predict`` returns, what a prediction writer gets.

For ``trainer.predict`` Lightning always re-creates the dataloader: under DDP it puts in an
``UnrepeatedDistributedSamplerWrapper`` instead of the padding ``DistributedSampler`` used by validate
and test, and it wraps the batch sampler in ``_IndexBatchSamplerWrapper`` to remember the dataset
indices of every batch (pytorch_lightning/trainer/connectors/data_connector.py
``_DataConnector._prepare_dataloader`` and ``_get_distributed_sampler``, ``mode == RunningStage.PREDICTING``;
pytorch_lightning/overrides/distributed.py ``UnrepeatedDistributedSampler``). Nothing is padded, so with
N not divisible by W the ranks predict different numbers of samples, and possibly of batches.

The probe predicts ``i - 0.3 * i**2`` for sample ``i`` (``ddpprobe/probes/predict.py``): distinct for
every sample and not monotonic, so a prediction paired with the wrong index shows.
"""

import json

import pytest

from ddpprobe.probes import predict
from tests.support import oracle

N = 5
BATCH_SIZE = 2


def _flat(nested) -> list:
    return [x for batch in nested for x in batch]


@pytest.mark.parametrize("world_size, n", [(2, 5), (3, 7)])
def test_predict_does_not_pad_so_ranks_run_different_numbers_of_batches(run_world, semantics, world_size, n):
    """Under DDP, ``trainer.predict`` deals the N samples round-robin without padding: rank r predicts
    r, r+W, ... below N, every sample exactly once. With batch size 2, at W=2 and N=5 rank 0 runs two
    batches ([0, 2], [4]) and rank 1 one ([1, 3]); at W=3 and N=7 rank 0 runs two ([0, 3], [6]), ranks 1
    and 2 one. Validate would have padded (``DistributedSampler``) so every rank ran ceil(N/W) samples.
    Lightning does not warn about replicated samples here, since none are.
    Source: data_connector.py ``_get_distributed_sampler`` (``UnrepeatedDistributedSamplerWrapper`` when
    predicting); overrides/distributed.py ``UnrepeatedDistributedSampler.__iter__``."""
    world = run_world(predict.predict, world_size, n=n, batch_size=BATCH_SIZE)

    expected = [oracle.batches(oracle.unrepeated_shard(n, world_size, r), BATCH_SIZE) for r in range(world_size)]
    padded = [oracle.batches(oracle.shard(n, world_size, r), BATCH_SIZE) for r in range(world_size)]
    assert expected != padded, "data do not discriminate: padded and unpadded shards coincide"
    seen = [rec["seen_ids"] for rec in world.records]
    assert seen == expected, oracle.side_by_side("predicted", seen) + f"  expected {expected}, padded would be {padded}"
    assert sorted(_flat(_flat(seen))) == list(range(n)), oracle.side_by_side("predicted", seen)
    batch_counts = [len(s) for s in seen]
    assert len(set(batch_counts)) > 1, oracle.side_by_side("batches", batch_counts)
    samplers = [rec["sampler"] for rec in world.records]
    assert samplers == ["UnrepeatedDistributedSamplerWrapper"] * world_size, oracle.side_by_side("sampler", samplers)
    replicate = [sum("replicates some samples" in w["message"] for w in rec["warnings"]) for rec in world.records]
    assert replicate == [0] * world_size, oracle.side_by_side("replicate warnings", replicate)
    semantics.number(
        "predict batches per rank", str(batch_counts), vs=("validate would run per rank", str([len(p) for p in padded]))
    )


@pytest.mark.parametrize("world_size", [2, 3])
def test_predict_returns_only_the_rank_s_own_predictions_and_none_without_return_predictions(
    run_world, semantics, world_size
):
    """``trainer.predict(...)`` returns, on each rank, the list of *that rank's* batch predictions
    (``predict_step`` outputs, one per batch); no rank gets all N. At W=1 the one rank returns all N in
    dataset order. With ``return_predictions=False`` every rank gets ``None``.
    Source: loops/prediction_loop.py ``_PredictionLoop.predictions`` / ``_on_predict_epoch_end`` (no
    gather across ranks)."""
    single = run_world(predict.predict, 1, n=N, batch_size=BATCH_SIZE)
    world = run_world(predict.predict, world_size, n=N, batch_size=BATCH_SIZE)
    silent = run_world(predict.predict, world_size, n=N, batch_size=BATCH_SIZE, return_predictions=False)

    expected_single = [[predict.predicted_value(i) for i in b] for b in oracle.batches(list(range(N)), BATCH_SIZE)]
    assert _flat(single[0].record["returned"]) == pytest.approx(_flat(expected_single))
    assert [len(b) for b in single[0].record["returned"]] == [len(b) for b in expected_single]

    returned = [rec["returned"] for rec in world.records]
    for r, got in enumerate(returned):
        own = [
            [predict.predicted_value(i) for i in b]
            for b in oracle.batches(oracle.unrepeated_shard(N, world_size, r), BATCH_SIZE)
        ]
        assert [len(b) for b in got] == [len(b) for b in own], oracle.side_by_side("returned", returned)
        assert _flat(got) == pytest.approx(_flat(own)), oracle.side_by_side("returned", returned) + f"  rank {r}: {own}"
    sizes = [len(_flat(got)) for got in returned]
    assert all(size < N for size in sizes), oracle.side_by_side("predictions returned", sizes)
    assert sorted(_flat(_flat(returned))) == pytest.approx(sorted(_flat(expected_single)))
    nones = [rec["returned"] for rec in silent.records]
    assert nones == [None] * world_size, oracle.side_by_side("returned with return_predictions=False", nones)
    semantics.number("predictions returned per rank", str(sizes), vs=("at W=1", N))


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("write_interval", ["batch", "epoch"])
def test_predict_writer_gets_the_rank_s_batch_indices_but_at_epoch_end_nested_one_level_deeper_than_predictions(
    run_world, semantics, world_size, write_interval
):
    """A ``BasePredictionWriter`` on each rank sees only that rank's predictions. With
    ``write_interval="batch"``, ``write_on_batch_end`` gets each batch's ``prediction`` and its dataset
    indices ``batch_indices`` as a flat list, position for position. With ``"epoch"``,
    ``write_on_epoch_end`` gets ``predictions`` as a list of batches (one dataloader), but ``batch_indices``
    as a list *per dataloader* of a list of batches: ``[[[0, 2], [4]]]`` for ``[[p0, p2], [p4]]`` on rank 0
    at W=2, one level deeper. Reported upstream as
    https://github.com/Lightning-AI/pytorch-lightning/issues/17643 (closed as won't fix).
    Source: callbacks/prediction_writer.py ``on_predict_epoch_end`` passes ``predict_loop.predictions``
    (unwrapped for one dataloader) with ``predict_loop.epoch_batch_indices`` (not unwrapped)."""
    world = run_world(predict.predict, world_size, n=N, batch_size=BATCH_SIZE, write_interval=write_interval)

    for r, rec in enumerate(world.records):
        ids = oracle.batches(oracle.unrepeated_shard(N, world_size, r), BATCH_SIZE)
        preds = [[predict.predicted_value(i) for i in b] for b in ids]
        if write_interval == "batch":
            assert rec["writer_epoch"] == []
            got_indices = [call["batch_indices"] for call in rec["writer_batch"]]
            assert got_indices == ids, oracle.side_by_side("batch_indices", got_indices) + f"  rank {r}: {ids}"
            for call, expected in zip(rec["writer_batch"], preds):
                assert call["prediction"] == pytest.approx(expected), f"rank {r}: {call} expected {expected}"
            assert [call["batch_idx"] for call in rec["writer_batch"]] == list(range(len(ids)))
        else:
            assert rec["writer_batch"] == []
            (call,) = rec["writer_epoch"]
            assert call["batch_indices"] == [ids], f"rank {r}: batch_indices {call['batch_indices']}, expected [{ids}]"
            assert [len(b) for b in call["predictions"]] == [len(b) for b in preds]
            assert _flat(call["predictions"]) == pytest.approx(_flat(preds)), f"rank {r}: {call}"
    rank0 = world.records[0]
    first_call = rank0["writer_batch"][0] if write_interval == "batch" else rank0["writer_epoch"][0]
    shown = first_call["batch_indices"]
    semantics.number(f"rank 0 batch_indices ({write_interval})", str(shown))


@pytest.mark.parametrize("world_size", [2, 3])
def test_predict_recipe_merging_every_rank_s_written_predictions_by_index_equals_single_process(
    run_world, semantics, world_size
):
    """The recipe for all N predictions in order: a ``BasePredictionWriter(write_interval="epoch")`` on
    every rank writes its dataset indices and predictions to its own file (taking dataloader 0's entry of
    ``batch_indices``, see the nesting fact above), and whoever can read all files merges them by index
    (``ddpprobe.probes.predict.FileWriter`` and ``merge_rank_predictions``). Because predict does not pad,
    every index appears in exactly one file, and the merged list equals the W=1 predictions.
    Source: callbacks/prediction_writer.py (the ``predictions_{global_rank}`` example in its docstring)."""
    single = run_world(predict.predict, 1, n=N, batch_size=BATCH_SIZE)
    world = run_world(
        predict.predict, world_size, n=N, batch_size=BATCH_SIZE, write_files=True, return_predictions=False
    )

    files = [json.loads(rank.files[f"predictions_rank{rank.rank}.json"]) for rank in world]
    indices = [f["indices"] for f in files]
    expected_indices = [oracle.unrepeated_shard(N, world_size, r) for r in range(world_size)]
    assert indices == expected_indices, oracle.side_by_side("indices written", indices)
    merged = predict.merge_rank_predictions(files, N)
    expected = [predict.predicted_value(i) for i in range(N)]
    assert merged == pytest.approx(expected), f"merged {merged}, expected {expected}"
    assert merged == _flat(single[0].record["returned"]), f"merged {merged}, W=1 {single[0].record['returned']}"
    with pytest.raises(ValueError, match="already written"):
        predict.merge_rank_predictions(files + files[:1], N)
    with pytest.raises(ValueError, match="no file holds"):
        predict.merge_rank_predictions(files[1:], N)
    semantics.number("merged predictions", len(merged), vs=("W=1 predictions", N))
