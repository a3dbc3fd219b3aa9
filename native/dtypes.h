// Element types and reduction operations understood by the collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hora {

enum class DataType : int {
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kBool,
};

enum class ReduceOp : int {
  kSum,
  kAverage,
  kMin,
  kMax,
  kProduct,
};

std::size_t element_size(DataType dtype);
std::string to_string(DataType dtype);
std::string to_string(ReduceOp op);
bool is_floating(DataType dtype);

}  // namespace hora
