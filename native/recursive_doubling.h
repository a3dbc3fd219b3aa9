// Recursive-doubling allreduce, for buffers small enough that the number of
// steps, not the bytes moved, sets the time. See recursive_doubling.cc.
#pragma once

#include <cstddef>

#include "dtypes.h"
#include "transport.h"

namespace hora {

// Buffers up to this size are allreduced by recursive doubling, larger ones
// by the ring. A ring takes 2(n-1) steps and moves 2(n-1)/n of the buffer per
// rank; recursive doubling takes log2(n) steps (two more when n is not a
// power of two) and moves the whole buffer in each, and it reduces the whole
// buffer on every rank instead of 1/n of it.
constexpr std::size_t kRecursiveDoublingBytes = 64 * 1024;

// Afterwards every rank holds the reduction of `count` elements of `data`
// over all ranks (no scaling), bit for bit the same on every rank.
void recursive_doubling_allreduce(Transport& transport, char* data, std::size_t count, DataType dtype, ReduceOp op);

}  // namespace hora
