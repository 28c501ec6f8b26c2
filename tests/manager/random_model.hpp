// The randomized manager test's reference model (randomized_test.cpp): its layout, its
// requests, and the rules it checks the manager against, written out plainly.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/caching/block_hasher.hpp"
#include "kvmm/spec/kv_layout.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace kvmm::test {

inline constexpr std::uint32_t kMaxRequests = 12;
inline constexpr GroupId kFull = 0, kSw = 1, kMamba = 2;
inline constexpr std::uint32_t kWindow = 6;
inline constexpr std::uint32_t kP[3] = {4, 4, 8};

// Layout 0: 6, 3 and 2 small pages per large page. Layout 1: the sliding-window and Mamba
// pages fill a large page each (n = 1), so step 3 merges their small-page LRUs with the
// large-page LRU of the full-attention group (n = 6).
inline KVLayout random_layout(int variant) {
  return KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 4),
                         LayerGroup::sliding_window("sw", variant == 0 ? 2 : 6, 1, 8, 2, 4, kWindow),
                         LayerGroup::mamba_state("mamba", 1, variant == 0 ? 384 : 768, 8)});
}

using HashKey = std::pair<std::uint64_t, std::uint64_t>;
inline HashKey key(const BlockHash& h) { return {h.lo, h.hi}; }

struct RefRequest {
  std::vector<std::uint32_t> tokens;
  std::uint32_t lora = 0;
  std::uint64_t registered[3] = {0, 0, 0};
  bool swapped = false;
  std::vector<std::optional<BlockHash>> swapped_hash[3];
  std::vector<bool> swapped_null[3];
  std::vector<std::uint64_t> bounds;             // hinted cache boundaries
  std::uint64_t prompt = 0;                      // its prompt's length (the tail's end)
  bool tail_dropped = false;                     // computed past prompt + tail once
  std::vector<std::pair<GroupId, PageId>> held;  // pages the model expects held for them
  std::vector<std::uint64_t> held_index;         // their indices in the row
};

// Whether page i of group g is one a hit at some boundary needs (the policies' rule,
// written out: the window's pages below L, Mamba's checkpoint at L).
inline bool held_by_rule(GroupId g, std::uint64_t i, const std::vector<std::uint64_t>& bounds) {
  for (std::uint64_t L : bounds) {
    const std::uint64_t p = L / kP[g] * kP[g], pages = p / kP[g];
    const std::uint64_t lo = g == kSw ? (p > kWindow ? p - kWindow : 0) / 4 : pages > 0 ? pages - 1 : 0;
    if (g != kFull && i >= lo && i < pages) return true;
  }
  return false;
}

// The model's own block hashes of q's full pages of P tokens (unsalted), page by page.
inline std::vector<BlockHash> chain(const RefRequest& q, std::uint32_t P, const BlockHasher& hasher) {
  std::vector<BlockHash> out;
  for (std::size_t i = 0; (i + 1) * P <= q.tokens.size(); ++i) {
    PageExtraKeys ex;
    ex.lora_id = q.lora;
    out.push_back(hasher.hash_page(false, i ? out.back() : BlockHash{}, std::span(q.tokens).subspan(i * P, P), ex));
  }
  return out;
}

}  // namespace kvmm::test
