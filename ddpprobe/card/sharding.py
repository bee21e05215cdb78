"""The card's picture of sharding: what each rank's ``validation_step`` saw in a real world, as SVG.

The world is ``ddpprobe.probes.validation.validate`` with ``n=PICTURE_N`` samples at world size
``PICTURE_WORLD_SIZE`` and batch size ``PICTURE_BATCH``: N does not divide by W, so ``DistributedSampler``
pads. It runs at the end of the session, in the pytest controller, with the ``gloo`` backend (the sharding
is ``DistributedSampler``'s, the same for every backend) unless ``--backend nccl`` has W CUDA devices.

Which copy is the padding: ``DistributedSampler`` (``torch/utils/data/distributed.py``, ``__iter__``) lists
the indices ``0..N-1``, appends the first ``ceil(N/W)*W - N`` of them again, and deals the list round-robin:
rank ``r``'s slot ``s`` is list position ``s*W + r``. The first time a sample appears in that order is the
original; every later appearance is a padding duplicate, and only those are marked.
"""

from __future__ import annotations

from pathlib import Path

#: The picture's world: ``validation.validate(n=PICTURE_N, batch_size=PICTURE_BATCH)`` at world size
#: ``PICTURE_WORLD_SIZE``; N does not divide by W, so ``DistributedSampler`` pads.
PICTURE_N = 10
PICTURE_WORLD_SIZE = 4
PICTURE_BATCH = 2


def picture_path(card_path) -> Path:
    """``docs/semantics.md`` -> ``docs/semantics-sharding.svg``."""
    card_path = Path(card_path)
    return card_path.with_name(card_path.stem + "-sharding.svg")


def run_sharding_world(backend: str = "gloo", timeout=None, start_method=None) -> list:
    """Run ``validation.validate(n=10, batch_size=2)`` in a real world of 4 ranks.

    Returns:
        Per rank, per batch, the sample ids its ``validation_step`` saw (``[[[0, 4], [8]], ...]``).

    Raises:
        Whatever ``ddpprobe.run_world`` raises (``RankFailed``, ``RankDied``, ``WorldTimeout``).
    """
    from ddpprobe.launch import run_world
    from ddpprobe.probes import validation

    options = {k: v for k, v in {"timeout": timeout, "start_method": start_method}.items() if v is not None}
    world = run_world(
        validation.validate, PICTURE_WORLD_SIZE, backend=backend, n=PICTURE_N, batch_size=PICTURE_BATCH, **options
    )
    return [[[int(i) for i in batch] for batch in record["seen_ids"]] for record in world.records]


def duplicated_ids(seen: list) -> list:
    """Sample ids that occur more than once over all ranks' batches, sorted."""
    counts = _counts(seen)
    return sorted(s for s, c in counts.items() if c > 1)


def padding_cells(seen: list) -> list:
    """``[rank, slot]`` of every later copy of a sample, in ``DistributedSampler``'s dealing order.

    Args:
        seen: per rank, per batch, the sample ids of a world whose sampler did not shuffle.

    Returns:
        The cells whose sample already appeared at an earlier list position ``slot * W + rank``
        (the padding), e.g. ``[[2, 2], [3, 2]]`` for N=10 at W=4.
    """
    flat = [[sample for batch in rank_batches for sample in batch] for rank_batches in seen]
    world_size = len(flat)
    order = sorted(
        ((slot, rank) for rank, row in enumerate(flat) for slot in range(len(row))),
        key=lambda sr: sr[0] * world_size + sr[1],
    )
    dealt, padding = set(), []
    for slot, rank in order:
        sample = flat[rank][slot]
        if sample in dealt:
            padding.append([rank, slot])
        dealt.add(sample)
    return padding


def sharding_entry(card_path, backend: str, timeout=None, start_method=None) -> dict:
    """Run the world, draw the picture next to ``card_path``, and return the card's ``sharding`` entry.

    A failed world does not raise: the entry then has ``seen: null`` and the reason in ``error``.
    """
    entry = {
        "n": PICTURE_N,
        "world_size": PICTURE_WORLD_SIZE,
        "batch_size": PICTURE_BATCH,
        "backend": backend,
        "seen": None,
        "duplicates": [],
        "padding": [],
        "svg": None,
        "error": None,
    }
    try:
        seen = run_sharding_world(backend=backend, timeout=timeout, start_method=start_method)
    except Exception as exc:  # a failed world must not lose the card; the card says why
        from ddpprobe.card.record import one_line

        entry["error"] = one_line(f"{type(exc).__name__}: {exc}", 500)
        return entry
    svg = picture_path(card_path)
    svg.parent.mkdir(parents=True, exist_ok=True)
    svg.write_text(sharding_svg(seen, n=PICTURE_N), encoding="utf-8")
    entry.update(seen=seen, duplicates=duplicated_ids(seen), padding=padding_cells(seen), svg=svg.name)
    return entry


def _counts(seen: list) -> dict:
    counts: dict = {}
    for rank_batches in seen:
        for batch in rank_batches:
            for sample in batch:
                counts[sample] = counts.get(sample, 0) + 1
    return counts


