// Internal to the KV event encoder (distributed/detail/: not public API).
// MsgpackWriter: the small msgpack encoder the KV event stream needs (nil, bool, ints,
// float64, str, bin, arrays, maps), appending to a caller-owned byte vector. Every value
// is written in its shortest form, as msgpack-python and msgspec do. A reused vector makes
// no heap allocation once it has grown; each value costs a few byte stores (O(length) for
// str, bin and the bulk uint array).
#pragma once

#include "kvmm/error.hpp"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

namespace kvmm {

class MsgpackWriter {
 public:
  explicit MsgpackWriter(std::vector<std::uint8_t>& out) : out_(out) {}

  void nil() { out_.push_back(0xc0); }
  void boolean(bool v) { out_.push_back(v ? 0xc3 : 0xc2); }

  void uint(std::uint64_t v) {
    std::uint8_t* p = grow(9);
    out_.resize(static_cast<std::size_t>(p - out_.data()) + put_uint(p, v));
  }

  void integer(std::int64_t v) {
    if (v >= 0) return uint(static_cast<std::uint64_t>(v));
    if (v >= -32) return out_.push_back(static_cast<std::uint8_t>(v));  // negative fixint
    if (v >= INT8_MIN) return head(0xd0, static_cast<std::uint8_t>(v), 1);
    if (v >= INT16_MIN) return head(0xd1, static_cast<std::uint16_t>(v), 2);
    if (v >= INT32_MIN) return head(0xd2, static_cast<std::uint32_t>(v), 4);
    head(0xd3, static_cast<std::uint64_t>(v), 8);
  }

  void float64(double v) { head(0xcb, std::bit_cast<std::uint64_t>(v), 8); }

  void str(std::string_view s) {
    const std::uint64_t n = s.size();
    if (n < 32)
      out_.push_back(static_cast<std::uint8_t>(0xa0 | n));
    else if (n <= 0xff)
      head(0xd9, n, 1);
    else if (n <= 0xffff)
      head(0xda, n, 2);
    else
      head(0xdb, check32(n, "str"), 4);
    raw(s.data(), s.size());
  }

  void bin(std::span<const std::byte> b) {
    const std::uint64_t n = b.size();
    if (n <= 0xff)
      head(0xc4, n, 1);
    else if (n <= 0xffff)
      head(0xc5, n, 2);
    else
      head(0xc6, check32(n, "bin"), 4);
    raw(b.data(), b.size());
  }

  void array_header(std::uint64_t n) { container(n, 0x90, 0xdc, "array"); }
  void map_header(std::uint64_t n) { container(n, 0x80, 0xde, "map"); }

  // An array of unsigned ints (token ids): one reservation, then each in its shortest form.
  void uint_array(std::span<const std::uint32_t> v) {
    array_header(v.size());
    std::uint8_t* p = grow(v.size() * 5);
    for (const std::uint32_t x : v) p += put_uint(p, x);
    out_.resize(static_cast<std::size_t>(p - out_.data()));
  }

 private:
  std::uint8_t* grow(std::size_t n) {
    const std::size_t at = out_.size();
    out_.resize(at + n);
    return out_.data() + at;
  }
  void raw(const void* p, std::size_t n) {
    if (n != 0) std::memcpy(grow(n), p, n);
  }
  // Big-endian `bytes` low bytes of v after a type byte.
  void head(std::uint8_t type, std::uint64_t v, int bytes) {
    std::uint8_t* p = grow(1 + static_cast<std::size_t>(bytes));
    p[0] = type;
    for (int i = 0; i < bytes; ++i) p[1 + i] = static_cast<std::uint8_t>(v >> (8 * (bytes - 1 - i)));
  }
  // Writes v in its shortest unsigned form at p (room for 9 bytes); returns bytes written.
  static std::size_t put_uint(std::uint8_t* p, std::uint64_t v) {
    auto be = [p](std::uint8_t type, std::uint64_t x, int bytes) {
      p[0] = type;
      for (int i = 0; i < bytes; ++i) p[1 + i] = static_cast<std::uint8_t>(x >> (8 * (bytes - 1 - i)));
      return static_cast<std::size_t>(1 + bytes);
    };
    if (v < 0x80) {
      p[0] = static_cast<std::uint8_t>(v);  // positive fixint
      return 1;
    }
    if (v <= 0xff) return be(0xcc, v, 1);
    if (v <= 0xffff) return be(0xcd, v, 2);
    if (v <= 0xffffffff) return be(0xce, v, 4);
    return be(0xcf, v, 8);
  }
  void container(std::uint64_t n, std::uint8_t fix, std::uint8_t type16, const char* what) {
    if (n < 16) return out_.push_back(static_cast<std::uint8_t>(fix | n));
    if (n <= 0xffff) return head(type16, n, 2);
    head(static_cast<std::uint8_t>(type16 + 1), check32(n, what), 4);
  }
  static std::uint64_t check32(std::uint64_t n, const char* what) {
    if (n > 0xffffffffULL) fail("msgpack {} length = {}: over the format's 2^32-1 limit", what, n);
    return n;
  }

  std::vector<std::uint8_t>& out_;
};

}  // namespace kvmm
