// Element-wise kernels used by the reducing collectives.
#pragma once

#include <cstddef>

#include "dtypes.h"

namespace hora {

// dst[i] = dst[i] (op) src[i] for i < count. Average accumulates as Sum; the
// division by the world size is a scale applied once, after the reduction.
void reduce_into(void* dst, const void* src, std::size_t count, DataType dtype, ReduceOp op);

// buf[i] *= factor. Integers are scaled in double precision and truncated.
void scale(void* buf, std::size_t count, DataType dtype, double factor);

// buf[i] /= divisor with integer division (truncating toward zero); used for
// Average over integer types so that the result is exact.
void divide_integers(void* buf, std::size_t count, DataType dtype, long long divisor);

// Fills `count` elements with the identity of `op` (0 for Sum and Average,
// 1 for Product, the largest value for Min, the lowest for Max): what a rank
// that has joined contributes.
void fill_identity(void* buf, std::size_t count, DataType dtype, ReduceOp op);

// Throws std::invalid_argument when `op` is not defined for `dtype`
// (Average over bool).
void check_reduction(DataType dtype, ReduceOp op);

}  // namespace hora
