"""The share of a later epoch's chunk reads an LRU pool serves from memory when each epoch reads
every chunk once in a new random order, by the share of the chunks the budget holds: the figure
behind `decode_into_batches = auto`'s quarter (docs/benchmarks.md, "Decoding into batch rows").

    python bench/lru_hits.py [CHUNKS] [EPOCHS]
"""

import random
import sys
from collections import OrderedDict


def later_epoch_hits(chunks: int, held: int, epochs: int, rng: random.Random) -> float:
    lru: OrderedDict[int, None] = OrderedDict()
    hits = reads = 0
    for epoch in range(epochs):
        order = list(range(chunks))
        rng.shuffle(order)
        for c in order:
            hit = c in lru
            if hit:
                lru.move_to_end(c)
            else:
                lru[c] = None
                if len(lru) > held:
                    lru.popitem(last=False)
            if epoch > 0:
                reads += 1
                hits += hit
    return hits / reads


def main() -> None:
    chunks = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    rng = random.Random(0)
    print("budget / split   later-epoch hits")
    for share in (0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9, 1.0):
        h = later_epoch_hits(chunks, round(chunks * share), epochs, rng)
        print(f"{share:>14.2f}   {h:>16.1%}")


if __name__ == "__main__":
    main()
