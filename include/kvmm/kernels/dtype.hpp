// KV storage element types of the kernels (fp16, bf16) and their host-side conversion
// to and from float: round-to-nearest-even, inf/NaN and subnormals kept. Each
// conversion is a few integer operations; nothing here needs CUDA headers.
#pragma once

#include <cstdint>
#include <cstring>

namespace kvmm::kernels {

namespace detail {
// std::bit_cast without <bit>: this header is also compiled by nvcc in C++17 mode.
inline float as_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline std::uint32_t as_u32(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
}  // namespace detail

enum class DType : std::uint8_t { kF16, kBF16 };

inline constexpr std::uint32_t dtype_bytes(DType) { return 2; }

inline float bf16_to_float(std::uint16_t h) { return detail::as_float(std::uint32_t{h} << 16); }

inline std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = detail::as_u32(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

inline float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return detail::as_float(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return detail::as_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return detail::as_float(sign);
  // Subnormal: normalise the mantissa.
  std::uint32_t e = 113;
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return detail::as_float(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

inline std::uint16_t float_to_f16(float f) {
  const std::uint32_t u = detail::as_u32(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  const std::uint32_t exp = abs >> 23;
  if (exp < 113) {                                           // subnormal half (or zero): value = mant * 2^-24
    if (exp < 102) return static_cast<std::uint16_t>(sign);  // below half the smallest subnormal
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exp;  // 14..24
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = ((exp - 112) << 10) | ((abs >> 13) & 0x3ffu);
  const std::uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: correct
  return static_cast<std::uint16_t>(sign | h);
}

inline float to_float(DType t, std::uint16_t v) { return t == DType::kF16 ? f16_to_float(v) : bf16_to_float(v); }
inline std::uint16_t from_float(DType t, float f) { return t == DType::kF16 ? float_to_f16(f) : float_to_bf16(f); }

}  // namespace kvmm::kernels
