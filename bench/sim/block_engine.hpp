// The block-pool engine behind the models of engines (block_engines.cpp): BlockPolicy,
// "policy groups" (vgroups) allocating fixed-size blocks from pools of interchangeable
// units, with block-hash prefix caching and the cache rules of today's engines
// (CacheRules, Rebalance). Private to the simulator: block_policy.cpp holds the request
// lifecycle and the block primitives, block_rules.cpp the cache rules, block_accounting.cpp
// stats and the invariant recount. allocate/free cost O(blocks touched).
#pragma once

#include "sim/block_policy.hpp"

#include "kvmm/error.hpp"

#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvmm::sim::block {

class BlockPolicy final : public Policy {
 public:
  BlockPolicy(std::string name, const KVLayout& layout, std::vector<VGroup> vgs, std::vector<Pool> pools, bool caching,
              std::string description, SkipOrder skip_order, CacheRules rules, Rebalance rebalance)
      : name_(std::move(name)),
        layout_(layout),
        vgs_(std::move(vgs)),
        pools_(std::move(pools)),
        caching_(caching),
        skip_order_(skip_order),
        rules_(rules),
        rb_(rebalance),
        description_(std::move(description)),
        index_(vgs_.size()),
        pindex_(vgs_.size()),
        sindex_(vgs_.size()),
        vg_evictable_(vgs_.size(), 0),
        vg_in_use_(vgs_.size(), 0) {
    std::vector<std::uint8_t> seen(pools_.size(), 0);
    for (const VGroup& g : vgs_) {  // a pool's one-group free memory is reported by its first vgroup
      reports_pool_free_.push_back(seen[g.pool] == 0);
      seen[g.pool] = 1;
    }
    rb_target_.assign(pools_.size(), 0.0);
    for (const VGroup& g : vgs_)
      if (rules_.hit_unit > 0 && g.kind != VKind::kState && g.kind != VKind::kEncoder && g.tpb % rules_.hit_unit != 0)
        fail("hit_unit = {}: must divide the {} tokens per block of vgroup '{}'", rules_.hit_unit, g.tpb, g.name);
  }

  std::string_view name() const override { return name_; }
  void begin_step() override {
    if (rb_.enabled) rebalance();
  }
  std::string describe() const override { return description_; }
  bool prefix_caching() const override { return caching_; }

  void add_request(std::uint32_t id, const SeqInfo& info) override;

  std::uint32_t lookup_prefix(std::uint32_t id, std::uint32_t max_hit) override;

  bool allocate(std::uint32_t id, std::uint32_t num_computed, std::uint32_t num_new) override;

  void commit(std::uint32_t id, std::uint32_t num_computed) override;

  void free(std::uint32_t id) override;

  void check_invariants() const override;

  void stats(MemoryStats& out) const override;

 private:
  struct Req {
    bool active = false;
    SeqInfo info;
    std::uint32_t tokens = 0;                            // decoder tokens with memory
    std::vector<std::vector<std::uint32_t>> blocks;      // per vgroup: block slots or kNull
    std::vector<std::uint32_t> first_live;               // per vgroup: first non-null block
    std::vector<std::uint32_t> committed;                // per vgroup: blocks already offered to the cache
    std::vector<std::vector<std::uint64_t>> token_keys;  // per vgroup: chained hashes of token ids
    std::vector<std::uint64_t> unit_keys;                // chained hashes of token ids per hit unit
    std::vector<std::uint32_t> unit_done;                // per vgroup: tokens whose unit keys are registered
    std::vector<std::uint32_t> hit_blocks;               // per vgroup: blocks taken from the cache at lookup
    std::uint32_t junction = 0;                          // shared-prefix junction found at lookup (0: none)
    std::uint32_t state_done = 0;                        // tokens up to which state checkpoints were considered
    std::uint32_t computed = 0;                          // tokens committed so far
  };

  static constexpr std::uint8_t kFullKey = 1, kUnitKeys = 2;  // cached_ bits

  // A hit length rounded down to what every vgroup can end a hit on.
  std::uint64_t align(std::uint64_t h) const;

