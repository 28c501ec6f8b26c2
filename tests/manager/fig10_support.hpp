// What manager_test.cpp and lifecycle_test.cpp share: Jenga Fig. 10's layout, its token
// names, and a snapshot of everything a call may change (tables, counts, states).
#pragma once

#include "kvmm/manager/kernel_exports.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/testing/manager_inspector.hpp"

#include <cstdint>
#include <initializer_list>
#include <vector>

namespace kvmm::test {

// Full attention + sliding window, equal small pages, so a large page holds one small
// page of either group (the setting of Jenga §5.1).
inline KVLayout fig10_layout(std::uint32_t tokens_per_page = 1, std::uint32_t window = 2) {
  return KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, tokens_per_page),
                         LayerGroup::sliding_window("sw", 1, 1, 8, 2, tokens_per_page, window)});
}

inline constexpr std::uint32_t A = 101, B = 102, C = 103, D = 104, E = 105, F = 106, G = 107, H = 108, X = 109;
inline constexpr GroupId kFull = 0, kSw = 1;

struct Snapshot {
  std::vector<std::vector<std::vector<PageId>>> tables;  // [group][request]
  std::vector<std::vector<std::uint32_t>> refs;
  std::vector<std::vector<PageState>> states;
  std::vector<std::uint64_t> computed, allocated;  // [handle], of the handles given
  std::uint32_t free_large = 0;
  bool operator==(const Snapshot&) const = default;
};

// The tables of rows [0, max_requests); the counts of `handles` (handles are
// generation-checked: a row number is not one), 0 for one no longer active.
inline Snapshot snapshot(KVCacheManager& kv, std::uint32_t max_requests, std::initializer_list<RequestId> handles) {
  Snapshot s;
  s.free_large = kv.large_pages().num_free();
  for (GroupId g = 0; g < kv.layout().num_groups(); ++g) {
    s.tables.emplace_back();
    s.refs.emplace_back();
    s.states.emplace_back();
    for (RequestId r = 0; r < max_requests; ++r) {
      const auto t = KernelExports(kv).page_tables(g).pages(Row{r});
      s.tables.back().emplace_back(t.begin(), t.end());
    }
    const std::uint64_t pages = std::uint64_t{kv.large_pages().capacity()} * kv.small_pages(g).pages_per_large();
    for (PageId p = 0; p < pages; ++p) {
      s.refs.back().push_back(kvmm::testing::ManagerInspector(kv).ref_count(g, p));
      s.states.back().push_back(kvmm::testing::ManagerInspector(kv).page_state(g, p));
    }
  }
  for (const RequestId r : handles) {
    s.computed.push_back(kv.is_active(r) ? kv.num_computed(r) : 0);
    s.allocated.push_back(kv.is_active(r) ? kv.num_allocated(r) : 0);
  }
  return s;
}

}  // namespace kvmm::test
