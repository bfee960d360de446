#!/usr/bin/env python3
"""A list-scheduling model of a fused attention backward whose dQ shares are summed in a fixed order.

In a fused kernel each block (one key tile kt of one kv head of one row: a "unit") also computes, for
every query tile qt it meets, that tile's share of dQ; the shares of (head, qt) are added to one
accumulator in a fixed key-tile order so that the sum repeats bit for bit. A block whose turn has not
come waits. This model asks how much such waiting, and the order blocks start in, cost on their own,
with every item taking the same time, so that a measured slowdown can be split between scheduling
and the reduction itself.

Model: `slots` blocks run at once (132 SMs x 3 blocks at D = 64); a unit is a whole block's loop,
started on the first free slot in the order given; an item (one query tile of one query head) takes
1 time unit, 0.6 on the diagonal (half its entries are masked); an item's share may be added once
the share before it in the order has been added, and an add completes `latency` units after it is
issued. The block stalls while it waits for its turn. Time is in items, so "ratio" is the slowdown
against an ideal schedule with no waits and no idle slots.

    python3 tools/attn_bwd_schedule_model.py [--tiles 64] [--group 4] [--chains 32] [--slots 396]

The defaults are Llama-3.2-1B's heads at 4 x 4096 tokens: 64 key tiles of 64, 4 query heads a kv
head, 4 rows x 8 kv heads = 32 chains of blocks that share accumulators.
"""
import argparse
import heapq


def simulate(units, items_of, previous_share, slots, latency):
    """Returns (makespan, ideal, mean wait per slot). units: in start order; items_of(unit): the
    unit's items (chain, head, qt, kt) in its loop order; previous_share(item): the item whose add
    must complete first, or None."""
    free = [0.0] * slots
    added = {}  # item -> time its add completes
    work = wait = 0.0
    for unit in units:
        t = heapq.heappop(free)
        for item in items_of(unit):
            _, _, qt, kt = item
            step = 0.6 if qt == kt else 1.0
            work += step
            t += step
            before = previous_share(item)
            if before is not None:
                if before not in added:
                    raise SystemExit(f"unit {unit} waits on {before}, which no earlier unit adds: this order can deadlock")
                if added[before] > t:
                    wait += added[before] - t
                    t = added[before]
            added[item] = t + latency
        heapq.heappush(free, t)
    return max(free), work / slots, wait / slots


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiles", type=int, default=64, help="key (and query) tiles a row")
    ap.add_argument("--group", type=int, default=4, help="query heads a kv head")
    ap.add_argument("--chains", type=int, default=32, help="rows x kv heads")
    ap.add_argument("--slots", type=int, default=396, help="blocks resident at once")
    args = ap.parse_args()
    n, group, chains, slots = args.tiles, args.group, args.chains, args.slots

    heavy_first = [(c, kt) for kt in range(n) for c in range(chains)]  # key tile 0 meets the most queries
    light_first = [(c, kt) for kt in reversed(range(n)) for c in range(chains)]
    last_query_down = lambda u: [(u[0], h, qt, u[1]) for qt in reversed(range(u[1], n)) for h in range(group)]
    diagonal_up = lambda u: [(u[0], h, qt, u[1]) for qt in range(u[1], n) for h in range(group)]
    ascending_turns = lambda i: None if i[3] == 0 else (i[0], i[1], i[2], i[3] - 1)  # kt 0 adds first
    descending_turns = lambda i: None if i[3] == i[2] else (i[0], i[1], i[2], i[3] + 1)  # the diagonal first
    no_turns = lambda i: None

    cases = [
        ("no shared sum (the two-kernel dK/dV loop)", heavy_first, diagonal_up, no_turns),
        ("heavy first, query tiles from the last down, ascending turns (bf7cc93)", heavy_first, last_query_down,
         ascending_turns),
        ("light first, query tiles from the diagonal up, descending turns", light_first, diagonal_up,
         descending_turns),
    ]
    print(f"{n} tiles, {group} query heads a kv head, {chains} chains, {slots} slots; time in items")
    print(f"{'order':74s} {'latency':>7s} {'makespan':>8s} {'ratio':>6s} {'wait/slot':>9s}")
    for name, units, items_of, previous in cases:
        for latency in (0.5, 2.0):
            makespan, ideal, wait = simulate(units, items_of, previous, slots, latency)
            print(f"{name:74s} {latency:7.1f} {makespan:8.0f} {makespan / ideal:6.3f} {wait:9.1f}")
            if previous is no_turns:
                break


if __name__ == "__main__":
    main()
