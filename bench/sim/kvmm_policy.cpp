// The kvmm policy: kvmm's real KVCacheManager (two-level LCM paging, request-aware
// placement, per-layer-kind prefix caching: full attention, sliding window, chunked local,
// Mamba checkpoints, images of cross-attention / vision groups) behind the simulator's
// policy interface, one manager call per policy call. Workloads without token ids get
// synthetic ids from (prefix stream, position) or (request, position), so shared prefixes
// hash equal and nothing else does; image spans become RequestExtras::items.
#include "sim/policy.hpp"
#include "sim/scheduler.hpp"

#include "kvmm/error.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <span>

namespace kvmm::sim {

namespace {

class KvmmPolicy final : public Policy {
 public:
  KvmmPolicy(const KVLayout& layout, const PolicyOptions& o)
      : kv_(layout, options(layout, o)), caching_(o.prefix_caching), cross_(shape_of(layout).cross_attention) {
    const std::uint32_t large = kv_.large_pages().capacity();
    stamp_.resize(layout.num_groups());
    need_.resize(layout.num_groups());
    for (GroupId g = 0; g < layout.num_groups(); ++g) {
      stamp_[g].assign(std::size_t{large} * layout.small_pages_per_large_page(g), 0);
      need_[g].assign(stamp_[g].size(), 0);
    }
  }

  std::string_view name() const override { return "kvmm"; }
  bool prefix_caching() const override { return caching_; }
  std::string describe() const override {
    const KVLayout& l = kv_.layout();
    std::string groups;
    for (GroupId g = 0; g < l.num_groups(); ++g)
      groups += fmt::format("{}{} {} B x {}", groups.empty() ? "" : ", ", l.group(g).name, l.small_page_bytes(g),
                            l.small_pages_per_large_page(g));
    return fmt::format(
        "kvmm KVCacheManager: {} large pages of {} B (LCM; small pages per large page: {}), request-aware "
        "placement, pages out of each layer kind's need released at commit; prefix caching {} (per-layer-kind "
        "hit rules, images cached by image hash, LRU small/large-page eviction)",
        kv_.large_pages().capacity(), l.large_page_bytes(), groups, caching_ ? "on" : "off");
  }

  void begin_step() override { kv_.begin_step(); }

  void add_request(std::uint32_t id, const SeqInfo& info) override {
    if (id >= reqs_.size()) reqs_.resize(std::size_t{id} + 1);
    Req& q = reqs_[id];
    if (q.active) fail("request = {}: already added", id);
    q.info = info;
    q.items.clear();
    q.prompt_ids.clear();
    build_items(q);
    if (caching_ && info.token_ids != nullptr && !info.token_ids->empty()) build_prompt_ids(q);
    RequestExtras ex;
    ex.items = q.items;
    // Token ids arrive at lookup_prefix (as many as the scheduler knows) and commit.
    q.slot = kv_.add_request({}, ex);
    q.active = true;
    q.pos = static_cast<std::uint32_t>(active_.size());
    active_.push_back(id);
  }

  std::uint32_t lookup_prefix(std::uint32_t id, std::uint32_t max_hit) override {
    Req& q = req(id);
    // The manager looks up at most (token ids known - 1) tokens.
    if (caching_) feed_ids(q, std::uint64_t{max_hit} + 1);
    return static_cast<std::uint32_t>(kv_.lookup_prefix(q.slot));
  }

  bool allocate(std::uint32_t id, std::uint32_t num_computed, std::uint32_t num_new) override {
    Req& q = req(id);
    if (kv_.num_computed(q.slot) != num_computed)
      fail("num_computed = {}: request {} has {} computed tokens in the manager", num_computed, id,
           kv_.num_computed(q.slot));
    return kv_.allocate(q.slot, num_new);
  }

  // The ids of the computed tokens (prompt and sampled) go in first: commit hashes full pages.
  void commit(std::uint32_t id, std::uint32_t num_computed) override {
    Req& q = req(id);
    if (caching_) feed_ids(q, num_computed);
    kv_.commit(q.slot, num_computed);
  }

  void free(std::uint32_t id) override {
    Req& q = req(id);
    kv_.free(q.slot);
    q.active = false;
    const std::uint32_t last = active_.back();
    active_[q.pos] = last;
    reqs_[last].pos = q.pos;
    active_.pop_back();
  }

