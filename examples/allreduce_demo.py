"""Demo job: each rank contributes known values; every rank prints and checks the results.

Run with ``horarun -np 4 python examples/allreduce_demo.py`` (``make demo``).
"""

import hora
import numpy as np

hora.init()
rank, size = hora.rank(), hora.size()

values = np.arange(4, dtype=np.float32) + 10 * rank  # rank r holds [10r, 10r+1, 10r+2, 10r+3]
total = hora.allreduce(values, op=hora.Sum)
expected = np.arange(4, dtype=np.float32) * size + 10 * size * (size - 1) / 2
gathered = hora.allgather(np.array([rank], dtype=np.int64))
root_value = hora.broadcast(np.array([rank * 100.0]), root_rank=size - 1)

print(f"rank {rank} of {size}: allreduce sum = {total.tolist()} (expected {expected.tolist()})")
print(f"rank {rank} of {size}: allgather = {gathered.tolist()}, broadcast from rank {size - 1} = {root_value[0]}")
assert np.array_equal(total, expected), (total, expected)
assert gathered.tolist() == list(range(size))
assert root_value[0] == (size - 1) * 100.0
hora.barrier()
if rank == 0:
    print(f"OK: all {size} ranks agree.")
