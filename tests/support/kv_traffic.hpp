// Seeded random serving traffic on a KVCacheManager with record_kv_events on, for the KV
// event tests (tests/manager/kv_events_test.cpp checks the batches in C++,
// tests/distributed/events/manager_stream_test.cpp through the wire): a hybrid layout (full
// attention, sliding window, Mamba, cross attention), prompts sharing a few documents,
// LoRA ids, cache salts, images, cache boundaries; chunked prefill, decode, preemption,
// fork, swap, free, evictions under a small pool, and reset_prefix_cache now and then.
// cached_set() is the manager's own cached set (support/cached_blocks.hpp); observe() what
// the engine sees (tables, hits), the same in every BlockHashOptions mode for one seed.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/error.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "support/cached_blocks.hpp"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace kvmm::test {

inline KVLayout traffic_layout() {
  return KVLayout::plan(
      {LayerGroup::full_attention("full", 1, 1, 8, 2, 4), LayerGroup::sliding_window("sw", 1, 1, 8, 2, 4, 12),
       LayerGroup::mamba_state("mamba", 1, 256, 8), LayerGroup::cross_attention("cross", 1, 1, 8, 2, 4)});
}

class KvTraffic {
 public:
  // learn: KVCacheManagerOptions::learned_boundaries at its default, else 0 (its table is
  // direct-mapped by hash value: which hints overwrite each other depends on the hash).
  KvTraffic(std::uint64_t seed, std::uint32_t num_large_pages = 40, BlockHashOptions block_hash = {}, bool learn = true)
      : rng_(seed),
        kv_(traffic_layout(), {.num_large_pages = num_large_pages,
                               .num_host_large_pages = 24,
                               .max_requests = kMaxLive + 1,
                               .record_kv_events = true,
                               .learned_boundaries = learn ? KVCacheManagerOptions{}.learned_boundaries : 0,
                               .block_hash = std::move(block_hash)}) {
    for (auto& d : docs_) {
      d.resize(24 + rng_() % 40);
      for (auto& t : d) t = static_cast<std::uint32_t>(rng_() % 50000);
    }
    for (std::size_t i = 0; i < images_.size(); ++i) {
      const std::uint64_t x = rng_();
      images_[i] = hash_bytes(std::as_bytes(std::span(&x, 1)));
    }
  }

  KVCacheManager& manager() { return kv_; }
  const KVCacheManager& manager() const { return kv_; }
  std::uint64_t ops() const { return ops_; }
  std::uint64_t resets_of_cache() const { return cache_resets_; }

  // One engine step: begin_step, then a few random operations.
  void step() {
    kv_.begin_step();
    const std::uint64_t n = 1 + rng_() % 4;
    for (std::uint64_t i = 0; i < n; ++i) op();
  }

  std::set<CachedBlock> cached_set() const { return cached_blocks(kv_); }

  // The live requests' ids, progress and device page tables, then the hit and eviction
  // counters, flattened: what two runs of one seed must agree on whatever the hash.
  std::vector<std::uint64_t> observe() const {
    std::vector<std::uint64_t> out;
    for (const Live& l : live_) {
      const bool swapped = kv_.is_swapped(l.id);
      out.insert(out.end(), {l.id, swapped, kv_.num_computed(l.id), kv_.num_allocated(l.id)});
      for (GroupId g = 0; g < kv_.layout().num_groups() && !swapped; ++g) {
        const auto t = kv_.page_table(l.id, g);
        out.push_back(t.size());
        out.insert(out.end(), t.begin(), t.end());
      }
    }
    const ManagerCounters c = kv_.counters();
    out.insert(out.end(), {c.lookups, c.hit_tokens, c.admitted_hit_tokens, c.lost_hits, c.evicted_pages, c.cow_copies,
                           c.swapped_in_pages});
    return out;
  }

 private:
  static constexpr std::size_t kMaxLive = 10;

  struct Live {
    RequestId id;
    std::vector<std::uint32_t> tokens;  // what the manager was given (kept for the spans)
    std::vector<MultimodalItem> items;
    std::string salt;
    std::uint64_t prompt = 0;
  };