def sharding_svg(seen: list, n: int) -> str:
    """A plain-SVG grid of what each rank saw.

    Args:
        seen: per rank, per batch, the sample ids (``validate``'s ``seen_ids`` of each rank).
        n: dataset size, for the strip of per-sample counts under the grid.

    Returns:
        SVG text. One ``<rect class="cell ...">`` per (rank, slot), where slot is the position in the
        rank's shard, carrying ``data-rank``, ``data-slot``, ``data-sample``, ``data-batch`` and
        ``data-count`` (how many times the sample was evaluated over all ranks). Only the padding, the
        later copies of a sample (:func:`padding_cells`), also carry class ``duplicate`` and are drawn
        in orange; the original copy stays plain. Under the grid, one ``<rect class="count">`` per
        sample id 0..n-1 shows how many times it was evaluated.
    """
    flat = [[(sample, b) for b, batch in enumerate(rank_batches) for sample in batch] for rank_batches in seen]
    counts = _counts(seen)
    padding = {tuple(cell) for cell in padding_cells(seen)}
    world_size = len(flat)
    slots = max((len(row) for row in flat), default=0)
    cell_w, cell_h, left, top = 64, 40, 86, 64
    strip_top = top + world_size * cell_h + 58
    width = max(left + slots * cell_w, left + n * 34, left + 460) + 24
    height = strip_top + 34 + 76
    dup, plain, twice = "#f4a259", "#cfe3f5", "#fbe3c8"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="13">',
        f"<title>Which samples each rank's validation_step saw: N={n}, world size {world_size}</title>",
        '<rect x="0" y="0" width="100%" height="100%" fill="white"/>',
        f'<text x="{left}" y="22" font-size="15" font-weight="bold">DistributedSampler shards: N = {n}, '
        f"world size = {world_size}</text>",
    ]
    for slot in range(slots):
        out.append(
            f'<text x="{left + slot * cell_w + cell_w / 2}" y="{top - 8}" text-anchor="middle" '
            f'fill="#555">slot {slot}</text>'
        )
    for rank, row in enumerate(flat):
        y = top + rank * cell_h
        out.append(f'<text x="{left - 10}" y="{y + cell_h / 2 + 5}" text-anchor="end">rank {rank}</text>')
        for slot, (sample, batch) in enumerate(row):
            x = left + slot * cell_w
            is_dup = (rank, slot) in padding
            role = "padding copy" if is_dup else "original" if counts[sample] > 1 else "only copy"
            out.append(
                f'<rect class="cell{" duplicate" if is_dup else ""}" data-rank="{rank}" data-slot="{slot}" '
                f'data-sample="{sample}" data-batch="{batch}" data-count="{counts[sample]}" x="{x + 2}" y="{y + 2}" '
                f'width="{cell_w - 4}" height="{cell_h - 4}" rx="4" fill="{dup if is_dup else plain}" '
                f'stroke="{"#b5520b" if is_dup else "#7fa7c9"}"><title>rank {rank}, slot {slot} (batch {batch}): '
                f"sample {sample}, evaluated {counts[sample]}x ({role})</title></rect>"
            )
            out.append(f'<text x="{x + cell_w / 2}" y="{y + cell_h / 2 + 5}" text-anchor="middle">{sample}</text>')
        # batch boundaries of this rank: a dark tick between slots of different batches
        for slot in range(1, len(row)):
            if row[slot][1] != row[slot - 1][1]:
                x = left + slot * cell_w
                out.append(
                    f'<line x1="{x}" y1="{y + 4}" x2="{x}" y2="{y + cell_h - 4}" stroke="#333" stroke-width="2"/>'
                )
    out.append(f'<text x="{left}" y="{strip_top - 12}" fill="#555">times each sample id was evaluated</text>')
    for sample in range(n):
        x = left + sample * 34
        count = counts.get(sample, 0)
        fill = twice if count > 1 else plain if count == 1 else "#eeeeee"
        out.append(
            f'<rect class="count" data-sample="{sample}" data-count="{count}" x="{x + 1}" y="{strip_top}" '
            f'width="32" height="28" rx="3" fill="{fill}" stroke="#999"/>'
        )
        out.append(f'<text x="{x + 17}" y="{strip_top + 13}" text-anchor="middle" font-size="11">{sample}</text>')
        out.append(
            f'<text x="{x + 17}" y="{strip_top + 25}" text-anchor="middle" font-size="10" fill="#333">{count}x</text>'
        )
    legend_y = strip_top + 52
    batch_size = max((len(b) for r in seen for b in r), default=0)
    out.append(f'<rect x="{left}" y="{legend_y - 11}" width="14" height="14" fill="{dup}" stroke="#b5520b"/>')
    out.append(
        f'<text x="{left + 20}" y="{legend_y}">padding: a later copy of a sample the sampler already dealt</text>'
    )
    out.append(
        f'<line x1="{left + 7}" y1="{legend_y + 10}" x2="{left + 7}" y2="{legend_y + 25}" '
        'stroke="#333" stroke-width="2"/>'
    )
    out.append(f'<text x="{left + 20}" y="{legend_y + 22}">batch boundary (batch size {batch_size})</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
