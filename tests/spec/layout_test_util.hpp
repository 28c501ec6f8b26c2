// Helpers the layout planner's seeded tests share (fit_tokens_test.cpp, state_pages_test.cpp):
// the brute-force side of their comparisons. O(groups) each.
#pragma once

#include "kvmm/spec/layer_group.hpp"

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

}  // namespace spectest
