"""Number partitioning: split weighted items over k bins so the largest bin is as small as possible.

Used by the imbalance analysis for the balanced counterfactual: how even the ranks' token loads
could have been had the same prompt groups been dealt out by a balancing partitioner.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

# Cells (instances × items × bins) one batched step may hold; bounds memory of the batched forms.
BATCH_CELLS = 4_000_000
# Above this many items the batched differencing (O(n²) per instance) loses to a heap per instance.
BATCH_MAX_ITEMS = 3000


def _check(weights: Sequence[float], k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    if any(w < 0 for w in weights):
        raise ValueError("weights must not be negative")


def _differencing(weights: Sequence[float], k: int, keep_members: bool) -> tuple[list[float], list[list[int]]]:
    """The last tuple of the Karmarkar–Karp differencing: its bin sums (descending, minimum 0) and,
    when `keep_members`, the item indices of each bin (empty lists otherwise).

    Every item starts as a k-tuple of bin sums (w, 0, ..., 0). While more than one tuple is left,
    the two tuples with the largest spread (max sum − min sum) are merged, equal spreads in creation
    order (items by index, then merged tuples as made): a's i-th largest bin is added to b's i-th
    smallest, the bins re-sorted descending and the smallest subtracted from all (only differences
    matter).
    """
    heap: list[tuple[float, int, list[float], list[list[int]]]] = []
    for index, weight in enumerate(weights):
        members = [[index]] + [[] for _ in range(k - 1)] if keep_members else []
        heap.append((-float(weight), index, [float(weight)] + [0.0] * (k - 1), members))
    if not heap:
        return [0.0] * k, [[] for _ in range(k)]
    heapq.heapify(heap)
    tie = len(heap)
    while len(heap) > 1:
        _, _, sums_a, members_a = heapq.heappop(heap)
        _, _, sums_b, members_b = heapq.heappop(heap)
        paired = [sums_a[i] + sums_b[k - 1 - i] for i in range(k)]
        order = sorted(range(k), key=paired.__getitem__, reverse=True)
        low = paired[order[-1]]
        sums = [paired[i] - low for i in order]
        members = [members_a[i] + members_b[k - 1 - i] for i in order] if keep_members else []
        heapq.heappush(heap, (-(sums[0] - sums[-1]), tie, sums, members))
        tie += 1
    _, _, sums, members = heap[0]
    return sums, members if keep_members else [[] for _ in range(k)]


def karmarkar_karp(weights: Sequence[float], k: int) -> list[list[int]]:
    """Split item indices 0..n-1 into k bins with the Karmarkar–Karp largest differencing method
    (`_differencing`): the last tuple's bins are the answer. O(n log n + n·k log k). Returns k lists
    of indices (some may be empty when n < k); each index appears exactly once.
    """
    _check(weights, k)
    return _differencing(weights, k, keep_members=True)[1]


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


def _padded(instances: list[Sequence[float]]) -> np.ndarray:
    width = max((len(w) for w in instances), default=0)
    out = np.zeros((len(instances), width))
    for row, weights in enumerate(instances):
        out[row, : len(weights)] = weights
    return out


def _chunks(instances: list[Sequence[float]], k: int, columns_per_item: int = 1):
    width = max((len(w) for w in instances), default=1) or 1
    size = max(1, BATCH_CELLS // (width * columns_per_item * k))
    for start in range(0, len(instances), size):
        yield instances[start : start + size]


def _kk_max_load_heap(weights: Sequence[float], k: int) -> float:
    """Largest bin of `karmarkar_karp(weights, k)` from the bin sums alone: the last tuple holds the
    loads minus the smallest load m, so max load = s_max + m with m = (Σ w − Σ s) / k."""
    sums, _ = _differencing(weights, k, keep_members=False)
    return sums[0] + (float(sum(weights)) - sum(sums)) / k


def _kk_max_loads_batched(instances: list[Sequence[float]], k: int) -> np.ndarray:
    """Largest KK bin of each instance, all instances advanced one merge per iteration (numpy).

    The heap of karmarkar_karp pops the largest spread, equal spreads in creation order (items by
    index, then merged tuples as made). Here the items of each row are sorted by weight, descending
    (stable, so equal weights keep index order): the next item is the largest one left. Merged
    tuples live in a second array in creation order, where the first maximal column (argmax) is
    the one the heap would pop; an item wins a tie against a merged tuple (made earlier). Dead
    merged tuples are squeezed out (order kept) when they outnumber the live ones.
    """
    weights = _padded(instances)
    count, width = weights.shape
    rows = np.arange(count)
    present = np.arange(width) < np.array([len(w) for w in instances])[:, None]
    order = np.argsort(np.where(present, -weights, np.inf), axis=1, kind="stable")
    items = np.where(present, np.take_along_axis(weights, order, axis=1), -np.inf)
    items = np.concatenate([items, np.full((count, 1), -np.inf)], axis=1)  # sentinel after the last item
    next_item = np.zeros(count, dtype=np.int64)
    capacity = width + 1
    tuples = np.zeros((count, capacity, k))
    spread = np.full((count, capacity), -np.inf)
    live = np.zeros(count, dtype=np.int64)
    end = 1

    def pop():
        item = items[rows, next_item]
        at = spread[:, :end].argmax(axis=1)
        best = spread[rows, at]
        from_items = (item >= best) & np.isfinite(item)
        value = np.where(from_items, item, best)
        vector = tuples[rows, at].copy()
        vector[from_items] = 0.0
        vector[from_items, 0] = item[from_items]
        next_item[from_items] += 1
        taken = ~from_items & np.isfinite(best)
        spread[rows[taken], at[taken]] = -np.inf
        live[taken] -= 1
        return value, vector, from_items, at, taken

    for _ in range(width - 1):
        if end == capacity or 2 * int(live.max()) + 1 < end:
            keep = np.argsort(~np.isfinite(spread[:, :end]), axis=1, kind="stable")
            spread[:, :end] = np.take_along_axis(spread[:, :end], keep, axis=1)
            tuples[:, :end] = np.take_along_axis(tuples[:, :end], keep[:, :, None], axis=1)
            end = max(int(live.max()), 1)
            spread[:, end:] = -np.inf
        value_1, tuple_1, item_1, at_1, taken_1 = pop()
        value_2, tuple_2, _, _, _ = pop()
        active = np.isfinite(value_2)
        # A row with one tuple left is done: put back what its first pop took.
        done = ~active
        next_item[item_1 & done] -= 1
        restore = taken_1 & done
        spread[rows[restore], at_1[restore]] = value_1[restore]
        live[restore] += 1
        if not active.any():
            break
        merged = tuple_1 + tuple_2[:, ::-1]
        merged = -np.sort(-merged, axis=1)
        merged -= merged[:, -1:]
        tuples[:, end] = merged
        spread[:, end] = np.where(active, merged[:, 0], -np.inf)
        live += active
        end += 1
    at = spread.argmax(axis=1)
    merged_left = np.isfinite(spread[rows, at])
    sums = np.where(merged_left[:, None], tuples[rows, at], 0.0)
    lone = ~merged_left  # a one-item instance: its item is the only tuple
    sums[lone, 0] = np.where(np.isfinite(items[lone, 0]), items[lone, 0], 0.0)
    totals = weights.sum(axis=1)
    return sums[:, 0] + (totals - sums.sum(axis=1)) / k


def kk_max_loads(instances: list[Sequence[float]], k: int) -> np.ndarray:
    """The largest bin load of `karmarkar_karp(weights, k)` for each instance, computed in batches.

    Same differencing and tie-breaking as karmarkar_karp, tracking bin sums only: the final tuple
    holds loads minus the smallest load m, so max load = s_max + m with
    m = (Σ w − Σ s) / k. Instances are processed together (numpy over instances), with a per-instance
    heap for very large instances. An empty instance has max load 0.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    out = np.zeros(len(instances))
    small = [i for i, w in enumerate(instances) if 0 < len(w) <= BATCH_MAX_ITEMS]
    for i, w in enumerate(instances):
        if len(w) > BATCH_MAX_ITEMS:
            out[i] = _kk_max_load_heap(w, k)
    start = 0
    for chunk in _chunks([instances[i] for i in small], k, columns_per_item=2):
        out[small[start : start + len(chunk)]] = _kk_max_loads_batched(chunk, k)
        start += len(chunk)
    return out


