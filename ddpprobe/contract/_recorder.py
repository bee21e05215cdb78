"""The Lightning callback that takes a rank's state records (:func:`~ddpprobe.contract.snapshot`) at every
boundary of ``BOUNDARIES`` and hands each to a writer (the audit's trace writes it as a ``state`` event).

The callback's class derives from the chosen package's ``Callback`` and is built at the first call of
:func:`state_recorder`, so loading this module imports no Lightning.
"""

from __future__ import annotations

from typing import Callable, Optional

from ddpprobe.contract._single import not_comparable_reason
from ddpprobe.contract._state import snapshot, tensor_value

#: Elements of each gradient kept value by value in the ``first_step`` record (the ratio of two runs' gradients
#: is read from them; the digest, sum and norm cover the whole tensor).
GRAD_VALUES = 64


def gradient_fields(module) -> dict:
    """``{"grad.<name>": value}`` of every parameter's ``.grad`` (None where it has none): :func:`tensor_value`
    plus ``"head"``, its first :data:`GRAD_VALUES` elements."""
    import torch

    out = {}
    for name, param in module.named_parameters():
        if param.grad is None:
            out[f"grad.{name}"] = None
            continue
        try:
            grad = param.grad.detach()
            grad = grad.to_dense() if grad.layout != torch.strided else grad
            value = tensor_value(grad)
            value["head"] = [float(v) for v in grad.flatten()[:GRAD_VALUES].double().cpu().tolist()]
        except Exception as exc:  # noqa: BLE001 - a gradient that cannot be read is recorded as such
            value = {"unreadable": f"{type(exc).__name__}: {exc}"[:200]}
        out[f"grad.{name}"] = value
    return out


#: Why a first step is not comparable with one process's when torch's default generator advanced during it.
DREW = (
    "the step drew random numbers (torch's default generator advanced between the batch's start and the optimizer "
    "step: noise, a random augmentation or a dropout in the step), and each process draws its own"
)


def _generator_digest() -> str:
    import hashlib

    import torch

    return hashlib.sha1(torch.get_rng_state().numpy().tobytes()).hexdigest()


_recorder_class = None


def state_recorder(write: Callable[[dict], None], fields: Optional[tuple] = None):
    """A Lightning ``Callback`` that calls ``write(record)`` at each boundary, where ``record`` is
    ``{"boundary", "hook", "step", "epoch", "batches_ran", "loops_ran", "fields"}`` (``fields``: :func:`snapshot`,
    narrowed to the given prefixes; ``batches_ran``: whether any batch ran before it; ``loops_ran``: the loops,
    ``"train"``, ``"val"``, ``"test"``, ``"predict"``, whose batches did), and once, before the first optimizer
    step, a ``first_step`` record of the gradients (:func:`gradient_fields`). Reads only: it changes nothing in the
    run (no item of a dataset is read, no random number drawn) and makes no collective; a record that cannot be
    taken is written as ``{"snapshot": {"unreadable": "<error>"}}``, never raised."""
    global _recorder_class
    if _recorder_class is None:
        _recorder_class = _build_class()
    return _recorder_class(write, fields)