  void op() {
    ++ops_;
    const std::uint64_t what = rng_() % 1000;
    if (what < 2) {
      kv_.reset_prefix_cache();
      ++cache_resets_;
      return;
    }
    if ((what < 250 || live_.empty()) && live_.size() < kMaxLive) return add();
    const std::size_t k = rng_() % live_.size();
    Live& l = live_[k];
    if (kv_.is_swapped(l.id)) {
      if (!kv_.swap_in(l.id)) drop(k);
      return;
    }
    if (what < 800) return advance(l);
    if (what < 850 && live_.size() < kMaxLive && kv_.num_allocated(l.id) > 0) {
      Live child = l;
      child.id = kv_.fork(l.id);
      live_.push_back(std::move(child));
      return;
    }
    if (what < 900) {
      if (kv_.num_allocated(l.id) > 0 && !kv_.swap_out(l.id)) kv_.reset(l.id);
      return;
    }
    if (what < 930) return kv_.reset(l.id);
    drop(k);
  }

  void add() {
    Live l;
    const auto& doc = docs_[rng_() % docs_.size()];
    l.tokens.assign(doc.begin(), doc.begin() + static_cast<std::ptrdiff_t>(8 + rng_() % (doc.size() - 7)));
    for (std::uint64_t i = rng_() % 20; i > 0; --i) l.tokens.push_back(static_cast<std::uint32_t>(rng_() % 50000));
    l.prompt = l.tokens.size();
    RequestExtras ex;
    ex.lora_id = rng_() % 5 == 0 ? 3 : 0;
    if (rng_() % 6 == 0) {
      l.salt = rng_() % 2 == 0 ? "tenant-a" : "tenant-b";
      ex.cache_salt = l.salt;
    }
    if (rng_() % 4 == 0 && l.prompt > 12) {
      const std::uint64_t off = rng_() % (l.prompt - 10);
      const std::uint32_t len = 3 + static_cast<std::uint32_t>(rng_() % 8);
      l.items.push_back(MultimodalItem{images_[rng_() % images_.size()], off, len});
      if (rng_() % 2 == 0 && off + len + 4 < l.prompt)
        l.items.push_back(MultimodalItem{images_[rng_() % images_.size()], off + len + 1, 3});
    }
    ex.items = l.items;
    std::uint64_t bound = 0;
    if (rng_() % 3 == 0) {
      bound = std::min<std::uint64_t>(doc.size(), l.prompt);
      ex.cache_boundaries = std::span(&bound, 1);
    }
    l.id = kv_.add_request(l.tokens, ex);
    kv_.lookup_prefix(l.id);
    if (!kv_.allocate(l.id, 0)) kv_.reset(l.id);
    live_.push_back(std::move(l));
  }

  // A prefill chunk or a decode token; when refused, preempted (swap or reset).
  void advance(Live& l) {
    const std::uint64_t c = kv_.num_computed(l.id);
    const std::uint32_t n =
        c < l.prompt ? static_cast<std::uint32_t>(std::min<std::uint64_t>(l.prompt - c, 1 + rng_() % 16)) : 1;
    if (c + n > kv_.num_tokens(l.id)) {
      const std::uint32_t t = static_cast<std::uint32_t>(rng_() % 50000);
      kv_.append_token(l.id, t);
      l.tokens.push_back(t);
    }
    const AllocateResult ok = kv_.allocate(l.id, n);
    if (ok.kind == AllocateStatus::kHitLost) {  // a hit lost since lookup_prefix (documented): start over
      kv_.reset(l.id);
      return;
    }
    if (ok)
      kv_.commit(l.id, c + n);
    else if (!kv_.swap_out(l.id))
      kv_.reset(l.id);
  }

  void drop(std::size_t k) {
    kv_.free(live_[k].id);
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(k));
  }

  std::mt19937_64 rng_;
  KVCacheManager kv_;
  std::vector<std::vector<std::uint32_t>> docs_ = std::vector<std::vector<std::uint32_t>>(6);
  std::vector<BlockHash> images_ = std::vector<BlockHash>(3);
  std::vector<Live> live_;
  std::uint64_t ops_ = 0, cache_resets_ = 0;
};

}  // namespace kvmm::test
