// Collective operations over any Transport. All of them are blocking, work
// in place on caller-owned buffers, and must be called by every rank of the
// transport in the same order with matching arguments.
#pragma once

#include <cstddef>
#include <vector>

#include "dtypes.h"
#include "transport.h"

namespace hora {

// Reduces `count` elements of `buffer` across all ranks, in place, by
// recursive doubling up to kRecursiveDoublingBytes (recursive_doubling.h)
// and by the ring beyond. The result is postscale * reduce_r(prescale * x_r);
// Average divides by the world size after the reduction.
void allreduce(Transport& transport, void* buffer, std::size_t count, DataType dtype, ReduceOp op,
               double prescale = 1.0, double postscale = 1.0);

// The same result in `output`, leaving `input` unchanged (they may also be
// the same buffer, but must not otherwise overlap). The ring reads this
// rank's contribution straight from `input` rather than from a copy of it,
// which saves a pass over memory.
void allreduce(Transport& transport, const void* input, void* output, std::size_t count, DataType dtype, ReduceOp op,
               double prescale = 1.0, double postscale = 1.0);

// The same result as allreduce() over the whole job, for a job of several
// hosts with the same number of ranks on each: `local` holds this host's
// ranks, `cross` the ranks with this rank's local rank on every host. The
// buffer is reduce-scattered within the host, each local rank's share is
// allreduced across hosts among its cross ranks, and the host allgathers
// the shares. Each host's link carries 2(H-1)/H of the buffer, as in a
// ring among one rank per host, but every local rank moves and reduces its
// share in parallel, and the flat ring's 2(n-1) steps become 2(L-1) + 2(H-1).
void hierarchical_allreduce(Transport& local, Transport& cross, void* buffer, std::size_t count, DataType dtype,
                            ReduceOp op, double prescale = 1.0, double postscale = 1.0);

// Reduces across ranks and leaves rank r's block (of counts[r] elements,
// blocks laid out back to back in `buffer`) reduced in place; the other
// blocks of `buffer` hold partial results afterwards.
void reducescatter(Transport& transport, void* buffer, const std::vector<std::size_t>& counts, DataType dtype,
                   ReduceOp op, double prescale = 1.0, double postscale = 1.0);

// Gathers every rank's block into `output`, rank order, back to back;
// block r has byte_counts[r] bytes and `input` holds this rank's block.
void allgather(Transport& transport, const void* input, void* output, const std::vector<std::size_t>& byte_counts);

// Copies `bytes` bytes of `buffer` from `root` to every rank.
void broadcast(Transport& transport, void* buffer, std::size_t bytes, int root);

// Sends send_bytes[p] bytes (blocks back to back in `input`) to each rank p
// and receives recv_bytes[p] bytes from each rank p into `output`.
void alltoall(Transport& transport, const void* input, const std::vector<std::size_t>& send_bytes, void* output,
              const std::vector<std::size_t>& recv_bytes);

// Returns once every rank has entered the barrier.
void barrier(Transport& transport);

}  // namespace hora
