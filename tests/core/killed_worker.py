"""Worker script: allreduce in a loop until a peer dies; report how the failure surfaced.

The rank given in argv[1] SIGKILLs itself in the middle of the loop; the
others must raise HoraInternalError, which they report with the seconds
between their last successful collective and the error.
"""

import os
import signal
import sys
import time

import hora
import numpy as np

hora.init()
print(f"rank {hora.rank()} links: {','.join(hora.basics.current_job().transport_links())}", flush=True)
victim = int(sys.argv[1])
buffer = np.ones(2_000_000, dtype=np.float32)
last_ok = time.monotonic()
try:
    for step in range(10_000):
        if hora.rank() == victim and step == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        hora.allreduce_(buffer, op=hora.Average)
        last_ok = time.monotonic()
except hora.HoraInternalError as exc:
    print(f"rank {hora.rank()}: HoraInternalError after {time.monotonic() - last_ok:.2f} s: {exc}", flush=True)
    sys.exit(0)
print(f"rank {hora.rank()}: no error", flush=True)
sys.exit(1)