  void check_invariants() const override {
    kv_.check_invariants();
    if (kv_.num_active() != active_.size())
      fail("invariant: manager has {} active requests, policy {}", kv_.num_active(), active_.size());
    for (std::uint32_t id : active_)
      if (!reqs_[id].active || !kv_.is_active(reqs_[id].slot))
        fail("invariant: request {} active in the policy, not in the manager", id);
  }

  // Used/wasted by the simulator's definition (needed = what the next token reads and the
  // slot it writes), over distinct pages: a page shared after a hit counts once, at its
  // largest need. Cached = evictable pages (held by the allocator, referenced by nobody).
  void stats(MemoryStats& out) const override {
    const KVLayout& l = kv_.layout();
    ++epoch_;
    out.groups.resize(l.num_groups());
    const CacheStats cs = kv_.stats();
    for (GroupId g = 0; g < l.num_groups(); ++g) {
      const LayerGroup& grp = l.group(g);
      const std::uint64_t P = grp.tokens_per_page;
      std::uint64_t distinct = 0, need = 0;
      auto credit = [&](PageId p, std::uint64_t bytes) {
        if (stamp_[g][p] != epoch_) {
          stamp_[g][p] = epoch_;
          need_[g][p] = 0;
          ++distinct;
        }
        if (bytes > need_[g][p]) {
          need += bytes - need_[g][p];
          need_[g][p] = bytes;
        }
      };
      for (std::uint32_t id : active_) {
        const Req& q = reqs_[id];
        const std::span<const PageId> pages = kv_.page_table(q.slot, g);
        if (!grp.is_decoder()) {
          // Image pages: item k's tokens fill its pages in order.
          std::size_t i = 0;
          for (const MultimodalItem& m : q.items)
            for (std::uint64_t t = 0; t < m.length && i < pages.size(); t += P, ++i)
              if (pages[i] != kNullPage) credit(pages[i], std::min<std::uint64_t>(P, m.length - t) * grp.bytes_per_token());
          continue;
        }
        const std::uint64_t c = kv_.num_computed(q.slot);
        const std::uint64_t T = std::min<std::uint64_t>(c + 1, pages.size() * P);
        if (grp.is_state()) {
          // One state is needed: the page the next token writes (the last one held).
          for (std::size_t i = pages.size(); i-- > 0;)
            if (pages[i] != kNullPage) {
              credit(pages[i], T > 0 && i == pages.size() - 1 ? grp.natural_page_bytes() : 0);
              break;
            }
          for (std::size_t i = 0; i + 1 < pages.size(); ++i)
            if (pages[i] != kNullPage) credit(pages[i], 0);
          continue;
        }
        std::uint64_t from = 0;
        if (grp.kind == LayerKind::kSlidingWindow && T > grp.window) from = T - grp.window;
        if (grp.kind == LayerKind::kChunkedLocal && T > 0) from = (T - 1) / grp.chunk * grp.chunk;
        for (std::size_t i = 0; i < pages.size(); ++i) {
          if (pages[i] == kNullPage) continue;
          const std::uint64_t lo = std::max<std::uint64_t>(i * P, from), hi = std::min<std::uint64_t>((i + 1) * P, T);
          credit(pages[i], hi > lo ? (hi - lo) * grp.bytes_per_token() : 0);
        }
      }
      const SmallPageAllocator& a = kv_.small_pages(g);
      const std::uint64_t page = l.small_page_bytes(g);
      const std::uint64_t held = distinct * page;
      GroupUsage& u = out.groups[g];
      u.name = grp.name;
      u.used = std::min(need, held);
      u.wasted = held - u.used;
      u.cached = (std::uint64_t{a.num_used_small()} - distinct) * page;
      u.group_free = std::uint64_t{a.num_free_small()} * page;
      if (cs.groups[g].used_pages != distinct)
        fail("invariant: group {} has {} used pages in the manager, {} in the request tables", g,
             cs.groups[g].used_pages, distinct);
    }
    out.free = std::uint64_t{kv_.large_pages().num_free()} * l.large_page_bytes();
    out.capacity = std::uint64_t{kv_.large_pages().capacity()} * l.large_page_bytes();
    out.evictions = 0;
    for (const GroupStats& g : cs.groups) out.evictions += g.evicted_pages;
  }

 private:
  struct Req {
    bool active = false;
    RequestId slot = kNoRequest;
    std::uint32_t pos = 0;  // index in active_
    SeqInfo info;
    std::vector<MultimodalItem> items;
    std::vector<std::uint32_t> prompt_ids;  // decoder prompt ids of a token-id trace
  };

