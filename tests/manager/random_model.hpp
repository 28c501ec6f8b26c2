// The randomized manager test's reference model (reference_model.hpp): its layout, its
// requests, and the rules it checks the manager against, written out plainly.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/caching/block_hasher.hpp"
#include "kvmm/spec/element_format.hpp"
#include "kvmm/spec/kv_layout.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace kvmm::test {

inline constexpr std::uint32_t kMaxRequests = 12;
// Group 3 exists in layout 3 only: a DSA indexer tied to group 0, full attention to the model.
inline constexpr GroupId kFull = 0, kSw = 1, kMamba = 2, kIndexer = 3;
inline constexpr std::size_t kMaxGroups = 4;
inline constexpr std::uint32_t kWindow = 6;
inline constexpr std::uint32_t kP[kMaxGroups] = {4, 4, 8, 4};

// Layout 0: 6, 3 and 2 small pages per large page. Layout 1: the sliding-window and Mamba
// pages fill a large page each (n = 1), so step 3 merges their small-page LRUs with the
// large-page LRU of the full-attention group (n = 6). Layouts 2 and 3 (issue 32): the same
// kinds in the 2026 lineup's storage: an MLA latent in fp8 with per-token scales, fp8 K and
// nvfp4 V (scales in the page's separate region) in the window, a recurrent state given by
// its tensors; layout 3 adds an indexer (fp8 keys) tied to the MLA group.
inline KVLayout random_layout(int variant) {
  if (variant >= 2) {
    const ElementFormat fp8 = parse_kv_cache_dtype("fp8_per_token_head");
    LayerGroup sw = LayerGroup::sliding_window("sw", 2, 1, 16, 2, 4, kWindow);
    sw.k_format = fp8;
    sw.v_format = parse_kv_cache_dtype("nvfp4:separate");
    std::vector<LayerGroup> groups{
        LayerGroup::mla("full", 1, 24, 2, fp8, ElementFormat::of(ElementType::kBf16), 4), sw,
        LayerGroup::recurrent_state("mamba", 1,
                                    {{"conv", {16, 4}, ElementFormat::of(ElementType::kBf16)},
                                     {"recurrent", {4, 4, 4}, ElementFormat::of(ElementType::kFp32)}},
                                    8)};
    if (variant == 3) groups.push_back(LayerGroup::indexer("indexer", 1, 1, 28, fp8, 4, "full"));
    return KVLayout::plan(std::move(groups));
  }
  return KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 4),
                         LayerGroup::sliding_window("sw", variant == 0 ? 2 : 6, 1, 8, 2, 4, kWindow),
                         LayerGroup::mamba_state("mamba", 1, variant == 0 ? 384 : 768, 8)});
}

using HashKey = std::pair<std::uint64_t, std::uint64_t>;
inline HashKey key(const BlockHash& h) { return {h.lo, h.hi}; }

struct RefRequest {
  std::vector<std::uint32_t> tokens;
  std::uint32_t lora = 0;
  std::uint64_t registered[kMaxGroups] = {0, 0, 0, 0};
  bool swapped = false;
  bool admitted = false;  // a first allocate succeeded (reset undoes it): running allocates release retention
  std::vector<std::optional<BlockHash>> swapped_hash[kMaxGroups];
  std::vector<bool> swapped_null[kMaxGroups];
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
    if ((g == kSw || g == kMamba) && i >= lo && i < pages) return true;
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
