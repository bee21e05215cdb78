"""The precision-and-devices probe: bfloat16 metric states and logged values synced over gloo, and CPU
tensors (a CPU value, a ``compute_on_cpu`` metric) synced over a process group whose only backend is NCCL.

=====================  ==========================================================================
scenario               what each rank does in ``trainer.validate`` (one batch of one sample)
=====================  ==========================================================================
``bfloat16``           ``bf16_value(rank)`` as a bfloat16 0-d tensor: a ``SumMetric`` set to bfloat16
                       (``set_dtype``) updated with it and computed; ``self.log``
                       of it with ``sync_dist=True`` (``reduce_fx="sum"``, step and epoch); a plain
                       ``torch.distributed.all_reduce`` and ``all_gather`` of it
``cpu_over_nccl``      (GPU only) ``self.log`` of a CPU tensor with ``sync_dist=True``, a
                       ``CatMetric(compute_on_cpu=True)`` computed, and the same metric without
                       ``compute_on_cpu``, each caught
=====================  ==========================================================================

Every sync is caught, so a record says, per sync, what it returned (value and dtype) or what it raised.

Sources: torchmetrics/metric.py ``Metric.set_dtype``, ``Metric._sync_dist``, ``Metric._move_list_states_to_cpu``
(``compute_on_cpu``); torchmetrics/utilities/distributed.py ``gather_all_tensors``;
pytorch_lightning/trainer/connectors/logger_connector/result.py ``_ResultMetric.update`` (a value that is not
float32 or float64 is cast to the default dtype before the sync); lightning_fabric/utilities/distributed.py
``_sync_ddp``; torch/distributed/distributed_c10d.py ``all_reduce``, ``all_gather``.
"""

from __future__ import annotations

import torch
import torch.distributed
from torchmetrics import CatMetric, SumMetric

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import ddp_trainer, floats, id_loader, recorded_warnings


def bf16_value(rank: int) -> float:
    """The number rank ``rank`` contributes: 256.0 on rank 0, 0.5 elsewhere (all exact in bfloat16).

    bfloat16 keeps 8 significant bits, so next to 256 it steps by 2: the exact sums over 2 and 3 ranks,
    256.5 and 257, are not bfloat16 numbers, and summed in bfloat16 in any order they round to 256."""
    return 256.0 if rank == 0 else 0.5


