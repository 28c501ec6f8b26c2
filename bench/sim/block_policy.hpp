// The block-pool engine behind the policies of today's engines (block_policy.cpp) and the
// configurations that model each engine (block_engines.cpp): policy groups (vgroups) take
// fixed-size blocks from pools of interchangeable units. Private to the simulator.
#pragma once

#include "sim/policy.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvmm::sim::block {

constexpr std::uint32_t kNull = ~std::uint32_t{0};

enum class VKind : std::uint8_t { kFull, kWindow, kChunked, kEncoder, kState };

struct VGroup {
  std::string name;
  VKind kind = VKind::kFull;
  std::uint32_t tpb = 16;    // tokens per block (state: unused)
  std::uint32_t window = 0;  // kWindow
  std::uint32_t chunk = 0;   // kChunked
  std::uint64_t units = 1;   // pool units one block occupies
  std::uint32_t pool = 0;
  std::vector<GroupId> covers;  // layout groups whose memory the blocks hold
};

struct Pool {
  std::string name;
  std::uint64_t unit_bytes = 0;
  std::uint64_t capacity = 0;   // units
  std::uint64_t free = 0;       // units
  std::uint64_t evictable = 0;  // units in cached blocks with ref 0
  std::uint32_t lru_head = kNull, lru_tail = kNull;
  bool shared = true;  // free units usable by several vgroups
};

// The order in which a request's blocks that left the window or chunk go back to their
// pool, and so into its LRU (whose head is evicted first). kLowFirst: index ascending, the
// oldest block is evicted first. kHighFirst: vLLM v1's remove_skipped_blocks (it walks
// down from the last skipped block), so the block that just left the window, the one a
// hit at the end of a shared prefix needs, is evicted first.
enum class SkipOrder : std::uint8_t { kLowFirst, kHighFirst };

// Prefix-cache rules of vLLM 0.33 (docs/sim.md, "vllm-0.33"). The defaults are vLLM v1 of
// 2025 and every older model: hits end on block boundaries, a block that leaves the window
// stays cached like any other, no state is cached.
struct CacheRules {
  // Sparse retention (prefix_cache_retention_interval = 0 or N): a window block that leaves
  // the window stays cached only if a hit at a retained position needs it: the request's
  // replay boundary (its prompt's last token, aligned down), its shared-prefix junction (the
  // full-attention hit when a sparse group lagged it at lookup), and with an interval every
  // multiple of it. Any other such block is dropped from the cache at once.
  bool sparse_retention = false;
  std::uint32_t retention_interval = 0;  // tokens; 0: semantic positions only
  // prefix_match_unit: a hit may end at any multiple of it inside a block; the partly hit
  // block is copied into a fresh block (copy-on-write). 0: hits end on block boundaries.
  std::uint32_t hit_unit = 0;
  // Mamba "align" caching: the state at each retained position is cached (one state
  // block, evictable), and a hit copies it into the request's own state block.
  bool state_caching = false;
};

// The engine over these vgroups and pools; block-hash prefix caching when `caching`.
std::unique_ptr<Policy> make_engine(std::string name, const KVLayout& layout, std::vector<VGroup> vgs,
                                    std::vector<Pool> pools, bool caching, std::string description,
                                    SkipOrder skip_order = SkipOrder::kLowFirst, CacheRules rules = {});

}  // namespace kvmm::sim::block
