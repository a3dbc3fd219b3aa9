"""Is every launch fast? Separate 2-rank launches of one allreduce size, each reporting its median time.

A job's speed can depend on the launch (how the ranks' processes, memory and
cores happen to fall), so one launch says little. This starts ``--launches``
separate 2-rank jobs per size (64 MiB and 16 MiB by default, float32 sum, in
place, shared memory), each timing its own calls after a warm-up, and prints
the distribution of the launches' medians: best, p10, median, p90, worst,
worst/best, how many launches took over 1.5x the best, and the median's bus
bandwidth (2(n-1)/n * bytes / time). Sizes alternate launch by launch, so a
slow phase of the machine hits both alike. Memcpy bandwidth of the same size,
measured in each launch, is the physical reference: a second table divides
each launch's allreduce time by that launch's memcpy time, which a slow
phase of the machine moves less than a slow mode of Hora's would.

A large buffer is slow for its first passes here, and then fast: a 64 MiB
allreduce starts at 11-12 ms and settles near 5 ms over 10 to 30 calls
(MPI's 24 -> 19-20 ms; a memcpy of 64 MiB 8 -> 4 ms over 4 copies), and
the buffer is slow again after another buffer of that size has been used
in between: the memory hierarchy keeps what is in use close, as it keeps a
training loop's gradients. Timed after 5 calls, a launch's median fell
anywhere on that slope (64 MiB: 4.7 to 11.6 ms over 100 launches). So the
launches time their calls after WARMUP calls, and the first call of each
launch (a buffer just allocated) is reported apart.

    python bench/stability.py [--launches 100] [--sizes 64,16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from _peers import human, median_time, run_peer

WARMUP = 40  # calls before the timed ones (see the module's docstring)


def _worker(size: int) -> None:
    import hora
    import numpy as np

    hora.init()
    buffer = np.ones(size // 4, np.float32)
    hora.barrier()
    start = time.perf_counter()
    hora.allreduce_(buffer, op=hora.Sum)
    first = time.perf_counter() - start
    calls = 25 if size >= (16 << 20) else 100
    seconds = median_time(lambda: hora.allreduce_(buffer, op=hora.Sum), calls, hora.barrier, warmup=WARMUP)
    target = np.empty_like(buffer)
    copy = median_time(lambda: np.copyto(target, buffer), 10, lambda: None)
    if hora.rank() == 0:
        print("RESULT " + json.dumps({"seconds": seconds, "first_seconds": first, "memcpy_seconds": copy}), flush=True)
    hora.shutdown()


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=100, help="launches per size (default 100)")
    parser.add_argument("--sizes", default="64,16", help="MiB per allreduce, comma-separated (default 64,16)")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker)
        return
    if args.launches < 1:
        parser.error(f"--launches must be at least 1, got {args.launches}")
    try:
        sizes = [int(s) << 20 for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes takes whole MiB, comma-separated (like 64,16); got {args.sizes!r}")
    if any(size <= 0 for size in sizes):
        parser.error(f"--sizes must be positive, got {args.sizes!r}")
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    times: dict[int, list[float]] = {size: [] for size in sizes}
    copies: dict[int, list[float]] = {size: [] for size in sizes}
    firsts: dict[int, list[float]] = {size: [] for size in sizes}
    started = time.monotonic()
    for launch in range(args.launches):
        for size in sizes:
            result = run_peer("hora", 2, [sys.executable, os.path.abspath(__file__), "--worker", str(size)])
            times[size].append(result["seconds"])
            copies[size].append(result["memcpy_seconds"])
            firsts[size].append(result["first_seconds"])
        if (launch + 1) % 10 == 0:
            print(f"  {launch + 1} launches per size, {time.monotonic() - started:.0f} s", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")
    print(
        "| size | launches | best | p10 | median | p90 | worst | worst/best | over 1.5x best | median bus GB/s "
        "| memcpy GB/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for size in sizes:
        t = times[size]
        best, median = min(t), statistics.median(t)
        slow = sum(1 for x in t if x > 1.5 * best)
        memcpy = size / statistics.median(copies[size]) / 1e9
        cells = [f"{1e3 * x:.2f} ms" for x in (best, _percentile(t, 0.1), median, _percentile(t, 0.9), max(t))]
        print(
            f"| {human(size)} | {len(t)} | {' | '.join(cells)} | {max(t) / best:.2f}x | {slow} "
            f"| {size / median / 1e9:.2f} | {memcpy:.2f} |"
        )
    # The machine's own speed moves between launches (its memcpy does too): each launch's allreduce against the
    # memcpy of the same buffer in that launch tells a slow mode of Hora's from a slow phase of the machine.
    print(
        "\nPer launch, against that launch's memcpy of the buffer (allreduce time / memcpy time; memcpy's own spread "
        "is the machine's):\n"
    )
    print("| size | best | median | worst | worst/best | over 1.5x best | memcpy worst/best |")
    print("|---|---|---|---|---|---|---|")
    for size in sizes:
        ratios = [t / c for t, c in zip(times[size], copies[size], strict=True)]
        best, median = min(ratios), statistics.median(ratios)
        slow = sum(1 for x in ratios if x > 1.5 * best)
        print(
            f"| {human(size)} | {best:.2f} | {median:.2f} | {max(ratios):.2f} | {max(ratios) / best:.2f}x | {slow} "
            f"| {max(copies[size]) / min(copies[size]):.2f}x |"
        )
    print("\nThe first call of each launch, on a buffer just allocated:\n")
    print("| size | best | median | worst |")
    print("|---|---|---|---|")
    for size in sizes:
        cells = [f"{1e3 * x:.2f} ms" for x in (min(firsts[size]), statistics.median(firsts[size]), max(firsts[size]))]
        print(f"| {human(size)} | {' | '.join(cells)} |")
    print("\nmedians per launch (ms), in launch order:")
    for size in sizes:
        print(f"{human(size)}: " + " ".join(f"{1e3 * x:.1f}" for x in times[size]))


if __name__ == "__main__":
    main()