def _dtype(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _caught(fn) -> dict:
    """``{"values": [...], "dtype": ...}`` of what ``fn()`` returns (a tensor or list of tensors), or
    ``{"raised": class name, "message": text}``."""
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - what the sync raises is the record
        return {"raised": type(exc).__name__, "message": str(exc)}
    if isinstance(out, (list, tuple)):
        return {"values": [float(t) for t in out], "dtype": _dtype(out[0])}
    return {"values": [float(v) for v in out.reshape(-1)], "dtype": _dtype(out)}


class Bfloat16Probe(pl.LightningModule):
    """In its one ``validation_step``: ``x = tensor(bf16_value(rank), dtype=bfloat16)``; ``sum_metric`` (set
    to bfloat16) updated with ``x`` and computed; ``self.log("bf16_sum", x,
    sync_dist=True, reduce_fx="sum", on_step=True, on_epoch=True)``; ``all_reduce`` and ``all_gather`` of
    ``x``. Records ``syncs`` (``{name: _caught(...)}``: ``sum_metric``, ``all_reduce``, ``all_gather``) and
    ``state_dtypes`` (the metric's state dtype before compute)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.sum_metric = SumMetric().set_dtype(torch.bfloat16)
        self.syncs: dict = {}
        self.state_dtypes: dict = {}

    def validation_step(self, batch, batch_idx):
        x = torch.tensor(bf16_value(self.global_rank), dtype=torch.bfloat16)
        self.sum_metric.update(x)
        self.state_dtypes = {"sum_metric": _dtype(self.sum_metric.sum_value)}
        self.syncs["sum_metric"] = _caught(self.sum_metric.compute)
        self.log("bf16_sum", x, on_step=True, on_epoch=True, sync_dist=True, reduce_fx="sum", batch_size=1)

        def all_reduce():
            y = x.clone()
            torch.distributed.all_reduce(y)
            return y

        def all_gather():
            out = [torch.zeros_like(x) for _ in range(self.trainer.world_size)]
            torch.distributed.all_gather(out, x.clone())
            return out

        self.syncs["all_reduce"] = _caught(all_reduce)
        self.syncs["all_gather"] = _caught(all_gather)


def bfloat16(info: RankInfo) -> dict:
    """Scenario: ``trainer.validate`` a ``Bfloat16Probe`` over ``IdDataset(W)`` (one batch of one per rank).

    Record keys: ``syncs``, ``state_dtypes`` (see ``Bfloat16Probe``), ``logged`` (``trainer.logged_metrics``
    as floats: ``bf16_sum_step``, ``bf16_sum_epoch``), ``logged_dtypes``, ``torch`` (``torch.__version__``),
    ``warnings``.
    """
    model = Bfloat16Probe()
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(info)
        trainer.validate(model, dataloaders=id_loader(info.world_size, 1), verbose=False)
    logged = dict(trainer.logged_metrics)
    return {
        "syncs": model.syncs,
        "state_dtypes": model.state_dtypes,
        "logged": floats(logged),
        "logged_dtypes": {k: _dtype(v) for k, v in sorted(logged.items())},
        "torch": torch.__version__,
        "warnings": warnings,
    }


class CpuOverNcclProbe(pl.LightningModule):
    """Under an NCCL-only process group, in its one ``validation_step``: a ``CatMetric(compute_on_cpu=True)``
    and a plain ``CatMetric`` updated with ``bf16_value(rank)`` (float32, on the GPU) and computed; then
    ``self.log("cpu_value", cpu tensor, sync_dist=True, reduce_fx="sum")``. Records ``syncs``
    (``{name: _caught(...)}``) and ``state_devices`` (each metric's list-state device before compute)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.on_cpu = CatMetric(compute_on_cpu=True)
        self.on_device = CatMetric()
        self.syncs: dict = {}
        self.state_devices: dict = {}

    def validation_step(self, batch, batch_idx):
        x = torch.tensor([bf16_value(self.global_rank)], device=self.device)
        self.on_cpu.update(x)
        self.on_device.update(x)
        self.state_devices = {
            "on_cpu": self.on_cpu.value[0].device.type,
            "on_device": self.on_device.value[0].device.type,
        }
        self.syncs["compute_on_cpu"] = _caught(self.on_cpu.compute)
        self.syncs["on_device"] = _caught(self.on_device.compute)
        cpu_value = torch.tensor(bf16_value(self.global_rank))

        def log_cpu():
            self.log(
                "cpu_value", cpu_value, on_step=True, on_epoch=False, sync_dist=True, reduce_fx="sum", batch_size=1
            )
            return self.trainer.callback_metrics["cpu_value"]

        self.syncs["self_log_cpu"] = _caught(log_cpu)


def cpu_over_nccl(info: RankInfo) -> dict:
    """Scenario (``--backend nccl``, one GPU per rank): ``trainer.validate`` a ``CpuOverNcclProbe``.

    Record keys: ``syncs``, ``state_devices`` (see ``CpuOverNcclProbe``), ``backend``
    (``torch.distributed.get_backend()``).
    """
    model = CpuOverNcclProbe()
    trainer = ddp_trainer(info)
    trainer.validate(model, dataloaders=id_loader(info.world_size, 1), verbose=False)
    return {
        "syncs": model.syncs,
        "state_devices": model.state_devices,
        "backend": str(torch.distributed.get_backend()) if torch.distributed.is_initialized() else None,
    }
