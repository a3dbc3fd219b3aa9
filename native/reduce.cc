#include "reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "half.h"

namespace hora {
namespace {

// What reduce_typed does to each result: nothing, or multiply it by a
// factor in the same loop, one rounding after the reduction's (as a pass of
// scale() afterwards would).
struct Unscaled {
  template <typename T>
  T operator()(T value) const { return value; }
};

template <typename T>
struct Scaled {
  T factor;
  T operator()(T value) const { return value * factor; }
};

// Every kernel reduces `own` (this rank's operand) with `src` into `dst`.
// In place (InPlace), `own` is `dst` itself and the kernel reads dst[i]
// instead, so that no two pointers it reads and writes alias (__restrict).
template <bool InPlace, typename T, typename Finish = Unscaled>
void reduce_typed(T* __restrict dst, const T* __restrict own, const T* __restrict src, std::size_t count,
                  ReduceOp op, Finish finish = {}) {
  const auto a = [&](std::size_t i) { return InPlace ? dst[i] : own[i]; };
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      for (std::size_t i = 0; i < count; ++i) dst[i] = finish(static_cast<T>(a(i) + src[i]));
      break;
    case ReduceOp::kMin:
      for (std::size_t i = 0; i < count; ++i) dst[i] = finish(std::min(a(i), src[i]));
      break;
    case ReduceOp::kMax:
      for (std::size_t i = 0; i < count; ++i) dst[i] = finish(std::max(a(i), src[i]));
      break;
    case ReduceOp::kProduct:
      for (std::size_t i = 0; i < count; ++i) dst[i] = finish(static_cast<T>(a(i) * src[i]));
      break;
  }
}

// Bool follows numpy's logical semantics: sum and max are "or", product and
// min are "and". Bytes other than 0 and 1 are normalised to 1.
template <bool InPlace>
void reduce_bool(uint8_t* __restrict dst, const uint8_t* __restrict own, const uint8_t* __restrict src,
                 std::size_t count, ReduceOp op) {
  const bool is_or = op == ReduceOp::kSum || op == ReduceOp::kMax;
  for (std::size_t i = 0; i < count; ++i) {
    const bool a = (InPlace ? dst[i] : own[i]) != 0;
    const bool b = src[i] != 0;
    dst[i] = static_cast<uint8_t>(is_or ? (a || b) : (a && b));
  }
}

template <bool InPlace, float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduce_half(uint16_t* __restrict dst, const uint16_t* __restrict own, const uint16_t* __restrict src,
                 std::size_t count, ReduceOp op) {
  for (std::size_t i = 0; i < count; ++i) {
    const float a = ToFloat(InPlace ? dst[i] : own[i]);
    const float b = ToFloat(src[i]);
    float r = a;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: r = a + b; break;
      case ReduceOp::kMin: r = std::min(a, b); break;
      case ReduceOp::kMax: r = std::max(a, b); break;
      case ReduceOp::kProduct: r = a * b; break;
    }
    dst[i] = FromFloat(r);
  }
}

template <typename T>
void scale_typed(T* buf, std::size_t count, double factor) {
  for (std::size_t i = 0; i < count; ++i) buf[i] = static_cast<T>(static_cast<double>(buf[i]) * factor);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void scale_half(uint16_t* buf, std::size_t count, double factor) {
  const float f = static_cast<float>(factor);
  for (std::size_t i = 0; i < count; ++i) buf[i] = FromFloat(ToFloat(buf[i]) * f);
}

template <typename T>
void divide_typed(T* buf, std::size_t count, long long divisor) {
  for (std::size_t i = 0; i < count; ++i) buf[i] = static_cast<T>(static_cast<long long>(buf[i]) / divisor);
}

template <typename T>
void fill_typed(T* buf, std::size_t count, ReduceOp op) {
  T value = 0;
  if (op == ReduceOp::kProduct) value = 1;
  if (op == ReduceOp::kMin) value = std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::max();
  if (op == ReduceOp::kMax) value = std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::lowest();
  std::fill(buf, buf + count, value);
}

template <uint16_t (*FromFloat)(float)>
void fill_half(uint16_t* buf, std::size_t count, ReduceOp op) {
  float value = 0.0f;
  if (op == ReduceOp::kProduct) value = 1.0f;
  if (op == ReduceOp::kMin) value = std::numeric_limits<float>::infinity();
  if (op == ReduceOp::kMax) value = -std::numeric_limits<float>::infinity();
  std::fill(buf, buf + count, FromFloat(value));
}

template <typename From, typename To>
void convert_typed(const void* src, void* dst, std::size_t count) {
  const From* in = static_cast<const From*>(src);
  To* out = static_cast<To*>(dst);
  for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<To>(in[i]);
}

template <typename Wide, float (*ToFloat)(uint16_t)>
void widen_half(const void* src, void* dst, std::size_t count) {
  const uint16_t* in = static_cast<const uint16_t*>(src);
  Wide* out = static_cast<Wide*>(dst);
  for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<Wide>(ToFloat(in[i]));
}

template <typename Wide, uint16_t (*FromFloat)(float)>
void narrow_half(const void* src, void* dst, std::size_t count) {
  const Wide* in = static_cast<const Wide*>(src);
  uint16_t* out = static_cast<uint16_t*>(dst);
  for (std::size_t i = 0; i < count; ++i) out[i] = FromFloat(static_cast<float>(in[i]));
}

}  // namespace

