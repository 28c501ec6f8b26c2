// The memory-policy interface of kvmm-sim, shaped like kvmm::KVCacheManager (begin_step,
// add_request, lookup_prefix, all-or-nothing allocate, commit, free, stats), which the
// kvmm policy calls one for one; and its factory: kvmm, paged-uniform, max-page,
// static-split, unified-block (the engines of 2025), vllm-0.33, vllm-0.33-tuned. allocate/free cost O(pages touched);
// stats O(requests x groups) (block policies with shared prefixes: O(blocks held)).
#pragma once

#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/spec/kv_layout.hpp"
#include "kvmm/spec/layer_slicing.hpp"
#include "sim/workload.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvmm::sim {

// What a policy knows about a request's content: enough to name its blocks.
struct SeqInfo {
  std::uint32_t uid = 0;             // request index, stable across preemptions
  std::uint32_t encoder_tokens = 0;  // image tokens held by encoder groups (cross/vision)
  std::uint64_t prefix_id = 0;
  std::uint32_t prefix_len = 0;                            // tokens [0, prefix_len) are stream prefix_id's
  const std::vector<std::uint32_t>* token_ids = nullptr;   // optional prompt token ids
  const std::vector<ImageSpan>* images = nullptr;          // image spans (text offsets)
  const std::vector<std::uint32_t>* boundaries = nullptr;  // SimRequest::boundaries (may be null)
  std::uint32_t prompt_tokens = 0;                         // decoder prompt tokens (0: unknown)
};

// Bytes of one policy group at one instant. used: needed to compute the next token
// (the KV of every position it reads, and the slot of the position it writes);
// wasted: allocated to running requests but not needed (partial pages, padding,
// out-of-window tokens kept, layers that do not need the token); cached: evictable
// prefix-cache pages; group_free: free memory only this group can use (a static
// partition, reserved state slots, free small pages inside this group's large pages).
struct GroupUsage {
  std::string name;
  std::uint64_t used = 0, wasted = 0, cached = 0, group_free = 0;
};

struct MemoryStats {
  std::vector<GroupUsage> groups;
  std::uint64_t free = 0;       // free memory any group can take
  std::uint64_t capacity = 0;   // usable KV bytes (the budget rounded down to whole pages)
  std::uint64_t evictions = 0;  // cumulative evicted cache pages
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const = 0;
  // One paragraph: the engine modelled, page sizes, pools, caching rule.
  virtual std::string describe() const = 0;
  virtual bool prefix_caching() const = 0;

  // Starts a scheduler step (the clock of LRU eviction). O(1).
  virtual void begin_step() {}
  // Registers request `id` (dense, < the workload size) before its first allocation.
  virtual void add_request(std::uint32_t id, const SeqInfo& info) = 0;
  // Tokens of the prompt already cached (at most max_hit), pinned for the request.
  virtual std::uint32_t lookup_prefix(std::uint32_t id, std::uint32_t max_hit) = 0;
  // Memory for tokens [num_computed, num_computed + num_new) in every group, all or
  // nothing (false: the scheduler preempts). The first call also takes encoder pages.
  virtual bool allocate(std::uint32_t id, std::uint32_t num_computed, std::uint32_t num_new) = 0;
  // The first num_computed tokens hold valid KV: full pages become cacheable.
  virtual void commit(std::uint32_t id, std::uint32_t num_computed) = 0;
  // Finished or aborted: pages go back (cacheable ones stay evictable).
  virtual void free(std::uint32_t id) = 0;
  // Preempted by recompute, or refused at admission: like free, and the request will be
  // added again later with the same info (a policy may keep what it derived from it).
  virtual void preempt(std::uint32_t id) { free(id); }
  // O(running requests x groups).
  virtual void stats(MemoryStats& out) const = 0;
  // Recounts every page from scratch and raises kvmm::Error on a mismatch. O(memory):
  // for tests (SchedulerOptions::check_invariants).
  virtual void check_invariants() const = 0;
  // Why lookups missed (issue 34): per reason, lookups whose hit stopped for it and the
  // tokens it cost, as the manager's miss_reasons count them; empty for a policy that
  // does not classify its misses (the block models).
  struct MissCount {
    std::string reason;
    std::uint64_t lookups = 0, tokens = 0;
  };
  virtual std::vector<MissCount> miss_reasons() const { return {}; }
  // kvmm: memory held for retention (KVCacheManager counters' retention_bytes sampled at
  // every step: mean and peak) and the held pages released under pressure; empty for the
  // block models.
  virtual std::string retention_line() const { return {}; }

  // Speculative decoding (SchedulerOptions::speculative, docs/sim.md): a decode step's
  // allocation of num_new verified-to-be tokens plus `lookahead` draft tokens. Only
  // policies with speculative() true take it (kvmm, vllm-eagle); the others raise.
  virtual bool speculative() const { return false; }
  virtual bool allocate_lookahead(std::uint32_t id, std::uint32_t num_computed, std::uint32_t num_new,
                                  std::uint32_t lookahead);
  // Draft positions the engine recomputes at r's admission (after its first allocate), over
  // every draft group: KVCacheManager::draft_recompute's lengths. 0 without draft groups.
  virtual std::uint64_t draft_recompute_tokens(std::uint32_t /*id*/) const { return 0; }
};

// kvmm's retention of the pages a hit at a shared prefix needs (issue 17): none (today's
// rule), hinted (each request's SimRequest::boundaries as RequestExtras::cache_boundaries),
// learned (the manager's defaults: learned_boundaries = kLearnedBoundaryEntries and
// prompt_tail_tokens), both.
enum class BoundaryMode : std::uint8_t { kNone, kHinted, kLearned, kBoth };
inline constexpr std::uint32_t kLearnedBoundaryEntries = 4096;
// "none" | "hinted" | "learned" | "both"; raises kvmm::Error naming the value otherwise.
BoundaryMode parse_boundary_mode(std::string_view s);
RetentionRelease parse_retention_release(std::string_view s);  // off, own, all

