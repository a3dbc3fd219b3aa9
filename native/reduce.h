// Element-wise kernels used by the reducing collectives.
#pragma once

#include <cstddef>

#include "dtypes.h"

namespace hora {

// dst[i] = (dst[i] (op) src[i]) * factor for i < count. Average accumulates
// as Sum; over floating-point types its division by the world size is a
// factor the last reduction of each element applies (integers divide after,
// with divide_integers). The result is the same, bit for bit, as reducing
// and then scale(), in one pass over memory instead of two for float32 and
// float64.
//
// With `own`, dst[i] = (own[i] (op) src[i]) * factor instead: an out-of-place
// reduction, the same bits as copying `own` into `dst` first (own must not
// overlap dst unless it is dst). `own` is always the left operand, as dst is.
void reduce_into(void* dst, const void* src, std::size_t count, DataType dtype, ReduceOp op, double factor = 1.0,
                 const void* own = nullptr);

// buf[i] *= factor. Integers are scaled in double precision and truncated.
void scale(void* buf, std::size_t count, DataType dtype, double factor);

// buf[i] /= divisor with integer division (truncating toward zero); used for
// Average over integer types so that the result is exact.
void divide_integers(void* buf, std::size_t count, DataType dtype, long long divisor);

// The type a reduction over `dtype` accumulates in. An Average over a narrow
// type overflows long before the average itself does (int8 100 + 100 wraps
// to -56; float16 65504 + 65504 is inf), so it runs in int32 (uint8, int8,
// int16), float32 (float16) or float64 (bfloat16, whose range is float32's)
// and is narrowed at the end. Every
// other reduction keeps the tensor's type: Sum wraps around in integer types
// and saturates to inf in float16, as numpy's and Horovod's do.
DataType accumulation_type(DataType dtype, ReduceOp op);

// dst[i] = src[i] converted between a narrow type and its accumulation type
// (integers narrowed by truncation, floats rounded to nearest).
void convert(const void* src, DataType from, void* dst, DataType to, std::size_t count);

// Fills `count` elements with the identity of `op` (0 for Sum and Average,
// 1 for Product, the largest value for Min, the lowest for Max): what a rank
// that has joined contributes.
void fill_identity(void* buf, std::size_t count, DataType dtype, ReduceOp op);

// Throws std::invalid_argument when `op` is not defined for `dtype`
// (Average over bool).
void check_reduction(DataType dtype, ReduceOp op);

}  // namespace hora
