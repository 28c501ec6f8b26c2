// The block-pool engine behind the policies of engines (block_engine.hpp, block_policy.cpp,
// block_rules.cpp, block_accounting.cpp) and the
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

// Where a request keeps what a later hit needs (sliding-window blocks or a state
// checkpoint): positions are hit lengths, aligned down to the hit granularity.
struct Positions {
  bool prompt_end = false;     // the prompt's last token (vLLM's replay boundary; TRT-LLM's prompt-end snapshot)
  bool seq_end = false;        // the sequence's end when the request is freed (SGLang's leaf)
  bool junction = false;       // the full-attention hit at lookup when a sparse group stopped it before
  std::uint32_t interval = 0;  // also every multiple of it (0: none)
  bool any() const { return prompt_end || seq_end || junction || interval > 0; }
};

// Prefix-cache rules of today's engines (docs/sim.md). The defaults are vLLM v1 of 2025 and
// every older model: hits end on block boundaries, a block that leaves the window stays
// cached like any other, no state is cached.
struct CacheRules {
  // Sparse retention: a window block a request computed stays cached only if a hit at one
  // of `window` positions needs it; any other is dropped as it leaves the window or at free.
  bool sparse_retention = false;
  Positions window;
  // A hit may end at any multiple of hit_unit inside a block; the partly hit block is copied
  // into a fresh block (copy-on-write). 0: hits end on block boundaries.
  std::uint32_t hit_unit = 0;
  // Partial reuse at token granularity (TensorRT-LLM): a cached block that holds the first
  // tokens of a shared stream serves a hit ending anywhere inside it, copied. Synthetic
  // streams only (a trace with token ids hits whole blocks).
  bool stream_partial = false;
  // Recurrent state cached at `state` positions (one state block each, evictable); a hit
  // needs a state at its exact length and copies it into the request's own block.
  bool state_caching = false;
  Positions state;
};

// Pool ratios rebalanced at run time (TensorRT-LLM's KV cache manager v2): after
// min_closed requests finished, the target byte share of each pool is recomputed every
// update_interval finished requests from moving averages of their lengths, and the pools
// are resized when a share is off by more than `threshold`, at most every cooldown_steps.
struct Rebalance {
  bool enabled = false;
  std::uint32_t min_closed = 2000, update_interval = 100, cooldown_steps = 2400;
  double threshold = 1.25, decay = 0.9999;
};

// The engine over these vgroups and pools; block-hash prefix caching when `caching`.
std::unique_ptr<Policy> make_engine(std::string name, const KVLayout& layout, std::vector<VGroup> vgs,
                                    std::vector<Pool> pools, bool caching, std::string description,
                                    SkipOrder skip_order = SkipOrder::kLowFirst, CacheRules rules = {},
                                    Rebalance rebalance = {});

}  // namespace kvmm::sim::block