def lpt_max_loads(instances: list[Sequence[float]], k: int) -> np.ndarray:
    """The largest bin load of `lpt(weights, k)` for each instance, computed in batches: every
    instance's weights sorted descending, the i-th largest added to the currently smallest bin
    (lowest bin on ties), all instances at once. Zero padding of shorter instances changes no load."""
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    out = np.zeros(len(instances))
    start = 0
    for chunk in _chunks(instances, k):
        weights = -np.sort(-_padded(chunk), axis=1)
        loads = np.zeros((len(chunk), k))
        rows = np.arange(len(chunk))
        for column in range(weights.shape[1]):
            target = loads.argmin(axis=1)
            loads[rows, target] += weights[:, column]
        out[start : start + len(chunk)] = loads.max(axis=1) if len(chunk) else []
        start += len(chunk)
    return out


def bin_loads(weights: Sequence[float], bins: list[list[int]]) -> list[float]:
    """Sum of the weights in each bin: load_b = Σ_{i ∈ bin b} w_i."""
    return [float(sum(weights[i] for i in members)) for members in bins]


def imbalance(loads: Sequence[float]) -> float | None:
    """λ = max(loads) / mean(loads); None when the mean is 0 or there are no loads."""
    if not loads:
        return None
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean > 0 else None