  // Content key of the first `pos` tokens at a hit-unit boundary inside a block (partial
  // key), or of a state checkpoint at `pos` (salted apart).
  std::uint64_t unit_key(const Req& q, std::uint64_t pos, std::uint64_t salt) const;
  std::uint64_t pkey(const Req& q, std::size_t v, std::uint64_t pos) const;
  std::uint64_t skey(const Req& q, std::uint64_t pos) const { return unit_key(q, pos, 0x5747e000ULL); }

  // A hit ending at pos (not a block boundary) can take the tokens of its last block from
  // a cached block: one with that partial key, or the full block itself.
  bool present_partial(const Req& q, std::size_t v, std::uint64_t pos) const;

  // Does a hit at a position the request retains need block b of window vgroup g? The
  // retained positions: the replay boundary, the junction, multiples of the interval.
  bool retained(const Req& q, const VGroup& g, std::uint64_t b) const;
  std::uint64_t replay_boundary(const Req& q) const;

  // Sparse retention: window block b (slot s), just released by request q, leaves the cache
  // unless a hit at one of q's retained positions needs it. Only blocks q computed itself:
  // blocks it hit were cached by another request's rule (vLLM masks the blocks a request
  // caches, cache_full_blocks' block_mask).
  void drop_unless_retained(const Req& q, std::size_t v, std::uint64_t b, std::uint32_t s);

  // Registers the partial keys of the unit boundaries in (unit_done, num_computed] that
  // fall inside a block.
  void register_units(Req& q, std::size_t v, std::uint32_t num_computed);

  // Mamba "align": caches the state at each retained position in (state_done,
  // num_computed] (vLLM ends the chunk there), as an evictable block; skipped when the
  // pool has no room for it.
  void checkpoint_states(Req& q, std::size_t v, std::uint32_t num_computed);

  // The prompt-end state position: vLLM's replay boundary (aligned to the hit granularity);
  // with token-granular hits (TensorRT-LLM) the prompt's end itself.
  std::uint64_t state_prompt_end(const Req& q) const;

  // SGLang: the request's running state becomes the cached state at its sequence's end
  // (the tree's leaf), aligned down to the hit granularity (the state tracked there).
  void checkpoint_at_end(Req& q);

  // Cached states by content stream, so a lookup finds the deepest one below a hit length
  // at any position (synthetic streams; traces with token ids scan a grid).
  std::uint64_t state_stream(const Req& q, std::uint64_t pos) const;
  void note_state(const Req& q, std::uint32_t s, std::uint64_t pos);
  // The deepest cached state of q's streams at or below h (0: none).
  std::uint64_t deepest_state(const Req& q, std::size_t v, std::uint64_t h) const;

  // Token-granular partial reuse: the block holding the end of the request's shared stream
  // (its prefix, up to what is computed) is registered under (stream, block) with the
  // stream's length in it; a longer one replaces a shorter one.
  void register_stream(Req& q, std::size_t v, std::uint32_t num_computed);
  std::uint64_t stream_key(const Req& q, std::size_t v, std::uint64_t b) const;
  // Tokens of block b a hit can take from the stream's registered block (0: none).
  std::uint64_t stream_len(const Req& q, std::size_t v, std::uint64_t b) const;

  // Rebalance: moving averages of finished requests' lengths (squared, as the engine does:
  // long requests also live long).
  void sample_closed(const Req& q);

  // Resizes the pools to the target shares when one is off by more than the threshold:
  // shrinking pools give up free units (evicting cached ones first), growing pools take the
  // bytes freed, in whole units. Called at the start of a step.
  void rebalance();

  static std::uint64_t mix(std::uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
  }

  Req& req(std::uint32_t id) {
    if (id >= reqs_.size() || !reqs_[id].active) fail("request = {}: not an active request", id);
    return reqs_[id];
  }

  // Content key of block b of vgroup v: token ids when the trace has them, else the
  // shared stream (prefix_id, b) inside the prefix, else the request's own stream.
  std::uint64_t key(const Req& q, std::size_t v, std::uint64_t b) const;

  // Bytes of block b that the next position needs: per covered group, the block's
  // tokens that group reads (all of them, those in the window, those in the chunk).
  std::uint64_t block_need(const VGroup& g, std::uint64_t b, std::uint64_t T, std::uint64_t E) const;

