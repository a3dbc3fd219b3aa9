"""Is every launch fast? Separate 2-rank launches of one allreduce size, each reporting its median time.

A job's speed can depend on the launch (how the ranks' processes, memory and
cores happen to fall), so one launch says little. This starts ``--launches``
separate 2-rank jobs per size (64 MiB and 16 MiB by default, float32 sum, in
place, shared memory), each timing its own calls after a warm-up, and prints
the distribution of the launches' medians: best, p10, median, p90, worst,
worst/best, how many launches took over 1.5x the best, and the median's bus
bandwidth (2(n-1)/n * bytes / time). Sizes alternate launch by launch, so a
slow phase of the machine hits both alike. Memcpy bandwidth of the same size,
measured in each launch, is one physical reference; the other is the peer
read: one rank copying out a buffer of that size which the other rank has
just written, through shared memory (the bytes a 2-rank allreduce must move
between the ranks' cores, with no algorithm around them). A second table
divides each launch's allreduce time by these, which a slow phase of the
machine moves less than a slow mode of Hora's would.

The two references move differently. A rank's memcpy of 16 MiB takes
1.3-2 ms in most launches here and 0.7 ms in some, in runs of consecutive
launches: as if this host's two vCPUs sometimes shared a last-level cache
(the two ranks' copies competing for it) and sometimes had one each (a
mode lasting from seconds to minutes), and then every byte the peer wrote
would cross between the caches. There a 16 MiB allreduce by reference
(single copy) took 3.7-6.3 ms against 2.5-2.9 through the rings, which is
why the rings carry every collective under 32 MiB (native/shm_link.h). The
peer read follows the machine's slow phases too, but not all of a launch's
spread: over 60 launches of 16 MiB, allreduce / peer read still ranged 3x.

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
    peer_read = _peer_read_seconds(buffer)
    if hora.rank() == 0:
        result = {"seconds": seconds, "first_seconds": first, "memcpy_seconds": copy, "peer_read_seconds": peer_read}
        print("RESULT " + json.dumps(result), flush=True)
    hora.shutdown()


def _peer_read_seconds(buffer, rounds: int = 10) -> float:
    """Median seconds this rank takes to copy out a buffer like ``buffer`` that the other rank has just written.

    The buffer lies in a shared-memory file; the ranks take turns writing it
    (from their own buffer) and reading it (into a private one), a barrier
    between, and only the reads are timed.
    """
    import mmap
    import tempfile

    import hora
    import numpy as np

    path = None
    if hora.rank() == 0:
        descriptor, path = tempfile.mkstemp(prefix="hora-stability-", dir="/dev/shm")
        os.ftruncate(descriptor, buffer.nbytes)
        os.close(descriptor)
    path = hora.broadcast_object(path, root_rank=0)
    with open(path, "r+b") as file:
        mapped = mmap.mmap(file.fileno(), buffer.nbytes)
    hora.barrier()
    if hora.rank() == 0:
        os.unlink(path)  # both have it mapped
    shared = np.frombuffer(mapped, buffer.dtype)
    private = np.empty_like(buffer)
    times = []
    for turn in range(2 * rounds):
        reader = turn % 2 != hora.rank()
        if not reader:
            np.copyto(shared, buffer)
        hora.barrier()
        if reader:
            start = time.perf_counter()
            np.copyto(private, shared)
            times.append(time.perf_counter() - start)
        hora.barrier()
    del shared
    mapped.close()
    return statistics.median(times)


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
    peer_reads: dict[int, list[float]] = {size: [] for size in sizes}
    firsts: dict[int, list[float]] = {size: [] for size in sizes}
    started = time.monotonic()
    for launch in range(args.launches):
        for size in sizes:
            result = run_peer("hora", 2, [sys.executable, os.path.abspath(__file__), "--worker", str(size)])
            times[size].append(result["seconds"])
            copies[size].append(result["memcpy_seconds"])
            peer_reads[size].append(result["peer_read_seconds"])
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
    # The machine's own speed moves between launches: each launch's allreduce against a copy of the same size in that
    # launch tells a slow mode of Hora's from a slow phase of the machine (see the module's docstring).
    print(
        "\nPer launch, against that launch's own copies of the buffer (allreduce time / copy time; the copy's own "
        "spread is the machine's):\n"
    )
    print("| size | against | best | median | worst | worst/best | over 1.5x best | the copy's worst/best |")
    print("|---|---|---|---|---|---|---|---|")
    for size in sizes:
        for reference, copy_times in (("memcpy", copies[size]), ("peer read", peer_reads[size])):
            ratios = [t / c for t, c in zip(times[size], copy_times, strict=True)]
            best, median = min(ratios), statistics.median(ratios)
            slow = sum(1 for x in ratios if x > 1.5 * best)
            print(
                f"| {human(size)} | {reference} | {best:.2f} | {median:.2f} | {max(ratios):.2f} "
                f"| {max(ratios) / best:.2f}x | {slow} | {max(copy_times) / min(copy_times):.2f}x |"
            )
    print("\nThe first call of each launch, on a buffer just allocated:\n")
    print("| size | best | median | worst |")
    print("|---|---|---|---|")
    for size in sizes:
        cells = [f"{1e3 * x:.2f} ms" for x in (min(firsts[size]), statistics.median(firsts[size]), max(firsts[size]))]
        print(f"| {human(size)} | {' | '.join(cells)} |")
    print("\nPer launch, in launch order (ms): allreduce median / memcpy / peer read")
    for size in sizes:
        cells = zip(times[size], copies[size], peer_reads[size], strict=True)
        print(f"{human(size)}: " + " ".join(f"{1e3 * t:.1f}/{1e3 * c:.1f}/{1e3 * r:.1f}" for t, c, r in cells))


if __name__ == "__main__":
    main()
