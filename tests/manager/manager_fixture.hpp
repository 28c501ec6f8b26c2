// Helpers the manager tests share: distinct token ids per salt.
#pragma once

#include <cstdint>
#include <vector>

namespace kvmm::test {

// n ids, distinct for each salt (salt * 100000 + position).
inline std::vector<std::uint32_t> salted_ids(std::uint32_t n, std::uint32_t salt) {
  std::vector<std::uint32_t> t(n);
  for (std::uint32_t i = 0; i < n; ++i) t[i] = salt * 100000 + i;
  return t;
}

}  // namespace kvmm::test
