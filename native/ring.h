// The two phases of the ring algorithm, shared by allreduce, reducescatter
// and allgather. See ring.cc for the algorithm.
#pragma once

#include <cstddef>
#include <vector>

#include "dtypes.h"
#include "transport.h"

namespace hora {

// Afterwards block r (counts[r] elements) of `data` holds the reduction of
// block r over all ranks, times `factor` (applied by the last reduction of
// each element: transport.h's recv_reduce). A factor other than 1 is for
// floating-point types: integers would be truncated piece by piece.
// This rank's contribution is `data`, or `source` when given (a buffer of
// the same layout, read but not written): then the blocks of `data` other
// than block r are left holding partial results or nothing at all.
void ring_reduce_scatter(Transport& transport, char* data, const std::vector<std::size_t>& counts, DataType dtype,
                         ReduceOp op, double factor = 1.0, const char* source = nullptr);

// Given that block r (byte_counts[r] bytes) of `data` is final on rank r,
// afterwards every block is final on every rank.
void ring_allgather(Transport& transport, char* data, const std::vector<std::size_t>& byte_counts);

}  // namespace hora
