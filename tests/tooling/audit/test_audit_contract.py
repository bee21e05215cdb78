"""The audit explains by the DDP contract (ddpprobe/contract/): on modules written for each mechanism
(tests/support/contract_modules.py), the first must-be-equal field that differs is a problem of its own, with the
field's path, the per-rank values, the hook and step, the contract row and its fact, and what followed from it;
the first optimizer step is compared with one process on the same samples and weights. A correct module, and one
whose first step cannot be compared, print no contract problem.

The facts behind the rows: tests/facts/test_what_ddp_keeps_equal.py."""

import pytest

from ddpprobe import contract, hazards
from tests.support.audit_runs import audited

pytestmark = pytest.mark.not_a_fact("tests the audit's reading of the DDP contract, not a fact about DDP")

M = "tests.support.contract_modules"
TIMEOUT = 60.0


def _audit(model: str, data: bool = True):
    return audited(f"{M}:{model}", f"{M}:make_data" if data else None, world_size=2, stage="fit", timeout=TIMEOUT)


def _roots(result) -> list:
    return [b for b in result.contract["breaks"] if not b["root"]]


def test_a_learning_rate_drawn_at_random_per_rank_is_the_first_break_and_the_weights_follow_it():
    """``RandomLr`` draws its learning rate when built; the audit's ranks draw as processes do (each its own random
    state), so the attribute differs from the first record (``setup``) on, the optimizer's ``lr`` at
    ``on_fit_start``, and the parameters after the first step: one problem, the attribute, with the rest under it."""
    result = _audit("make_random_lr")

    roots = _roots(result)
    assert [(b["field"], b["boundary"], b["row"]) for b in roots] == [("module.attr.lr", "setup", "module attributes")]
    assert roots[0]["per_rank"][0] != roots[0]["per_rank"][1]
    later = {b["field"]: b for b in result.contract["breaks"] if b["root"]}
    assert later["optimizer[0].group[0].lr"]["per_rank"] == roots[0]["per_rank"]
    assert {"param.layer.weight", "param.layer.bias"} <= set(later)
    assert all(b["root"] == "module.attr.lr" for b in later.values())
    finding = result.findings[0]
    assert finding["problem"].startswith("module.attr.lr differs between the ranks from setup")
    assert len(finding["consequences"]) == len(later)


def _replayed_lr(seed: int) -> float:
    """The learning rate ``RandomLr()`` draws right after ``torch.manual_seed(seed)``, replayed in a forked
    generator state."""
    import torch

    from tests.support.contract_modules import RandomLr

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return RandomLr().lr


def test_each_rank_draws_from_the_audits_seed_plus_its_rank_so_rank_0_draws_what_the_single_process_draws():
    """The audit's ranks draw as processes do (ddpprobe/audit/worlds/_scenario.py ``_draw_as_a_process``): rank r's
    generators start at ``seed + r`` (seed 0 by default), so the ranks draw apart, rank 0 draws what the single
    process draws, and every run of the audit draws the same."""
    result = _audit("make_random_lr")
    assert result.contract["breaks"][0]["per_rank"] == [_replayed_lr(0), _replayed_lr(1)]


def contract_modules_line(text: str) -> int:
    """The line of tests/support/contract_modules.py that holds ``text``."""
    from tests.support import contract_modules

    with open(contract_modules.__file__, encoding="utf-8") as fh:
        return next(n for n, line in enumerate(fh, start=1) if text in line)