  static KVCacheManagerOptions options(const KVLayout& layout, const PolicyOptions& o) {
    KVCacheManagerOptions a;
    const std::uint64_t n = o.memory_bytes / layout.large_page_bytes();
    if (n == 0 || n >= kNullPage)
      fail("memory_bytes = {}: holds {} large pages of {} B (need 1 .. 2^32-2)", o.memory_bytes, n,
           layout.large_page_bytes());
    a.num_large_pages = static_cast<std::uint32_t>(n);
    a.max_requests = o.max_seqs + 1;
    a.prefix_caching = o.prefix_caching;
    return a;
  }

  // Image k of a request: decoder-token span (inlined images shift later text; with
  // cross-attention the span sits at its text offset, pushed past the previous image so
  // items never overlap). Its hash is the shared stream's when the prefix covers it.
  void build_items(Req& q) {
    if (q.info.images == nullptr) return;
    std::uint64_t shift = 0, end = 0;
    for (std::size_t k = 0; k < q.info.images->size(); ++k) {
      const ImageSpan& s = (*q.info.images)[k];
      if (s.length == 0) continue;
      const std::uint64_t off = cross_ ? std::max<std::uint64_t>(s.offset, end) : s.offset + shift;
      const bool shared = q.info.prefix_len > 0 && (cross_ ? s.offset < q.info.prefix_len
                                                           : off + s.length <= q.info.prefix_len);
      const std::uint64_t key = shared ? mix64(mix64(q.info.prefix_id) ^ (0x1a9e000000000000ULL + off))
                                       : mix64(mix64(0x7e57000000000000ULL + q.info.uid) ^ (0x1a9e000000000000ULL + k));
      q.items.push_back(MultimodalItem{BlockHash{key, mix64(key)}, off, s.length});
      shift += s.length;
      end = off + s.length;
    }
  }

  // A token-id trace: text ids in order, image positions (inlined models) get a
  // placeholder id; the image's hash tells images apart.
  void build_prompt_ids(Req& q) {
    const std::vector<std::uint32_t>& text = *q.info.token_ids;
    std::size_t t = 0;
    for (const MultimodalItem& m : q.items) {
      if (cross_) break;
      while (q.prompt_ids.size() < m.offset && t < text.size()) q.prompt_ids.push_back(text[t++]);
      q.prompt_ids.insert(q.prompt_ids.end(), m.length, 0xfffffff0u);
    }
    q.prompt_ids.insert(q.prompt_ids.end(), text.begin() + static_cast<std::ptrdiff_t>(t), text.end());
  }

  // Token id at position t: the trace's, else the shared stream's inside the prefix, else
  // the request's own stream. Even and odd positions carry the two halves of a 64-bit
  // stream key, so two streams collide only if their 64-bit keys do.
  static std::uint32_t token_id(const Req& q, std::uint64_t t) {
    if (t < q.prompt_ids.size()) return q.prompt_ids[t];
    const std::uint64_t key = t < q.info.prefix_len ? mix64(q.info.prefix_id) : mix64(0x7e57000000000000ULL + q.info.uid);
    const auto half = static_cast<std::uint32_t>((t & 1) != 0 ? key >> 32 : key);
    return half + static_cast<std::uint32_t>(t) * 0x9e3779b1u;
  }

  void feed_ids(Req& q, std::uint64_t n) {
    const std::uint64_t have = kv_.num_tokens(q.slot);
    if (n <= have) return;
    ids_.clear();
    for (std::uint64_t t = have; t < n; ++t) ids_.push_back(token_id(q, t));
    kv_.append_tokens(q.slot, ids_);
  }

  Req& req(std::uint32_t id) {
    if (id >= reqs_.size() || !reqs_[id].active) fail("request = {}: not an active request", id);
    return reqs_[id];
  }

  KVCacheManager kv_;
  bool caching_;
  bool cross_;
  std::vector<Req> reqs_;
  std::vector<std::uint32_t> active_;
  std::vector<std::uint32_t> ids_;  // scratch of feed_ids
  // Scratch of stats(), per group and small page: epoch stamp and largest need seen.
  mutable std::uint64_t epoch_ = 0;
  mutable std::vector<std::vector<std::uint64_t>> stamp_;
  mutable std::vector<std::vector<std::uint64_t>> need_;
};

}  // namespace

std::unique_ptr<Policy> make_kvmm_policy(const KVLayout& layout, const PolicyOptions& o) {
  return std::make_unique<KvmmPolicy>(layout, o);
}

}  // namespace kvmm::sim