def _build_class():
    from ddpprobe import _lightning

    pl = _lightning.pl

    class _StateRecorder(pl.Callback):
        def __init__(self, write, fields):
            self.write = write
            self.fields = fields
            self.first_step_taken = False
            self.generator_at_start = None
            self.batches_ran = False
            self.loops_ran: list = []  # the loops whose batches ran ("train", "val" ...), in the order they first did
            self.eval_started = False

        def _take(self, trainer, pl_module, boundary: str, hook: str) -> None:
            try:
                fields = snapshot(trainer, pl_module, self.fields)
            except Exception as exc:  # noqa: BLE001 - the recorder reads only; it never breaks the user's run
                fields = {"snapshot": {"unreadable": f"{type(exc).__name__}: {exc}"[:200]}}
            self.write(
                {
                    "boundary": boundary,
                    "hook": hook,
                    "step": int(trainer.global_step),
                    "epoch": int(trainer.current_epoch),
                    "batches_ran": self.batches_ran,
                    "loops_ran": list(self.loops_ran),
                    "fields": fields,
                }
            )

        def _ran(self, loop: str) -> None:
            self.batches_ran = True
            if loop not in self.loops_ran:
                self.loops_ran.append(loop)

        def on_validation_batch_end(self, trainer, pl_module, *args, **kwargs):
            self._ran("val")

        def on_test_batch_end(self, trainer, pl_module, *args, **kwargs):
            self._ran("test")

        def on_predict_batch_end(self, trainer, pl_module, *args, **kwargs):
            self._ran("predict")

        def _outside_fit(self, trainer) -> bool:
            return trainer.state.fn != "fit"

        def setup(self, trainer, pl_module, stage):
            self._take(trainer, pl_module, "setup", "setup")

        def on_fit_start(self, trainer, pl_module):
            self._take(trainer, pl_module, "start", "on_fit_start")

        def on_validation_start(self, trainer, pl_module):
            if self._outside_fit(trainer):
                self._take(trainer, pl_module, "start", "on_validation_start")

        def on_test_start(self, trainer, pl_module):
            self._take(trainer, pl_module, "start", "on_test_start")

        def on_predict_start(self, trainer, pl_module):
            self._take(trainer, pl_module, "start", "on_predict_start")

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx, *args):
            if not self.first_step_taken and self.generator_at_start is None:
                # Before the first training batch: the loaders are built and the module's own on_train_start ran
                # (Lightning calls a callback's hook before the module's, so on_train_start itself is too early).
                self._take(trainer, pl_module, "train_start", "on_train_batch_start")
                self.generator_at_start = _generator_digest()

        def _eval_start(self, trainer, pl_module, hook: str) -> None:
            if self._outside_fit(trainer) and not self.eval_started:
                # Before the first batch of validate, test or predict: the module's own on_*_start ran.
                self.eval_started = True
                self._take(trainer, pl_module, "eval_start", hook)

        def on_validation_batch_start(self, trainer, pl_module, *args, **kwargs):
            self._eval_start(trainer, pl_module, "on_validation_batch_start")

        def on_test_batch_start(self, trainer, pl_module, *args, **kwargs):
            self._eval_start(trainer, pl_module, "on_test_batch_start")

        def on_predict_batch_start(self, trainer, pl_module, *args, **kwargs):
            self._eval_start(trainer, pl_module, "on_predict_batch_start")

        def on_before_optimizer_step(self, trainer, pl_module, optimizer, *args):
            if self.first_step_taken:
                return
            self.first_step_taken = True
            drew = self.generator_at_start is not None and _generator_digest() != self.generator_at_start
            self.write(
                {
                    "boundary": "first_step",
                    "hook": "on_before_optimizer_step",
                    "step": int(trainer.global_step),
                    "epoch": int(trainer.current_epoch),
                    "fields": gradient_fields(pl_module),
                    "not_comparable": not_comparable_reason(pl_module) or (DREW if drew else None),
                }
            )

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
            self._ran("train")
            self._take(trainer, pl_module, "train_batch_end", "on_train_batch_end")

        def on_train_epoch_end(self, trainer, pl_module):
            self._take(trainer, pl_module, "train_epoch_end", "on_train_epoch_end")

        def on_validation_epoch_end(self, trainer, pl_module):
            if not trainer.sanity_checking:
                self._take(trainer, pl_module, "val_epoch_end", "on_validation_epoch_end")

        def on_test_epoch_end(self, trainer, pl_module):
            self._take(trainer, pl_module, "test_epoch_end", "on_test_epoch_end")

        def on_fit_end(self, trainer, pl_module):
            self._take(trainer, pl_module, "end", "on_fit_end")

        def on_validation_end(self, trainer, pl_module):
            if self._outside_fit(trainer):
                self._take(trainer, pl_module, "end", "on_validation_end")

        def on_test_end(self, trainer, pl_module):
            self._take(trainer, pl_module, "end", "on_test_end")

        def on_predict_end(self, trainer, pl_module):
            self._take(trainer, pl_module, "end", "on_predict_end")

    return _StateRecorder
