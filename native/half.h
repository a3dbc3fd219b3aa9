// Portable conversions between float and the two 16-bit float formats.
// The core compiles against nothing but the standard library, so these are
// written out rather than taken from F16C intrinsics; both round to nearest
// even, as IEEE 754 and the frameworks do.
#pragma once

#include <cstdint>
#include <cstring>

namespace hora {

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline float bfloat16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bfloat16(float f) {
  uint32_t bits = float_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a quiet NaN.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

inline float float16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {  // Inf or NaN.
    return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return bits_to_float(sign);
    // Subnormal half: value is mantissa * 2^-24.
    float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
    return sign ? -magnitude : magnitude;
  }
  return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline uint16_t float_to_float16(float f) {
  uint32_t bits = float_to_bits(f);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> Inf
  if (magnitude < 0x38800000u) {
    // Result is subnormal (or zero): round magnitude * 2^24 to an integer.
    float scaled = bits_to_float(magnitude) * 16777216.0f;
    // Adding 2^23 forces rounding to nearest even at integer precision.
    uint32_t rounded = float_to_bits(scaled + 8388608.0f) - 0x4b000000u;
    return static_cast<uint16_t>(sign | rounded);
  }
  uint32_t rounding_bias = 0xfffu + ((magnitude >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((magnitude - 0x38000000u + rounding_bias) >> 13));
}

}  // namespace hora
