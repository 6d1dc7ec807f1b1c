"""Number partitioning: split weighted items over k bins so the largest bin is as small as possible.

Used by the imbalance analysis for the balanced counterfactual: how even the ranks' token loads
could have been had the same prompt groups been dealt out by a balancing partitioner.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def _check(weights: Sequence[float], k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    if any(w < 0 for w in weights):
        raise ValueError("weights must not be negative")


def karmarkar_karp(weights: Sequence[float], k: int) -> list[list[int]]:
    """Split item indices 0..n-1 into k bins with the Karmarkar–Karp largest differencing method.

    Every item starts as a k-tuple of bin sums (w, 0, ..., 0). While more than one tuple is left,
    the two tuples with the largest spread (max sum − min sum) are merged: sort one ascending and
    the other descending by bin sum and add bin by bin, so the largest bin of one meets the smallest
    of the other; then subtract the minimum from every bin (only differences matter). The last
    tuple's bins are the answer. O(n log n + n·k log k). Returns k lists of indices (some may be
    empty when n < k); each index appears exactly once.
    """
    _check(weights, k)
    # A tuple is (bin sums sorted descending, the items of each bin), normalized so min sum is 0.
    heap: list[tuple[float, int, list[float], list[list[int]]]] = []
    for index, weight in enumerate(weights):
        sums = [float(weight)] + [0.0] * (k - 1)
        members = [[index]] + [[] for _ in range(k - 1)]
        heap.append((-float(weight), index, sums, members))
    if not heap:
        return [[] for _ in range(k)]
    heapq.heapify(heap)
    tie = len(heap)
    while len(heap) > 1:
        _, _, sums_a, members_a = heapq.heappop(heap)
        _, _, sums_b, members_b = heapq.heappop(heap)
        # Both are sorted descending: pair a's i-th largest with b's i-th smallest.
        merged = sorted(
            ((sums_a[i] + sums_b[k - 1 - i], members_a[i] + members_b[k - 1 - i]) for i in range(k)),
            key=lambda pair: pair[0],
            reverse=True,
        )
        low = merged[-1][0]
        sums = [s - low for s, _ in merged]
        heapq.heappush(heap, (-(sums[0] - sums[-1]), tie, sums, [m for _, m in merged]))
        tie += 1
    return heap[0][3]


def lpt(weights: Sequence[float], k: int) -> list[list[int]]:
    """Split item indices 0..n-1 into k bins by Longest Processing Time first.

    Items in descending weight order each go to the bin with the smallest sum so far (ties to the
    lowest bin number). Graham's bound: max bin ≤ (4/3 − 1/(3k)) · optimum, and always
    max bin ≤ sum/k + max weight. O(n log n + n log k). Returns k lists of indices.
    """
    _check(weights, k)
    bins: list[list[int]] = [[] for _ in range(k)]
    heap = [(0.0, b) for b in range(k)]
    for index in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        load, b = heapq.heappop(heap)
        bins[b].append(index)
        heapq.heappush(heap, (load + float(weights[index]), b))
    return bins


def bin_loads(weights: Sequence[float], bins: list[list[int]]) -> list[float]:
    """Sum of the weights in each bin: load_b = Σ_{i ∈ bin b} w_i."""
    return [float(sum(weights[i] for i in members)) for members in bins]


def imbalance(loads: Sequence[float]) -> float | None:
    """λ = max(loads) / mean(loads); None when the mean is 0 or there are no loads."""
    if not loads:
        return None
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean > 0 else None