// The retention interval vllm-0.33-tuned uses unless told (chosen on arXiv-QA, docs/results/sim.md).
inline constexpr std::uint32_t kTunedRetentionInterval = 4096;
// PolicyOptions::slice_layers: the library's default rule (kvmm::dense_slice_layers at
// LayoutOptions' default threshold).
inline constexpr std::uint32_t kSliceLibraryDefault = 0xfffffffdu;
// The width PolicyOptions::slice_layers cuts the model's layout (planned unsliced,
// model_config.cpp) at: kSliceLibraryDefault is the library planner's rule on it (the kvmm
// policy takes it before vllm-eagle strips the draft roles, which would make a draft group
// sliceable).
inline std::uint32_t slice_width(const KVLayout& layout, std::uint32_t slice) {
  return slice == kSliceLibraryDefault ? dense_slice_layers(layout, LayoutOptions{}.slice_above_pages_per_large_page)
                                       : slice;
}

struct PolicyOptions {
  std::uint64_t memory_bytes = std::uint64_t{40} << 30;
  std::uint32_t max_seqs = 256;                      // scheduler's batch limit; state slots
  std::uint32_t max_model_len = 131072;              // static-split sizing
  std::uint32_t max_encoder_tokens = 6404;           // static-split sizing of encoder groups
  bool prefix_caching = true;                        // false: no policy caches (memory policy alone)
  BoundaryMode boundaries = BoundaryMode::kLearned;  // kvmm only; the manager's default
  // vllm-0.33-tuned: prefix_cache_retention_interval (tokens; vllm-0.33 uses vLLM's default 0).
  std::uint32_t retention_interval = kTunedRetentionInterval;
  // vllm-0.33(-tuned): vLLM's prefix_match_unit in tokens, the finest boundary a hit may end
  // on; 0 = vLLM's default (the configured block size, so hits inside blocks grown for a
  // Mamba group). A value equal to the grown block gives hits at block boundaries only.
  std::uint32_t prefix_match_unit = 0;
  // kvmm: KVCacheManagerOptions::pack_small_pages (packing; off: Jenga's step order;
  // unset: the manager's default, on unless the layout has draft groups).
  std::optional<bool> pack_small_pages = std::nullopt;
  // kvmm: each attention group cut into groups of this many layers (kvmm::slice_layers,
  // kvmm/spec/layer_slicing.hpp; 0 = off, kSliceAuto = the gcd of their layer counts when
  // that gives every group one page size, kSliceSmallest = the fewest layers of a group);
  // kSliceLibraryDefault: the library planner's default rule (LayoutOptions::slice_layers,
  // kvmm::dense_slice_layers: Gemma-3-27B cut at 10 layers, the other presets whole).
  std::uint32_t slice_layers = kSliceLibraryDefault;
  // kvmm: KVCacheManagerOptions::sparse_state_checkpoints.
  bool sparse_state_checkpoints = false;
  // kvmm: KVCacheManagerOptions::hit_unit (hits ending inside a page; 0 = off).
  std::uint32_t hit_unit = 0;
  // kvmm with learned boundaries: KVCacheManagerOptions::learned_tail_tokens.
  std::uint32_t learned_tail = KVCacheManagerOptions{}.learned_tail_tokens;
  // kvmm: KVCacheManagerOptions::retention_budget and retention_release (the bound on pages
  // held for retention and which of them a refused running request releases).
  double retention_budget = KVCacheManagerOptions{}.retention_budget;
  RetentionRelease retention_release = KVCacheManagerOptions{}.retention_release;
  // kvmm: the engine tags each tagged-checkpoint state at the verified count it holds
  // (KVCacheManager::tag_state after commit; speculative mode only, so runs without it
  // are unchanged).
  bool tag_states = false;
};

const std::vector<std::string>& policy_names();
// Raises kvmm::Error for an unknown name or a memory budget below one page per group.
std::unique_ptr<Policy> make_policy(std::string_view name, const KVLayout& layout, const PolicyOptions& o);

// Bytes group g needs to compute the next token of a request holding T decoder tokens
// and E encoder tokens: full T tokens, window min(T, w), chunked the current chunk,
// cross/vision E tokens, state one state.
std::uint64_t needed_bytes(const LayerGroup& g, std::uint64_t T, std::uint64_t E);

std::unique_ptr<Policy> make_kvmm_policy(const KVLayout& layout, const PolicyOptions& o);
// The policies only the speculative mode runs (not in policy_names(), not in "all"):
// vllm-eagle, kvmm's manager under vLLM's rules for EAGLE/MTP (each draft group a plain
// group of the layout, cached like the target's; the last block of every hit dropped).
const std::vector<std::string>& speculative_policy_names();
std::unique_ptr<Policy> make_vllm_eagle_policy(const KVLayout& layout, const PolicyOptions& o);
// The cache boundaries the kvmm policy hands the manager for a request whose prompt has
// prompt_tokens decoder tokens: info.boundaries at most prompt_tokens (ascending, 0 and
// duplicates dropped), the last kMaxCacheBoundaries of them. O(boundaries).
std::vector<std::uint64_t> cache_boundaries_for(const SeqInfo& info, std::uint64_t prompt_tokens);
std::unique_ptr<Policy> make_block_policy(std::string_view name, const KVLayout& layout, const PolicyOptions& o);

}  // namespace kvmm::sim
