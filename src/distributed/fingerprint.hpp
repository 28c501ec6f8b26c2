// Internal (src/dist only): a fixed little-endian serialization hashed with XXH3-64, so
// fingerprints of layouts and tier scopes agree across machines and compilers. O(bytes).
#pragma once

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include <cstdint>
#include <string_view>
#include <vector>

namespace kvmm::detail {

class Fingerprint {
 public:
  Fingerprint& u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
    return *this;
  }
  // Length first, so that ("ab", "c") and ("a", "bc") differ.
  Fingerprint& str(std::string_view s) {
    u64(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  std::uint64_t digest() const { return XXH3_64bits(bytes_.data(), bytes_.size()); }

 private:
  std::vector<std::uint8_t> bytes_;
};

inline std::uint64_t xxh3_64(const void* data, std::size_t len) { return XXH3_64bits(data, len); }

}  // namespace kvmm::detail