DataType accumulation_type(DataType dtype, ReduceOp op) {
  if (op != ReduceOp::kAverage) return dtype;
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kInt16: return DataType::kInt32;
    case DataType::kFloat16: return DataType::kFloat32;
    case DataType::kBFloat16: return DataType::kFloat64;  // it has float32's range: its sums overflow float32 too
    default: return dtype;
  }
}

void convert(const void* src, DataType from, void* dst, DataType to, std::size_t count) {
  using D = DataType;
  if (from == D::kUInt8 && to == D::kInt32) return convert_typed<uint8_t, int32_t>(src, dst, count);
  if (from == D::kInt8 && to == D::kInt32) return convert_typed<int8_t, int32_t>(src, dst, count);
  if (from == D::kInt16 && to == D::kInt32) return convert_typed<int16_t, int32_t>(src, dst, count);
  if (from == D::kInt32 && to == D::kUInt8) return convert_typed<int32_t, uint8_t>(src, dst, count);
  if (from == D::kInt32 && to == D::kInt8) return convert_typed<int32_t, int8_t>(src, dst, count);
  if (from == D::kInt32 && to == D::kInt16) return convert_typed<int32_t, int16_t>(src, dst, count);
  if (from == D::kFloat16 && to == D::kFloat32) return widen_half<float, float16_to_float>(src, dst, count);
  if (from == D::kBFloat16 && to == D::kFloat64) return widen_half<double, bfloat16_to_float>(src, dst, count);
  if (from == D::kFloat32 && to == D::kFloat16) return narrow_half<float, float_to_float16>(src, dst, count);
  if (from == D::kFloat64 && to == D::kBFloat16) return narrow_half<double, float_to_bfloat16>(src, dst, count);
  throw std::invalid_argument("No conversion from " + to_string(from) + " to " + to_string(to) + ".");
}

void fill_identity(void* buf, std::size_t count, DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kUInt8: fill_typed(static_cast<uint8_t*>(buf), count, op); break;
    case DataType::kInt8: fill_typed(static_cast<int8_t*>(buf), count, op); break;
    case DataType::kInt16: fill_typed(static_cast<int16_t*>(buf), count, op); break;
    case DataType::kInt32: fill_typed(static_cast<int32_t*>(buf), count, op); break;
    case DataType::kInt64: fill_typed(static_cast<int64_t*>(buf), count, op); break;
    case DataType::kFloat32: fill_typed(static_cast<float*>(buf), count, op); break;
    case DataType::kFloat64: fill_typed(static_cast<double*>(buf), count, op); break;
    case DataType::kFloat16: fill_half<float_to_float16>(static_cast<uint16_t*>(buf), count, op); break;
    case DataType::kBFloat16: fill_half<float_to_bfloat16>(static_cast<uint16_t*>(buf), count, op); break;
    case DataType::kBool: {
      const bool is_or = op == ReduceOp::kSum || op == ReduceOp::kMax;
      std::memset(buf, is_or ? 0 : 1, count);
      break;
    }
  }
}

void check_reduction(DataType dtype, ReduceOp op) {
  if (dtype == DataType::kBool && op == ReduceOp::kAverage) {
    throw std::invalid_argument(
        "Average is not defined for bool tensors; use Sum or Max (logical or) or Min or "
        "Product (logical and), or cast to a numeric dtype first.");
  }
}

