"""Demo job: each rank contributes known values; every rank prints and checks the results.

Synchronous collectives, then async gradients in shuffled orders (fused by the
engine), then join() with an uneven number of batches per rank.

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

# Gradients as a framework produces them: 50 named tensors, each rank in its own order,
# submitted without waiting; the engine matches them by name and fuses them.
grads = {f"layer{i}.grad": np.full(100, rank + i, dtype=np.float32) for i in range(50)}
order = np.random.default_rng(rank).permutation(list(grads))
handles = {name: hora.allreduce_async_(grads[name], name=name, op=hora.Average) for name in order}
for i, name in enumerate(grads):
    hora.synchronize(handles[name])
    assert np.allclose(grads[name], i + (size - 1) / 2), (name, grads[name][:3])
print(f"rank {rank} of {size}: 50 gradients submitted in a shuffled order were averaged correctly")

# Uneven data: rank r has r + 1 batches; join() lets the ranks that finish early serve the others.
for batch in range(rank + 1):
    hora.allreduce(np.ones(3), name=f"batch{batch}", op=hora.Sum)
last = hora.join()
assert last == size - 1, last
hora.barrier()
if rank == 0:
    print(f"OK: all {size} ranks agree.")
