"""A per-rank trace of what a Lightning run did under DDP: every collective in order, every ``self.log``
call, every batch the loops ran. Written as JSON lines while the rank runs, so a rank that aborts or is
killed still leaves its trace up to the collective it was in.

Used by the audit (ddpprobe/audit/) in its ranks::

    with CollectiveTrace(path, model) as trace:     # patches torch.distributed in this process only
        trainer = ddp_trainer(info, callbacks=[trace.batch_recorder()])
        trainer.validate(model, dataloaders=loader)

One JSON object per line (``TRACE_SCHEMA`` version 1); ``event`` says which kind. This package writes every
event and reads them back (:func:`read_trace`, :func:`split_trace`); the other rooms call it:

``collective`` (written *before* the call enters the backend)
    ``seq`` (0, 1, ... per rank, Python-level calls), ``op`` (``"all_reduce"``, ``"all_gather"``,
    ``"all_gather_object"``, ``"broadcast"``, ``"barrier"``, ``"reduce_scatter_tensor"`` ...),
    ``reduce_op`` (``"SUM"``, ``"AVG"`` ... or None), ``dtype`` (``"float32"``; ``"object"`` for the
    ``*_object`` calls), ``shape`` (list of ints, the tensor the rank contributes; None for objects
    and barriers), ``source`` (``"self.log"``: Lightning syncing a logged value;
    ``"torchmetrics"``: a ``Metric`` syncing its states at ``compute()``; ``"user"``: called from the
    user's code, e.g. ``self.all_gather``; ``"library"``: Lightning's or torch's own, e.g. a barrier
    of the Trainer or a broadcast in ``DistributedDataParallel.forward``; ``"gradient"``: one bucket of
    DDP's gradient all-reduce, through the comm hook of ``_gradients.py``, with ``bucket`` (the
    ``GradBucket`` index) and ``comm_hook`` (the user's hook's name, or None)), ``origin`` (the function that
    called ``torch.distributed``: ``"torch/nn/parallel/distributed.py:1580 in _sync_buffers"``),
    ``key`` (the logged name, where there is one), ``sync`` (for ``self.log``: ``"step"``, the sync of a
    step value in ``self.log`` itself, or ``"epoch"``, the sync of the epoch value at the epoch's end),
    ``metric``, ``states`` and ``state_sizes`` (the ``Metric`` class, its state names, and each state's size
    at the sync: ``"list of 3"``, ``"tensor [2]"``), ``hook`` (the hook the key was logged from, else the
    hook running), ``running`` (the LightningModule or callback hook running, ``_current_fx_name``),
    ``call_site`` (``"file.py:42 in validation_step"``: the innermost frame of the user's code,
    else None), ``call`` and ``call_kind`` (the public name of the library call the user's line made:
    ``"Trainer.callback_metrics"`` ``"property"``, ``"MeanMetric.compute"`` ``"method"``,
    ``"torch.distributed.all_reduce"`` ``"function"``; None for a collective Lightning makes on its own),
    ``loop_step`` (for those: the innermost Lightning loop or ``Trainer`` frame, ``"_FitLoop.on_advance_end"``;
    else None; ``CallClassifier.chain``), ``callback`` (the ``Callback`` hook that made it, by the instance's
    class: ``"TQDMProgressBar.on_train_epoch_end"``, where ``call`` is then the public call the hook made,
    ``"Trainer.progress_bar_metrics"``, and ``loop_step`` the loop that ran the hook; a user's callback is the
    user's frame: ``"MyCallback.on_train_epoch_end"``; else None), ``pg_seq`` (the default process group's
    sequence number before the call; the Flight Recorder numbers the backend's collectives ``pg_seq + 1 ...``).
``values`` (``all_reduce``, ``broadcast``, ``reduce`` and the gathers of a tensor of at most 8 elements: what
    the rank put in, as a flat list of floats; the ``done`` event's ``values`` is what it got back, up to 128).
``done`` / ``raised``
    ``seq``, and for ``raised`` the ``error`` text: the collective returned or raised; ``done`` also
    has ``pg_seq`` after the call (the backend collectives it ran are ``pg_seq`` before + 1 .. after).
``log``
    one ``self.log`` call: ``key``, ``hook``, ``value`` (float for a scalar tensor or number; a logged
    ``Metric``'s batch value from its ``forward``; else None), ``step_value`` (with ``on_step``: the step
    value Lightning keeps, after the ``sync_dist`` all_reduce where there is one), ``batch_size`` (what
    Lightning added to the key's cumulated batch size; None where it keeps none), ``on_step``, ``on_epoch``,
    ``sync_dist``, ``reduce_fx``, ``rank_zero_only``, ``metric_object``, ``call_site``, ``reads_rank`` (the
    names of ``RANK_NAMES`` the calling function's code uses, e.g. ``["global_rank"]``).
``batch``
    a batch a loop ran: ``stage`` (``"train"``, ``"val"``, ``"test"``, ``"predict"``), ``sanity`` (true for
    the sanity check's validation batches before ``fit`` trains), ``epoch`` (``trainer.current_epoch``),
    ``batch_idx``,
    ``dataloader_idx``, ``size``, ``ids`` (the batch's ``id``/``ids``/``idx``/``index`` field) or
    ``hashes`` (one content hash per sample, from the rows of its tensors), ``sampler`` (the type
    name of the loader's sampler, first batch only).
``all_gather``
    a ``self.all_gather`` call whose data held leaves that are not tensors: ``hook``, ``call_site``,
    ``leaves`` (up to 20 ``{"path", "type", "unchanged"}``: e.g. ``"['names'][0]"``, ``"str"``, and whether the
    very object came back: Lightning gathers tensors only, pytorch_lightning/core/module.py ``all_gather``,
    ``apply_to_collection(data, Tensor, ...)`` after converting numbers), ``unchanged`` (how many came back).
``hook`` and ``hooks``
    ``hook``: the first time this rank entered a hook Lightning runs (``hook``, ``owner``: ``"module"``,
    ``"datamodule"`` or ``"callbacks"``; ddpprobe/trace/_hooks.py); ``hooks``: when the trace closes, ``counts``
    (``{"owner.hook": times entered}``).
``state``
    a state record of the DDP contract (ddpprobe/contract/, written by its ``state_recorder`` callback):
    ``boundary`` (``"setup"``, ``"start"``, ``"train_batch_end"`` ..., or ``"first_step"`` for the gradients
    before the first optimizer step), ``hook``, ``step``, ``epoch``, ``fields`` (``{path: value}``, the schema of
    ddpprobe/contract/_state.py), and for ``first_step`` ``not_comparable`` (why one process cannot match it); the
    audit adds ``writers``: ``{"module.attr.<name>": the user's line that last set it}`` (ddpprobe/trace/_writers.py).
``file``
    a file the rank's own code opened for writing, when it was closed (ddpprobe/trace/_files.py): ``path``,
    ``key`` (the path as the ranks of a real launch share it), ``mode``, ``call_site``, ``hook``, ``size``,
    ``lines``, ``sha1`` (or ``unreadable``).
``stage`` and ``metrics`` (:meth:`CollectiveTrace.stage_started`, ``stage_raised``, ``stage_ended``)
    ``stage``: ``status`` ``"start"`` (with ``stage``, ``rank``, ``world_size``), ``"end"`` or ``"raised"``
    (with ``error``); ``metrics``: ``values``, the rank's ``trainer.callback_metrics`` after a stage that
    ended, so a rank that finished is known even when another rank hangs and the world is killed.
``flight_recorder``
    written at the end of a stage that returned or raised (not by a killed rank): ``entries``, torch's
    Flight Recorder entries for this rank (``collective_seq_id``, ``profiling_name`` such as
    ``"gloo:all_reduce"``, ``input_sizes``, ``input_dtypes``), or ``unavailable`` with the reason.

Flight Recorder: on torch 2.13 it records gloo collectives too (enable with ``TORCH_FR_BUFFER_SIZE``,
read with ``torch._C._distributed_c10d._dump_fr_trace_json``), including those Python never sees (the
DDP reducer's gradient buckets), and its ``collective_seq_id`` equals the process group's sequence
number. It cannot serve alone: its buffer lives in the rank's memory and is dumped on request (NCCL's
watchdog also dumps on a timeout; gloo has no watchdog), so a rank that gloo aborts leaves nothing;
on gloo every entry stays ``"scheduled"`` (no completion is tracked), so it cannot say who waits; and
it knows no Lightning key, hook or torchmetrics state. So the Python-level functions of
``torch.distributed`` are wrapped while the trace is active, each call is written before it enters the
backend, and the Flight Recorder's entries are added at the end with ``pg_seq`` to line them up.

Layout: ``_patch.py`` (the one patch of ``torch.distributed`` the trace and the guard share, and its
restore rule), ``_classify.py`` (which code made a collective), ``_record.py`` (:class:`CollectiveTrace`),
``_batches.py`` (``batch`` events, samples), ``_read.py`` (:func:`read_trace`, :func:`split_trace`),
``_words.py`` (events in words, as the audit and the guard print them). docs/trace.md describes the events
for a reader of a trace file.
"""

from ddpprobe.trace._batches import ID_FIELDS, batch_samples, describe_batch, sample_label
from ddpprobe.trace._classify import RANK_NAMES, CallClassifier, call_site_of, public_name
from ddpprobe.trace._patch import COLLECTIVES, Call, Listener, attach, attached, collective_fields, detach, pg_seq
from ddpprobe.trace._read import read_trace, split_trace
from ddpprobe.trace._record import FLIGHT_RECORDER_ENV, LOG_OPTIONS, TRACE_SCHEMA, CollectiveTrace
from ddpprobe.trace._words import describe_call, describe_collective

__all__ = [
    "COLLECTIVES",
    "FLIGHT_RECORDER_ENV",
    "ID_FIELDS",
    "LOG_OPTIONS",
    "RANK_NAMES",
    "TRACE_SCHEMA",
    "Call",
    "CallClassifier",
    "CollectiveTrace",
    "Listener",
    "attach",
    "attached",
    "batch_samples",
    "call_site_of",
    "collective_fields",
    "describe_batch",
    "describe_call",
    "describe_collective",
    "detach",
    "pg_seq",
    "public_name",
    "read_trace",
    "sample_label",
    "split_trace",
]
