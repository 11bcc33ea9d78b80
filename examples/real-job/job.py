"""A real workload for the local cluster's real node: finds the start below a bound with the
longest Collatz chain (a few seconds of one core in plain Python), says where it ran and what
it found, and exits 0. Below 1,000,000 the answer is 837799 (524 steps down to 1); below
3,000,000, the default, 2298025 (559 steps)."""

from __future__ import annotations

import os
import socket
import time
from array import array


def longest_collatz(below: int) -> tuple[int, int]:
    """(start, steps) of the longest chain among the starts below `below`."""
    # Steps of the starts seen so far, two bytes each: a few MB, not a dict's hundreds.
    steps = array("H", bytes(2 * below))
    best = (1, 0)
    for start in range(2, below):
        n, path = start, []
        # Every start below this one is counted already.
        while n >= start:
            path.append(n)
            n = n // 2 if n % 2 == 0 else 3 * n + 1
        length = steps[n]
        for m in reversed(path):
            length += 1
            if m < below:
                steps[m] = length
        if length > best[1]:
            best = (start, length)
    return best


def main() -> None:
    below = int(os.environ.get("COLLATZ_BELOW", "3000000"))
    began = time.monotonic()
    start, steps = longest_collatz(below)
    # In a pod the hostname is the pod's name.
    print(
        f"host={socket.gethostname()} below={below} longest_start={start} steps={steps} "
        f"seconds={time.monotonic() - began:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
