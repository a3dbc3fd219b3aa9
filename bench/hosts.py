"""Allreduce across simulated hosts joined by rate-limited links, as a fraction of what the links allow.

Builds 2-4 hosts as network namespaces behind a bridge (tests/netns.py), limits
every link to --rate-mbit each way, and runs Hora across them (float32 sum).
Over H hosts no allreduce can beat the link bound: each host must send
2(H-1)/H of the buffer over its link, so the ideal time is
2(H-1)/H * bytes / rate. The table gives the median time and that ideal as
a fraction of it: 100% means the link never idles.

Rows: one rank per host (one ring across the hosts), and 2 hosts x 2 ranks,
hierarchical (within each host over shared memory, then across) and flat
(one ring over all four ranks). Needs root; says so and exits otherwise.

    python bench/hosts.py [--quick] [--rate-mbit 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _peers import human

from tests.netns import SimulatedHosts, unavailable

# (label, placement: the host of each rank, extra worker environment)
JOBS = [
    ("2 hosts x 1", [0, 1], {}),
    ("3 hosts x 1", [0, 1, 2], {}),
    ("4 hosts x 1", [0, 1, 2, 3], {}),
    ("2 hosts x 2, hierarchical", [0, 0, 1, 1], {"HORA_HIERARCHICAL_ALLREDUCE": "1"}),
    ("2 hosts x 2, flat ring", [0, 0, 1, 1], {"HORA_HIERARCHICAL_ALLREDUCE": "0"}),
]


def _worker(sizes: list[int], iterations: int) -> None:
    import hora
    import numpy as np

    hora.init()
    results = {}
    for nbytes in sizes:
        buffer = np.ones(nbytes // 4, dtype=np.float32)
        hora.allreduce_(buffer, op=hora.Sum)  # warm-up: connections, caches, pages
        times = []
        for _ in range(iterations):
            hora.barrier()
            start = time.perf_counter()
            hora.allreduce_(buffer, op=hora.Sum)
            times.append(time.perf_counter() - start)
        results[nbytes] = statistics.median(times)
    if hora.rank() == 0:
        print("RESULT " + json.dumps(results), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one size, three iterations")
    parser.add_argument("--rate-mbit", type=float, default=1000.0, help="link speed each way (default 1000)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    parser.add_argument("--iterations", type=int, default=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker([int(s) for s in args.sizes.split(",")], args.iterations)
        return
    reason = unavailable()
    if reason is not None:
        print(f"bench/hosts.py: skipped: {reason}")
        return
    if args.rate_mbit <= 0:
        parser.error(f"--rate-mbit must be positive, got {args.rate_mbit}")
    sizes = [16 << 20] if args.quick else [4 << 20, 16 << 20, 64 << 20]
    iterations = 3 if args.quick else args.iterations
    rate = args.rate_mbit * 1e6 / 8  # bytes per second
    print(
        f"allreduce float32 sum across simulated hosts; links {args.rate_mbit:g} Mbit/s each way (tc tbf), "
        f"MTU 9000; load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print("ideal = 2(H-1)/H * bytes / link rate (H hosts); 'of ideal' = ideal / median time")
    print()
    print(f"| {'job':<26} | {'size':>7} | {'median':>9} | {'ideal':>9} | {'of ideal':>8} |")
    print(f"|{'-' * 28}|{'-' * 9}|{'-' * 11}|{'-' * 11}|{'-' * 10}|")
    argv = [sys.executable, os.path.abspath(__file__), "--worker", "--sizes", ",".join(map(str, sizes)),
            "--iterations", str(iterations)]  # fmt: skip
    for label, placement, env in JOBS:
        hosts_count = max(placement) + 1
        with SimulatedHosts(hosts_count, rate_mbit=args.rate_mbit) as hosts:
            outputs = hosts.run_job(placement, argv, env=env, timeout=900)
        found = [line for line in outputs[0].output.splitlines() if line.startswith("RESULT ")]
        if not found or any(o.returncode for o in outputs):
            print(f"| {label:<26} | failed: {outputs[0].output.strip().splitlines()[-1:]} |")
            continue
        times = {int(k): v for k, v in json.loads(found[0][len("RESULT ") :]).items()}
        for nbytes in sizes:
            ideal = 2 * (hosts_count - 1) / hosts_count * nbytes / rate
            median = times[nbytes]
            print(f"| {label:<26} | {human(nbytes):>7} | {median * 1e3:7.1f}ms | {ideal * 1e3:7.1f}ms | "
                  f"{ideal / median:8.1%} |")  # fmt: skip
    print()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
