"""The semantics card: what one run of the facts established, as Markdown, JSON and a picture; and the
version matrix that merges the cards of several Lightning releases.

One module per job:

- ``plugin.py``: the pytest plugin (``--semantics-report``, ``--semantics-no-picture``, the ``semantics``
  fixture, the hooks that collect reports and write the card, once, in the xdist controller);
- ``record.py``: what one test case contributes: numbers (:func:`~ddpprobe.card.record.record_number`),
  its fact (the test's name as a sentence) and explanation (its docstring), its outcome;
- ``schema.json`` + ``schema.py``: the card's JSON Schema, its outcome codes and their words, and the
  validator; the writer, the validator and the matrix all read them from there;
- ``environment.py``: Python, torch, the Lightning package and version, torchmetrics, the machine;
- ``summary.py``: the seed question answered with the run's numbers, and the order of sections (``TOPIC_ORDER``);
- ``markdown.py``: the card rendered as Markdown;
- ``sharding.py``: the picture of a real world's ``DistributedSampler`` shards, padding copies marked;
- ``releases.py``: which Lightning releases the matrix covers, from the package index;
- ``matrix.py``: cards of several releases merged into ``docs/matrix.md``.

Only ``plugin.py`` and ``record.py`` need pytest; ``releases.py`` and ``matrix.py`` need neither torch nor
Lightning, so ``python -m ddpprobe.card.matrix`` runs in a bare environment.
"""