  // Sum of block_need over blocks [first_live, end) of a request.
  std::uint64_t live_need(const VGroup& g, std::uint64_t first_live, std::uint64_t T, std::uint64_t E) const;

  bool present(const Req& q, std::size_t v, std::uint64_t b) const {
    return index_[v].find(key(q, v, b)) != index_[v].end();
  }

  // First block the computation of position p still reads.
  static std::uint64_t first_needed_block(const VGroup& g, std::uint64_t p) {
    if (g.kind == VKind::kWindow) return p + 1 > g.window ? (p + 1 - g.window) / g.tpb : 0;
    if (g.kind == VKind::kChunked) return p / g.chunk * g.chunk / g.tpb;
    return 0;
  }

  // Largest hit <= h (block aligned) that vgroup v can serve from the cache.
  std::uint64_t valid_hit(const Req& q, std::size_t v, std::uint64_t h) const;

  // A state hit: the largest position <= h with a cached state. Candidates: h, the request's
  // own prompt end (a preempted request's snapshot), and the grid of the smallest attention
  // block below h.
  std::uint64_t valid_state_hit(const Req& q, std::size_t v, std::uint64_t h) const;

  // valid_hit with token-granular partial reuse: a hit may end inside a block that the
  // request's stream registered (copied).
  std::uint64_t valid_stream_hit(const Req& q, std::size_t v, std::uint64_t h) const;

  // valid_hit at hit-unit granularity: the last block may be partly hit (copied).
  std::uint64_t valid_unit_hit(const Req& q, std::size_t v, std::uint64_t h) const;

  std::uint32_t new_block(std::size_t v);

  void release(std::size_t v, std::uint32_t s);

  void evict(Pool& p);

  void forget_state(std::uint32_t s);

  // Frees evictable block s that just lost its last cache key.
  void free_uncached(std::uint32_t s);

  // Drops evictable block s from the cache and frees it.
  void evict_slot(std::uint32_t s);

  void lru_push(Pool& p, std::uint32_t s);
  void lru_remove(std::uint32_t s);

  std::string name_;
  KVLayout layout_;
  std::vector<VGroup> vgs_;
  std::vector<Pool> pools_;
  bool caching_;
  SkipOrder skip_order_;
  CacheRules rules_;
  Rebalance rb_;
  std::string description_;
  std::vector<std::unordered_map<std::uint64_t, std::uint32_t>> index_;   // per vgroup: key -> block
  std::vector<std::unordered_map<std::uint64_t, std::uint32_t>> pindex_;  // per vgroup: partial key -> block
  // per vgroup: stream key -> (block, stream tokens in it), for token-granular partial reuse
  std::vector<std::unordered_map<std::uint64_t, std::pair<std::uint32_t, std::uint32_t>>> sindex_;
  std::vector<bool> reports_pool_free_;                                // per vgroup
  std::unordered_map<std::uint64_t, std::set<std::uint32_t>> states_;  // stream -> positions with a cached state
  std::unordered_map<std::uint32_t, std::pair<std::uint64_t, std::uint32_t>> state_at_;  // state block -> (stream, pos)
  // Rebalance state.
  std::vector<double> rb_target_;  // per pool: target byte share (0: not computed)
  double rb_sum_ = 0, rb_weight_ = 0;
  std::uint64_t rb_closed_ = 0, rb_step_ = 0, rb_last_ = 0, rb_spare_bytes_ = 0, rebalances_ = 0;
  std::vector<std::uint64_t> vg_evictable_;
  std::vector<std::uint64_t> vg_in_use_;  // per vgroup: units in blocks with ref > 0
  // Block slots, structure of arrays.
  std::vector<std::uint32_t> ref_, vg_, prev_, next_;
  std::vector<std::uint8_t> cached_;
  std::vector<std::uint64_t> key_;
  std::vector<std::vector<std::uint64_t>> pkeys_;  // partial keys registered for each block
  std::vector<std::uint32_t> free_slots_;
  std::vector<Req> reqs_;
  std::vector<std::uint32_t> active_;
  std::vector<std::uint64_t> need_, pool_need_;
  std::uint64_t evictions_ = 0;
};

}  // namespace kvmm::sim::block
