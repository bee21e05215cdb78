"""What the callbacks did, from the state each rank recorded at the end of the stage (``audit_rank``'s
``callbacks``): one entry per ``ModelCheckpoint`` / ``EarlyStopping``, its fields side by side per rank and
the fields on which the ranks disagree. Pure Python.

Why the ranks can disagree: ``ModelCheckpoint.check_monitor_top_k`` reduces each rank's own "improved"
decision with ``reduce_boolean_decision`` (all ranks) and every rank then stores its own value; ``EarlyStopping``
stops every rank when any rank wants to, and only the ranks whose own value met the criterion record a
stopping reason (tests/facts/test_callbacks.py:
``test_model_checkpoint_saves_only_when_every_rank_improves_and_keeps_a_rank_local_best_score``,
``test_only_the_ranks_whose_own_value_met_the_criterion_record_a_stopping_reason``).
"""

from __future__ import annotations

#: The fields compared across ranks, per callback type.
FIELDS = {
    "ModelCheckpoint": ("best_model_score", "best_model_path", "best_k_models", "files"),
    "EarlyStopping": ("wait_count", "stopped_epoch", "stopping_reason"),
}


def callback_rows(records: list) -> list:
    """``[{"callback", "monitor", "fields": {name: [value per rank]}, "differs": [names]}]`` for the
    callbacks every rank recorded, in the Trainer's order (matched by position)."""
    per_rank = [rec.get("callbacks") or [] for rec in records]
    if not per_rank or not all(len(p) == len(per_rank[0]) for p in per_rank):
        return []
    out = []
    for i, first in enumerate(per_rank[0]):
        kind = first["callback"]
        fields = {name: [p[i].get(name) for p in per_rank] for name in FIELDS.get(kind, ())}
        out.append(
            {
                "callback": kind,
                "monitor": first.get("monitor"),
                "fields": fields,
                "differs": [name for name, values in fields.items() if any(v != values[0] for v in values)],
            }
        )
    return out


def describe(row: dict) -> str:
    """One callback's end state in words: each field once where every rank agrees, per rank where not."""
    parts = []
    for name, values in row["fields"].items():
        if name in row["differs"]:
            parts.append(f"{name} " + ", ".join(f"rank {r} {v!r}" for r, v in enumerate(values)) + " (ranks differ)")
        else:
            parts.append(f"{name} {values[0]!r} on every rank")
    return f"{row['callback']}(monitor={row['monitor']!r}): " + "; ".join(parts)
