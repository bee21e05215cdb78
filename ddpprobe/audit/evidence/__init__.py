"""The audit's second room, evidence: what the recorded worlds prove, as pure functions of records. The stages and
the loop each hook runs in (``_stages``, read by every room), the samples
each rank's loop ran (``_counts``), the logged keys and the reference each is compared with (``_keys``,
``_values``), the ranks' collective sequences and their first divergence (``_sequences``) with its culprit
(``_culprit``), the callbacks' end state (``_callbacks``), what reached ``logger.experiment`` (``_experiment``),
hooks some ranks never entered (``_hooks``) and the arithmetic of a logged value (``_arithmetic``)."""
