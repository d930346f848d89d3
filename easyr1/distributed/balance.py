"""Sequence-length balancing: reorder a batch so that each worker's equal-sized chunk holds a similar token count.

Workers get consecutive equal chunks of the batch (``WorkerGroup.run_split``), and a step lasts as long as its
slowest worker. Long and short samples are spread so the chunks' token totals are close: longest sample first,
each to the chunk with the fewest tokens that still has room.
"""

from __future__ import annotations


def balanced_order(token_counts: list[int], num_parts: int) -> list[int]:
    """A permutation of ``range(len(token_counts))`` whose ``num_parts`` consecutive equal chunks have near-equal
    token totals (each chunk's indices ascending, so order within a chunk is the original one)."""
    size, remainder = divmod(len(token_counts), num_parts)
    if remainder:
        raise ValueError(f"{len(token_counts)} samples do not split into {num_parts} equal parts")
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    loads = [0] * num_parts
    for index in sorted(range(len(token_counts)), key=lambda i: (-token_counts[i], i)):
        open_parts = [part for part in range(num_parts) if len(parts[part]) < size]
        target = min(open_parts, key=lambda part: (loads[part], part))
        parts[target].append(index)
        loads[target] += token_counts[index]
    return [index for part in parts for index in sorted(part)]