namespace {

// reduce_into for one choice of InPlace (see reduce_typed).
template <bool InPlace>
void reduce_with(void* dst, const void* own, const void* src, std::size_t count, DataType dtype, ReduceOp op,
                 double factor) {
  const auto typed = [&](auto* out, auto finish) {
    using T = std::remove_pointer_t<decltype(out)>;
    reduce_typed<InPlace>(out, static_cast<const T*>(own), static_cast<const T*>(src), count, op, finish);
  };
  if (factor != 1.0) {
    if (dtype == DataType::kFloat32) {
      // scale() multiplies float32 by the factor rounded to float32 too.
      typed(static_cast<float*>(dst), Scaled<float>{static_cast<float>(factor)});
      return;
    }
    if (dtype == DataType::kFloat64) {
      typed(static_cast<double*>(dst), Scaled<double>{factor});
      return;
    }
    reduce_with<InPlace>(dst, own, src, count, dtype, op, 1.0);
    scale(dst, count, dtype, factor);  // the elements just reduced, still in the cache
    return;
  }
  const auto* own16 = static_cast<const uint16_t*>(own);
  const auto* src16 = static_cast<const uint16_t*>(src);
  switch (dtype) {
    case DataType::kUInt8: typed(static_cast<uint8_t*>(dst), Unscaled{}); break;
    case DataType::kInt8: typed(static_cast<int8_t*>(dst), Unscaled{}); break;
    case DataType::kInt16: typed(static_cast<int16_t*>(dst), Unscaled{}); break;
    case DataType::kInt32: typed(static_cast<int32_t*>(dst), Unscaled{}); break;
    case DataType::kInt64: typed(static_cast<int64_t*>(dst), Unscaled{}); break;
    case DataType::kFloat32: typed(static_cast<float*>(dst), Unscaled{}); break;
    case DataType::kFloat64: typed(static_cast<double*>(dst), Unscaled{}); break;
    case DataType::kFloat16:
      reduce_half<InPlace, float16_to_float, float_to_float16>(static_cast<uint16_t*>(dst), own16, src16, count, op);
      break;
    case DataType::kBFloat16:
      reduce_half<InPlace, bfloat16_to_float, float_to_bfloat16>(static_cast<uint16_t*>(dst), own16, src16, count,
                                                                 op);
      break;
    case DataType::kBool:
      reduce_bool<InPlace>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(own),
                           static_cast<const uint8_t*>(src), count, op);
      break;
  }
}

}  // namespace

void reduce_into(void* dst, const void* src, std::size_t count, DataType dtype, ReduceOp op, double factor,
                 const void* own) {
  if (own == nullptr || own == dst) {
    reduce_with<true>(dst, nullptr, src, count, dtype, op, factor);
  } else {
    reduce_with<false>(dst, own, src, count, dtype, op, factor);
  }
}

void scale(void* buf, std::size_t count, DataType dtype, double factor) {
  if (factor == 1.0) return;
  switch (dtype) {
    case DataType::kUInt8: scale_typed(static_cast<uint8_t*>(buf), count, factor); break;
    case DataType::kInt8: scale_typed(static_cast<int8_t*>(buf), count, factor); break;
    case DataType::kInt16: scale_typed(static_cast<int16_t*>(buf), count, factor); break;
    case DataType::kInt32: scale_typed(static_cast<int32_t*>(buf), count, factor); break;
    case DataType::kInt64: scale_typed(static_cast<int64_t*>(buf), count, factor); break;
    case DataType::kFloat32: {
      float* p = static_cast<float*>(buf);
      const float f = static_cast<float>(factor);
      for (std::size_t i = 0; i < count; ++i) p[i] *= f;
      break;
    }
    case DataType::kFloat64: {
      double* p = static_cast<double*>(buf);
      for (std::size_t i = 0; i < count; ++i) p[i] *= factor;
      break;
    }
    case DataType::kFloat16: scale_half<float16_to_float, float_to_float16>(static_cast<uint16_t*>(buf), count, factor); break;
    case DataType::kBFloat16: scale_half<bfloat16_to_float, float_to_bfloat16>(static_cast<uint16_t*>(buf), count, factor); break;
    case DataType::kBool:
      throw std::invalid_argument("Scale factors are not defined for bool tensors; got factor " + std::to_string(factor) + ".");
  }
}

void divide_integers(void* buf, std::size_t count, DataType dtype, long long divisor) {
  switch (dtype) {
    case DataType::kUInt8: divide_typed(static_cast<uint8_t*>(buf), count, divisor); break;
    case DataType::kInt8: divide_typed(static_cast<int8_t*>(buf), count, divisor); break;
    case DataType::kInt16: divide_typed(static_cast<int16_t*>(buf), count, divisor); break;
    case DataType::kInt32: divide_typed(static_cast<int32_t*>(buf), count, divisor); break;
    case DataType::kInt64: divide_typed(static_cast<int64_t*>(buf), count, divisor); break;
    default:
      throw std::invalid_argument("divide_integers called with non-integer dtype " + to_string(dtype) + ".");
  }
}

}  // namespace hora
