"""Sequence-length balancing: reorder a batch so that each worker's equal-sized chunk holds a similar token count.

Workers get consecutive equal chunks of the batch (``WorkerGroup.run_split``), and a step lasts as long as its
slowest worker. Long and short samples are spread so the chunks' token totals are close: longest first, each to
the chunk with the fewest tokens that still has room.

Given the samples' groups (the ``n`` responses of one prompt), whole groups are balanced instead of samples when
the groups split evenly over the chunks: a prompt's samples then stay on one worker, so its vision tensors travel
to one worker only and its prompt can be computed once for all of them (``worker.actor.share_prompt``).
"""

from __future__ import annotations

from collections.abc import Sequence


def balanced_order(token_counts: list[int], num_parts: int, groups: Sequence[object] | None = None) -> list[int]:
    """A permutation of ``range(len(token_counts))`` whose ``num_parts`` consecutive equal chunks have near-equal
    token totals (each chunk's indices ascending, so order within a chunk is the original one).

    ``groups`` (one label per sample, e.g. the prompt's ``uid``) keeps each group's samples in one chunk when the
    groups are of equal size and their number is a multiple of ``num_parts``; otherwise samples are balanced one
    by one.
    """
    if len(token_counts) % num_parts:
        raise ValueError(f"{len(token_counts)} samples do not split into {num_parts} equal parts")
    units = _group_members(groups, len(token_counts), num_parts) if groups is not None else None
    if units is None:
        units = [[index] for index in range(len(token_counts))]
    unit_loads = [sum(token_counts[i] for i in unit) for unit in units]
    size = len(units) // num_parts  # units per chunk
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    loads = [0] * num_parts
    for unit in sorted(range(len(units)), key=lambda u: (-unit_loads[u], u)):
        open_parts = [part for part in range(num_parts) if len(parts[part]) < size]
        target = min(open_parts, key=lambda part: (loads[part], part))
        parts[target].append(unit)
        loads[target] += unit_loads[unit]
    return [index for part in parts for index in sorted(i for unit in part for i in units[unit])]


def _group_members(groups: Sequence[object], count: int, num_parts: int) -> list[list[int]] | None:
    """The sample indices of each group (in order of first appearance), or ``None`` when whole groups cannot fill
    equal chunks (groups of different sizes, or a number of groups that ``num_parts`` does not divide)."""
    if len(groups) != count:
        raise ValueError(f"{len(groups)} group labels for {count} samples")
    members: dict[object, list[int]] = {}
    for index, label in enumerate(groups):
        members.setdefault(label, []).append(index)
    units = list(members.values())
    if len({len(unit) for unit in units}) != 1 or len(units) % num_parts:
        return None
    return units
