// Helpers the layout planner's seeded tests share (fit_tokens_test.cpp, state_pages_test.cpp):
// the brute-force side of their comparisons. O(groups) each.
#pragma once

#include "kvmm/spec/layer_group.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace spectest {

// The LCM of the groups' natural small pages (no limit, no padding).
inline std::uint64_t lcm_of(const std::vector<kvmm::LayerGroup>& gs) {
  std::uint64_t m = 1;
  for (const kvmm::LayerGroup& g : gs) m = std::lcm(m, g.natural_page_bytes());
  return m;
}

// The groups with every token group's tokens_per_page divided by d (states kept).
inline std::vector<kvmm::LayerGroup> divided(std::vector<kvmm::LayerGroup> gs, std::uint32_t d) {
  for (kvmm::LayerGroup& g : gs)
    if (!g.is_state()) g.tokens_per_page /= d;
  return gs;
}

// Brute force of the planner's token fitting: the smallest d > 1 dividing every token
// group's tokens_per_page, with the smallest one / d >= floor, whose natural LCM is at most
// `bound`; 1 when the natural LCM fits already or no such d exists. O(groups x d).
inline std::uint32_t fit_divisor(const std::vector<kvmm::LayerGroup>& gs, std::uint64_t bound, std::uint32_t floor) {
  std::uint32_t common = 0, smallest = ~0u;
  for (const kvmm::LayerGroup& g : gs)
    if (!g.is_state()) {
      common = std::gcd(common, g.tokens_per_page);
      smallest = std::min(smallest, g.tokens_per_page);
    }
  if (lcm_of(gs) <= bound) return 1;
  for (std::uint32_t d = 2; d <= common && smallest / d >= floor; ++d)
    if (common % d == 0 && lcm_of(divided(gs, d)) <= bound) return d;
  return 1;
}

}  // namespace spectest