def test_a_loss_weight_set_from_the_rank_is_a_module_attribute_break_and_the_first_step_differs_after_it():
    """``RankAttribute`` sets ``loss_weight = 1 + global_rank`` in ``setup``: the attribute differs at
    ``on_fit_start`` (the callbacks' ``setup`` ran before the module's), with the line that set it on every rank,
    and the first step's gradient, made with it, is not one process's; the report lists the step under the
    attribute."""
    result = _audit("make_rank_attribute")

    roots = _roots(result)
    assert [(b["field"], b["hook"], b["per_rank"]) for b in roots] == [
        ("module.attr.loss_weight", "on_fit_start", [1.0, 2.0])
    ]
    line = contract_modules_line("loss_weight = 1.0 + self.global_rank")
    assert roots[0]["written_at"] == [f"contract_modules.py:{line} in setup"] * 2
    assert f"last set at contract_modules.py:{line} in setup on every rank" in " ".join(result.format().split())
    assert result.contract["first_step"]["status"] == "differs"
    assert any("first optimizer step" in c for c in result.findings[0]["consequences"])
    text = " ".join(result.format().split())
    assert contract.CONTRACT["module attributes"].facts[0] in text
    assert hazards.NO_FIX in text


def test_a_loss_summed_over_the_batch_gives_the_first_step_1_over_w_of_one_process():
    """``SummedLoss``: no state field differs, and the first step's gradient is 0.5 times one process's on the same
    8 samples, on every parameter; the report says what 1/W is what a summed loss gives, and names the fact."""
    result = _audit("make_summed_loss")

    assert result.contract["breaks"] == []
    first = result.contract["first_step"]
    assert (first["status"], round(first["ratio"], 6), first["reference_samples"]) == ("scaled", 0.5, 8)
    text = " ".join(result.format().split())
    assert "1/W = 0.5: what a loss summed over the batch instead of averaged gives" in text
    assert contract.SINGLE_PROCESS_STEP.facts[0] in text


def test_a_correct_module_breaks_nothing_and_its_first_step_is_one_processs():
    result = _audit("make_correct")

    assert result.contract["recorded"] and result.contract["breaks"] == []
    assert result.contract["first_step"]["status"] == "equal"
    assert result.exit_code == 0, result.problems
    assert "every field the contract says must be equal was equal on every rank" in " ".join(result.format().split())


def test_a_module_with_dropout_is_not_compared_with_one_process_and_is_no_problem():
    result = _audit("make_with_dropout")

    first = result.contract["first_step"]
    assert first["status"] == "not comparable" and "Dropout" in first["reason"]
    assert result.exit_code == 0, result.problems


def test_a_schedule_sized_by_the_modules_own_loader_plans_more_steps_than_the_ranks_take():
    """``OwnLoaderCycle``: a ``OneCycleLR`` sized by the module's own loader (4 batches) while each rank takes 2 steps;
    one process plans 4 and takes 4. The audit names the scheduler's planned length and both runs' steps, with the
    contract row and its fact."""
    result = _audit("make_own_loader_cycle", data=False)

    assert result.contract["schedules"] == [{"field": "scheduler[0].total_steps", "single": [4, 4], "world": [4, 2]}]
    text = " ".join(result.format().split())
    assert contract.SINGLE_PROCESS_SCHEDULE.facts[0] in text
    assert "scheduler[0].total_steps plans 4 steps where each of the 2 ranks takes 2" in " ".join(result.problems)


def test_a_schedule_sized_by_the_trainers_count_follows_one_process_over_training():
    result = _audit("make_steps_cycle", data=False)
    assert result.contract["schedules"] == [] and result.exit_code == 0, result.problems


def test_an_attribute_a_validate_run_sets_from_the_rank_is_a_break_at_the_first_validation_batch():
    """``RankScaleOnValidationStart`` sets ``scale`` from the rank in its own ``on_validation_start``, after the
    callbacks' ``start`` record: the record before the first validation batch (``eval_start``) sees it differ, with
    the line that set it."""
    result = audited(f"{M}:make_rank_scale_on_validation_start", f"{M}:make_data", world_size=2, timeout=TIMEOUT)

    roots = _roots(result)
    assert [(b["field"], b["boundary"], b["per_rank"]) for b in roots] == [
        ("module.attr.scale", "eval_start", [1.0, 2.0])
    ]
    line = contract_modules_line("self.scale = 1.0 + self.global_rank")
    assert roots[0]["written_at"] == [f"contract_modules.py:{line} in on_validation_start"] * 2
