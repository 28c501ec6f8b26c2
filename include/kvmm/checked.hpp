// Overflow-checked integer arithmetic on sizes, token counts and page counts: the one place
// kvmm does it. Every helper takes the name of the quantity being computed, so a result
// that does not fit raises kvmm::Error naming it ("large_page_bytes = 4096 * 2^62 overflows
// 64 bits"). Each is one add/mul with its overflow flag (a few cycles), so callers use them
// on configuration and per-request paths; per-page hot loops check their bounds once.
#pragma once

#include "kvmm/error.hpp"

#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>

namespace kvmm {

// a * b, or std::nullopt when it does not fit in T.
template <std::unsigned_integral T>
constexpr std::optional<T> try_mul(T a, T b) {
  T r{};
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a + b, or std::nullopt when it does not fit in T.
template <std::unsigned_integral T>
constexpr std::optional<T> try_add(T a, T b) {
  T r{};
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a * b; kvmm::Error naming `what` when it overflows 64 bits.
inline std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, std::string_view what) {
  if (const auto r = try_mul(a, b)) return *r;
  fail("{} = {} * {} overflows 64 bits", what, a, b);
}

// a + b; kvmm::Error naming `what` when it overflows 64 bits.
inline std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, std::string_view what) {
  if (const auto r = try_add(a, b)) return *r;
  fail("{} = {} + {} overflows 64 bits", what, a, b);
}

// ceil(a / b) without the a + b - 1 overflow; kvmm::Error naming `what` when b = 0.
inline std::uint64_t checked_ceil_div(std::uint64_t a, std::uint64_t b, std::string_view what) {
  if (b == 0) fail("{}: division by zero ({} / 0)", what, a);
  return a / b + (a % b != 0);
}

// a rounded up to a multiple of m (m > 0); kvmm::Error naming `what` when that
// overflows 64 bits (a = 2^64-1 rounds to 0 with the a + m - 1 idiom).
inline std::uint64_t checked_round_up(std::uint64_t a, std::uint64_t m, std::string_view what) {
  if (m == 0) fail("{}: rounding {} up to a multiple of 0", what, a);
  const std::uint64_t q = a / m + (a % m != 0);
  if (const auto r = try_mul(q, m)) return *r;
  fail("{} = {}: rounded up to a multiple of {} overflows 64 bits", what, a, m);
}

// ceil(a / b) for b > 0 (the caller knows it): no overflow for any a.
constexpr std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return a / b + (a % b != 0); }

// v as To; kvmm::Error naming `what` and the limit when it does not fit.
template <std::integral To, std::integral From>
To checked_cast(From v, std::string_view what) {
  if (!std::in_range<To>(v))
    fail("{} = {}: out of range, must be in [{}, {}]", what, v, std::numeric_limits<To>::min(),
         std::numeric_limits<To>::max());
  return static_cast<To>(v);
}

}  // namespace kvmm
