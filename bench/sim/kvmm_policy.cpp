// The kvmm policy: kvmm's real KVCacheManager (two-level LCM paging, request-aware
// placement, per-layer-kind prefix caching: full attention, sliding window, chunked local,
// Mamba checkpoints, images of cross-attention / vision groups) behind the simulator's
// policy interface, one manager call per policy call. Requests' token ids and image items
// come from sim/synthetic_ids.hpp (synthetic where the workload has no token ids).
#include "kvmm/spec/layer_slicing.hpp"
#include "sim/policy.hpp"
#include "sim/scheduler.hpp"
#include "sim/speculative.hpp"
#include "sim/synthetic_ids.hpp"

#include "kvmm/error.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/testing/manager_inspector.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <span>

namespace kvmm::sim {

namespace {

// Slots of the manager's miss-reason key tables (2 x 32 B each: 4 MB).
constexpr std::uint32_t kMissReasonSlots = 1u << 16;

class KvmmPolicy final : public Policy {
 public:
  // vllm_eagle: vLLM's rules for speculative decoding (make_vllm_eagle_policy).
  KvmmPolicy(const KVLayout& layout, const PolicyOptions& o, bool vllm_eagle = false)
      : plan_(slice_layers(vllm_eagle ? without_draft_roles(layout) : layout, slice_width(layout, o.slice_layers))),
        kv_(plan_, options(layout, plan_, o)),
        vllm_eagle_(vllm_eagle),
        block_tokens_(vllm_block_tokens(layout)),
        tag_states_(o.tag_states),
        caching_(o.prefix_caching),
        hit_unit_(o.prefix_caching && o.hit_unit > 0),
        cross_(shape_of(layout).cross_attention),
        hinted_(o.boundaries == BoundaryMode::kHinted || o.boundaries == BoundaryMode::kBoth) {
    const std::uint32_t large = kv_.large_pages().capacity();
    const KVLayout& l = kv_.layout();
    extra_.assign(l.num_groups(), 0);
    extra_need_.assign(l.num_groups(), 0);
    stamp_.resize(l.num_groups());
    need_.resize(l.num_groups());
    for (GroupId g = 0; g < l.num_groups(); ++g) {
      stamp_[g].assign(std::size_t{large} * l.small_pages_per_large_page(g), 0);
      need_[g].assign(stamp_[g].size(), 0);
    }
  }

  std::string_view name() const override { return vllm_eagle_ ? "vllm-eagle" : "kvmm"; }
  bool prefix_caching() const override { return caching_; }
  std::string describe() const override {
    const KVLayout& l = kv_.layout();
    std::string groups;
    for (GroupId g = 0; g < l.num_groups(); ++g)
      groups += fmt::format("{}{} {} B x {}", groups.empty() ? "" : ", ", l.group(g).name, l.small_page_bytes(g),
                            l.small_pages_per_large_page(g));
    return fmt::format(
        "{}kvmm KVCacheManager: {} large pages of {} B (LCM; small pages per large page: {}), request-aware "
        "placement, pages out of each layer kind's need released at commit; prefix caching {} (per-layer-kind "
        "hit rules, images cached by image hash, LRU small/large-page eviction)",
        vllm_eagle_ ? vllm_eagle_description() : "", kv_.large_pages().capacity(), l.large_page_bytes(), groups,
        caching_ ? "on" : "off");
  }

  std::vector<MissCount> miss_reasons() const override {
    std::vector<MissCount> out;
    if (!caching_) return out;
    const ManagerCounters c = kv_.counters();
    for (std::size_t k = 0; k < kNumMissReasons; ++k)
      out.push_back({std::string(to_string(static_cast<MissReason>(k))), c.misses.lookups[k], c.misses.tokens[k]});
    return out;
  }

  std::string retention_line() const override {
    if (!caching_) return {};
    const ManagerCounters c = kv_.counters();
    const double pool =
        static_cast<double>(kv_.large_pages().capacity()) * static_cast<double>(kv_.layout().large_page_bytes());
    return fmt::format(
        "retention: held {:.2f} GB mean, {:.2f} GB peak ({:.1f}% of the pool); {} held pages released under pressure",
        held_steps_ ? static_cast<double>(held_sum_) / static_cast<double>(held_steps_) / 1e9 : 0.0,
        static_cast<double>(held_peak_) / 1e9, 100.0 * static_cast<double>(held_peak_) / pool,
        c.retention_released_pages);
  }

  void begin_step() override {
    kv_.begin_step();
    if (caching_) {  // reporting only (retention_line)
      const std::uint64_t held = kv_.counters().retention_bytes;
      held_sum_ += held;
      held_peak_ = std::max(held_peak_, held);
      ++held_steps_;
    }
  }

  void add_request(std::uint32_t id, const SeqInfo& info) override {
    if (id >= reqs_.size()) reqs_.resize(std::size_t{id} + 1);
    Req& q = reqs_[id];
    if (q.active) fail("request = {}: already added", id);
    if (q.parked) {
      // Preempted or refused before: the manager kept its ids and hashes (reset).
      q.parked = false;
      --parked_;
    } else {
      q.info = info;
      q.items.clear();
      q.prompt_ids.clear();
      synthetic_items(q.info, cross_, q.items);
      if (caching_ && info.token_ids != nullptr && !info.token_ids->empty())
        trace_prompt_ids(*info.token_ids, q.items, cross_, q.prompt_ids);
      // With caching the manager gets the ids at lookup_prefix, as many as the scheduler
      // knows, and hashes them from ids_ (no copy kept); later ones come with commit.
      q.handle = kNoRequest;
      if (!caching_) register_request(q, {});
    }
    q.lo.assign(kv_.layout().num_groups(), 0);
    q.tagged.assign(kv_.layout().num_groups(), 0);
    q.shared_counted = false;
    q.active = true;
    q.pos = static_cast<std::uint32_t>(active_.size());
    active_.push_back(id);
  }

  std::uint32_t lookup_prefix(std::uint32_t id, std::uint32_t max_hit) override {
    Req& q = req(id);
    // The manager looks up at most (token ids known - 1) tokens.
    const std::uint64_t known = std::uint64_t{max_hit} + 1;
    if (q.handle == kNoRequest) {
      register_request(q, synthetic_ids(q.prompt_ids, q.info, 0, known, ids_));
    } else if (caching_) {
      feed_ids(q, known);
    }
    // Pure: the hit's pages enter the rows at the first allocate.
    auto hit = static_cast<std::uint32_t>(kv_.lookup_prefix(q.handle));
    if (vllm_eagle_) hit = vllm_eagle_hit(kv_, q.handle, hit, block_tokens_);  // the last block dropped
    // Hit pages shared with another running request are counted at the first successful
    // allocate (count_shared): a failed admission is freed at once and never counts.
    q.shared_counted = false;
    return hit;
  }

  bool allocate(std::uint32_t id, std::uint32_t num_computed, std::uint32_t num_new) override {
    Req& q = req(id);
    if (q.handle == kNoRequest) register_request(q, {});  // no lookup_prefix first
    if (kv_.num_computed(q.handle) != num_computed)
      fail("num_computed = {}: request {} has {} computed tokens in the manager", num_computed, id,
           kv_.num_computed(q.handle));
    if (!kv_.allocate(q.handle, num_new)) return false;
    for (GroupId g = 0; g < kv_.layout().num_groups(); ++g) advance_lo(q, g);
    if (!q.shared_counted) count_shared(q);
    return true;
  }

  bool speculative() const override { return true; }

  bool allocate_lookahead(std::uint32_t id, std::uint32_t num_computed, std::uint32_t num_new,
                          std::uint32_t lookahead) override {
    Req& q = req(id);
    if (q.handle == kNoRequest) register_request(q, {});
    if (kv_.num_computed(q.handle) != num_computed)
      fail("num_computed = {}: request {} has {} computed tokens in the manager", num_computed, id,
           kv_.num_computed(q.handle));
    if (!kv_.allocate(q.handle, num_new, lookahead)) return false;
    for (GroupId g = 0; g < kv_.layout().num_groups(); ++g) advance_lo(q, g);
    if (!q.shared_counted) count_shared(q);
    return true;
  }

  std::uint64_t draft_recompute_tokens(std::uint32_t id) const override {
    if (id >= reqs_.size() || !reqs_[id].active || reqs_[id].handle == kNoRequest) return 0;
    return kvmm::sim::draft_recompute_tokens(kv_, reqs_[id].handle);
  }

  // The ids of the computed tokens (prompt and sampled) go in first: commit hashes full pages.
  void commit(std::uint32_t id, std::uint32_t num_computed) override {
    Req& q = req(id);
    if (caching_) feed_ids(q, num_computed);
    const KVLayout& l = kv_.layout();
    for (GroupId g = 0; g < l.num_groups(); ++g) {
      if (extra_[g] == 0) continue;
      // Shared image pages this commit releases stay held by their other holders.
      const std::span<const PageId> pages = kv_.page_table(q.handle, g);
      if (l.group(g).kind == LayerKind::kVisionEmbedding) {
        std::size_t i = 0;
        for (const MultimodalItem& m : q.items) {
          const std::uint64_t n = (m.length + l.group(g).tokens_per_page - 1) / l.group(g).tokens_per_page;
          if (m.offset + m.length <= num_computed)
            for (std::uint64_t j = i; j < i + n && j < pages.size(); ++j) unshare(q, g, pages, j);
          i += n;
        }
      }
    }
    kv_.commit(q.handle, num_computed);
    for (GroupId g = 0; g < l.num_groups(); ++g) advance_lo(q, g);
    if (tag_states_ && caching_) tag_verified_states(kv_, q.handle, q.tagged, num_computed);
  }

  void free(std::uint32_t id) override {
    Req& q = release(id);
    if (q.handle != kNoRequest) kv_.free(q.handle);
  }

  // The request comes back with the same info: its manager request keeps the token ids and
  // block hashes (KVCacheManager::reset), so its next lookup hashes nothing again.
  void preempt(std::uint32_t id) override {
    if (!caching_) return free(id);
    Req& q = release(id);
    if (q.handle == kNoRequest) return;  // nothing registered yet: comes back as new
    kv_.reset(q.handle);
    q.parked = true;
    ++parked_;
  }

  void check_invariants() const override {
    kv_.check_invariants();
    std::uint32_t registered = parked_;
    for (std::uint32_t id : active_) registered += reqs_[id].handle != kNoRequest;
    if (kv_.num_active() != registered)
      fail("invariant: manager has {} active requests, policy {} (with {} parked)", kv_.num_active(), registered,
           parked_);
    for (std::uint32_t id : active_)
      if (!reqs_[id].active || (reqs_[id].handle != kNoRequest && !kv_.is_active(reqs_[id].handle)))
        fail("invariant: request {} active in the policy, not in the manager", id);
    // The closed form of stats() against a page-by-page recount and the manager's counts.
    const CacheStats cs = kv_.stats();
    for (GroupId g = 0; g < kv_.layout().num_groups(); ++g) {
      const Usage exact = exact_usage(g), fast = usage(g);
      if (fast.distinct != exact.distinct || exact.distinct != cs.groups[g].used_pages || fast.need != exact.need)
        fail("invariant: group {} used pages {} (closed form) / {} (recount) / {} (manager), needed bytes {} / {}", g,
             fast.distinct, exact.distinct, cs.groups[g].used_pages, fast.need, exact.need);
      for (std::uint32_t id : active_) {
        if (reqs_[id].handle == kNoRequest) continue;
        const std::span<const PageId> pages = kv_.page_table(reqs_[id].handle, g);
        for (std::size_t i = 0; i < pages.size() && kv_.layout().group(g).is_decoder(); ++i)
          if ((pages[i] == kNullPage) != (i < reqs_[id].lo[g]))
            fail("invariant: request {} group {} entry {} null-ness disagrees with lo {}", id, g, i, reqs_[id].lo[g]);
      }
    }
  }

  // Used/wasted by the simulator's definition (needed = what the next token reads and the
  // slot it writes) over distinct pages: a page shared after a hit counts once. Closed
  // form, O(requests x (groups + images)).
  void stats(MemoryStats& out) const override {
    const KVLayout& l = kv_.layout();
    out.groups.resize(l.num_groups());
    for (GroupId g = 0; g < l.num_groups(); ++g) {
      const Usage u = usage(g);
      const SmallPageAllocator& a = kv_.small_pages(g);
      const std::uint64_t page = l.small_page_bytes(g);
      const std::uint64_t held = u.distinct * page;
      GroupUsage& o = out.groups[g];
      o.name = l.group(g).name;
      o.used = std::min(u.need, held);
      o.wasted = held - o.used;
      o.cached = (std::uint64_t{a.num_used_small()} - u.distinct) * page;
      o.group_free = std::uint64_t{a.num_free_small()} * page;
    }
    out.free = std::uint64_t{kv_.large_pages().num_free()} * l.large_page_bytes();
    out.capacity = std::uint64_t{kv_.large_pages().capacity()} * l.large_page_bytes();
    out.evictions = 0;
    for (GroupId g = 0; g < l.num_groups(); ++g) out.evictions += kv_.page_counts(g).evicted;
  }

 private:
  struct Req {
    bool active = false;
    bool shared_counted = false;    // its shared hit pages are in extra_ (count_shared)
    bool parked = false;            // preempted: the manager request is kept, reset
    RequestId handle = kNoRequest;  // the manager's (kNoRequest: not registered yet)
    std::uint32_t pos = 0;          // index in active_
    SeqInfo info;
    std::vector<MultimodalItem> items;
    std::vector<std::uint32_t> prompt_ids;  // decoder prompt ids of a token-id trace
    std::vector<std::uint64_t> lo;          // per decoder group: first non-null page
    std::vector<std::uint64_t> bounds;      // RequestExtras::cache_boundaries (hinted mode)
    std::vector<std::uint64_t> tagged;      // per group: the last state count tagged
  };

  struct Usage {
    std::uint64_t distinct = 0;  // pages held by running requests, each counted once
    std::uint64_t need = 0;      // bytes of them the next step needs
  };

  // Decoder group g: each request holds pages [lo, size) (the policies release from the
  // front); shared pages are full prefix pages (hits), needed whole by every holder, so
  // each duplicate hold (holds - distinct pages, the manager's count) takes one page of
  // need back (a Mamba page: one state).
  // Image groups: every image's pages from the first allocation on, but a consumed image's
  // vision-embedding pages are released.
  Usage usage(GroupId g) const {
    const LayerGroup& grp = kv_.layout().group(g);
    const std::uint64_t P = grp.tokens_per_page, bpt = grp.bytes_per_token();
    Usage u;
    std::uint64_t dup = 0;  // decoder groups: holds of pages another running request holds too
    if (grp.is_decoder()) {
      for (std::uint32_t id : active_) {
        if (reqs_[id].handle == kNoRequest) continue;  // added, not looked up yet: holds nothing
        const std::uint64_t n = kv_.page_table(reqs_[id].handle, g).size();
        dup += n - std::min<std::uint64_t>(n, reqs_[id].lo[g]) +
               kvmm::testing::ManagerInspector(kv_).num_held_pages(reqs_[id].handle, g);
      }
      dup += sources(g);  // partial-hit copy sources (hit_unit): holds outside the rows
      dup -= kv_.page_counts(g).used;
      u.distinct += sources(g);
      u.need += sources(g) * P * bpt;
    }
    for (std::uint32_t id : active_) {
      const Req& q = reqs_[id];
      if (q.handle == kNoRequest) continue;
      if (!grp.is_decoder()) {
        const std::uint64_t c = kv_.num_computed(q.handle);
        for (const MultimodalItem& m : q.items) {
          if (grp.kind == LayerKind::kVisionEmbedding && m.offset + m.length <= c) continue;
          u.distinct += (m.length + P - 1) / P;
          u.need += m.length * bpt;
        }
        continue;
      }
      // Pages held for a cache boundary (out of the table): needed whole, as stats() counts.
      const std::uint64_t held = kvmm::testing::ManagerInspector(kv_).num_held_pages(q.handle, g);
      u.distinct += held;
      u.need += held * (grp.is_state() ? grp.natural_page_bytes() : P * bpt);
      // A held page another request maps too (a later hit at the boundary): its need is the
      // largest over holders, which the closed form does not track; rare, so recount.
      if (held > 0 && dup > 0)
        for (const auto& [hg, hp] : kvmm::testing::ManagerInspector(kv_).held_pages(q.handle))
          if (hg == g && kvmm::testing::ManagerInspector(kv_).ref_count(g, hp) > 1) {
            front_.clear();
            return exact_usage(g);
          }
      const std::uint64_t n = kv_.page_table(q.handle, g).size();
      if (n <= q.lo[g]) continue;
      u.distinct += n - q.lo[g];
      const std::uint64_t T = std::min<std::uint64_t>(kv_.num_computed(q.handle) + 1, n * P);
      if (grp.is_state()) {
        u.need += grp.natural_page_bytes();
        continue;
      }
      std::uint64_t from = q.lo[g] * P;
      if (grp.kind == LayerKind::kSlidingWindow && T > grp.window) from = std::max(from, T - grp.window);
      if (grp.kind == LayerKind::kChunkedLocal) from = std::max(from, (T - 1) / grp.chunk * grp.chunk);
      if (T > from) u.need += (T - from) * bpt;
      if (dup == 0) continue;
      // Held pages before the window's front are needed partly or not at all by q; if
      // shared, the duplicate took a whole page back for q: corrected below.
      const std::span<const PageId> pages = kv_.page_table(q.handle, g);
      for (std::uint64_t i = q.lo[g]; i < n && i * P < from; ++i)
        if (pages[i] != kNullPage && kvmm::testing::ManagerInspector(kv_).ref_count(g, pages[i]) > 1)
          front_.push_back({pages[i], (i + 1) * P > from ? (std::min((i + 1) * P, T) - from) * bpt : 0});
    }
    if (grp.is_decoder()) {
      u.distinct -= dup;
      u.need -= dup * (grp.is_state() ? grp.natural_page_bytes() : P * bpt);
    } else {
      u.distinct -= extra_[g];
      u.need -= extra_need_[g];
    }
    // A shared page's need is the largest over its holders: holders not listed here need
    // it whole; if all are listed, the largest listed need stays counted.
    std::sort(front_.begin(), front_.end());
    for (std::size_t a = 0; a < front_.size();) {
      std::size_t b = a;
      std::uint64_t short_of_full = 0, largest = 0;
      for (; b < front_.size() && front_[b].first == front_[a].first; ++b) {
        short_of_full += P * bpt - front_[b].second;
        largest = std::max(largest, front_[b].second);
      }
      u.need += short_of_full;
      if (kvmm::testing::ManagerInspector(kv_).ref_count(g, front_[a].first) == b - a) u.need -= P * bpt - largest;
      a = b;
    }
    front_.clear();
    return u;
  }

  // Need of page i of image group g when shared: the tokens of its image it holds.
  std::uint64_t shared_need(const Req& q, GroupId g, std::uint64_t i) const {
    const LayerGroup& grp = kv_.layout().group(g);
    const std::uint64_t P = grp.tokens_per_page;
    for (const MultimodalItem& m : q.items) {
      const std::uint64_t n = (m.length + P - 1) / P;
      if (i < n) return std::min<std::uint64_t>(P, m.length - i * P) * grp.bytes_per_token();
      i -= n;
    }
    return 0;
  }

  // The hit's image pages another running request holds are shared: counted once in
  // stats() (decoder groups need no count: see usage()). Allocation does not change the
  // reference counts of the hit's pages.
  void count_shared(Req& q) {
    for (GroupId g = 0; g < kv_.layout().num_groups(); ++g) {
      if (kv_.layout().group(g).is_decoder()) continue;
      const std::span<const PageId> pages = kv_.page_table(q.handle, g);
      for (std::size_t i = 0; i < pages.size(); ++i)
        if (pages[i] != kNullPage && kvmm::testing::ManagerInspector(kv_).ref_count(g, pages[i]) > 1) {
          ++extra_[g];
          extra_need_[g] += shared_need(q, g, i);
        }
    }
    q.shared_counted = true;
  }

  // Page i of q is about to be released: if others hold it too, it stops being a duplicate.
  void unshare(const Req& q, GroupId g, std::span<const PageId> pages, std::uint64_t i) {
    if (pages[i] == kNullPage || kvmm::testing::ManagerInspector(kv_).ref_count(g, pages[i]) <= 1) return;
    --extra_[g];
    extra_need_[g] -= shared_need(q, g, i);
  }

  // Page by page: a page's need is the largest over its holders. O(pages held).
  // Partial-hit copy sources of group g the manager holds this step (hit_unit; 0 without).
  std::uint64_t sources(GroupId g) const {
    if (!hit_unit_) return 0;
    std::uint64_t n = 0;
    for (const auto& [sg, sp] : kvmm::testing::ManagerInspector(kv_).partial_sources()) n += sg == g;
    return n;
  }

  Usage exact_usage(GroupId g) const {
    const LayerGroup& grp = kv_.layout().group(g);
    const std::uint64_t P = grp.tokens_per_page, bpt = grp.bytes_per_token();
    ++epoch_;
    Usage u;
    auto credit = [&](PageId p, std::uint64_t bytes) {
      if (stamp_[g][p] != epoch_) {
        stamp_[g][p] = epoch_;
        need_[g][p] = 0;
        ++u.distinct;
      }
      if (bytes > need_[g][p]) {
        u.need += bytes - need_[g][p];
        need_[g][p] = bytes;
      }
    };
    if (grp.is_decoder())  // partial-hit copy sources (hit_unit), held whole until the next step
      for (const auto& [sg, sp] : kvmm::testing::ManagerInspector(kv_).partial_sources())
        if (sg == g) credit(sp, P * bpt);
    for (std::uint32_t id : active_) {
      const Req& q = reqs_[id];
      if (q.handle == kNoRequest) continue;
      const std::span<const PageId> pages = kv_.page_table(q.handle, g);
      if (kvmm::testing::ManagerInspector(kv_).num_held_pages(q.handle, g) > 0)
        for (const auto& [hg, hp] : kvmm::testing::ManagerInspector(kv_).held_pages(q.handle))
          if (hg == g) credit(hp, grp.is_state() ? grp.natural_page_bytes() : P * bpt);
      if (!grp.is_decoder()) {
        std::size_t i = 0;  // item k's tokens fill its pages in order
        for (const MultimodalItem& m : q.items)
          for (std::uint64_t t = 0; t < m.length && i < pages.size(); t += P, ++i)
            if (pages[i] != kNullPage) credit(pages[i], std::min<std::uint64_t>(P, m.length - t) * bpt);
        continue;
      }
      const std::uint64_t T = std::min<std::uint64_t>(kv_.num_computed(q.handle) + 1, pages.size() * P);
      std::uint64_t from = 0;
      if (grp.kind == LayerKind::kSlidingWindow && T > grp.window) from = T - grp.window;
      if (grp.kind == LayerKind::kChunkedLocal && T > 0) from = (T - 1) / grp.chunk * grp.chunk;
      for (std::size_t i = 0; i < pages.size(); ++i) {
        if (pages[i] == kNullPage) continue;
        if (grp.is_state()) {  // one state: the page the next token writes
          credit(pages[i], i + 1 == pages.size() ? grp.natural_page_bytes() : 0);
          continue;
        }
        const std::uint64_t lo = std::max<std::uint64_t>(i * P, from), hi = std::min<std::uint64_t>((i + 1) * P, T);
        credit(pages[i], hi > lo ? (hi - lo) * bpt : 0);
      }
    }
    return u;
  }

  void advance_lo(Req& q, GroupId g) {
    if (!kv_.layout().group(g).is_decoder()) return;
    const std::span<const PageId> pages = kv_.page_table(q.handle, g);
    while (q.lo[g] < pages.size() && pages[q.lo[g]] == kNullPage) ++q.lo[g];
  }

  // layout: the model's (its draft roles decide packing's default); paged: the layout the
  // manager pages (sliced, draft roles stripped for vllm-eagle), whose large pages fill memory.
  static KVCacheManagerOptions options(const KVLayout& layout, const KVLayout& paged, const PolicyOptions& o) {
    KVCacheManagerOptions a;
    const std::uint64_t n = o.memory_bytes / paged.large_page_bytes();
    if (n == 0 || n >= kNullPage)
      fail("memory_bytes = {}: holds {} large pages of {} B (need 1 .. 2^32-2)", o.memory_bytes, n,
           paged.large_page_bytes());
    a.num_large_pages = static_cast<std::uint32_t>(n);
    a.max_requests = o.max_seqs + 1;
    a.prefix_caching = o.prefix_caching;
    // none and hinted: no retention without hints (the manager's defaults learn points and
    // hold prompt tails).
    const bool learn = o.boundaries == BoundaryMode::kLearned || o.boundaries == BoundaryMode::kBoth;
    a.learned_boundaries = learn ? kLearnedBoundaryEntries : 0;
    a.prompt_tail_tokens = learn ? KVCacheManagerOptions{}.prompt_tail_tokens : 0;
    a.learned_tail_tokens = learn ? o.learned_tail : 0;
    a.retention_budget = o.retention_budget;
    a.retention_release = o.retention_release;
    a.miss_reasons = kMissReasonSlots;  // reporting only: no decision reads it
    a.hit_unit = o.hit_unit;
    // Unset: the manager's default for the model's layout, also for vllm-eagle, whose
    // manager sees it without draft roles: both run one step order, so the comparison
    // isolates the EAGLE rule.
    a.pack_small_pages = o.pack_small_pages;
    a.pack_small_pages = a.packs_small_pages(layout);
    a.sparse_state_checkpoints = o.sparse_state_checkpoints;
    return a;
  }

  // Appends the ids of positions [known, n) to the request's manager request.
  void feed_ids(Req& q, std::uint64_t n) {
    const std::uint64_t have = kv_.num_tokens(q.handle);
    if (n <= have) return;
    kv_.append_tokens(q.handle, synthetic_ids(q.prompt_ids, q.info, have, n, ids_));
  }

  void register_request(Req& q, std::span<const std::uint32_t> ids) {
    RequestExtras ex;
    ex.items = q.items;
    // The ids arrive in chunks; the prompt holds every image span.
    if (!q.items.empty())
      ex.prompt_tokens = std::max<std::uint64_t>(ids.size(), q.items.back().offset + q.items.back().length);
    // Boundaries only with the prompt's ids (a lookup first): they name prefixes to hit.
    q.bounds.clear();
    if (hinted_ && caching_ && !ids.empty())
      q.bounds = cache_boundaries_for(q.info, std::max<std::uint64_t>(ids.size(), ex.prompt_tokens));
    ex.cache_boundaries = q.bounds;
    q.handle = kv_.add_request(ids, ex);
  }

  // Takes the request out of the running set, its shared image pages out of extra_.
  Req& release(std::uint32_t id) {
    Req& q = req(id);
    for (GroupId g = 0; g < kv_.layout().num_groups() && q.shared_counted; ++g)
      if (extra_[g] > 0) {
        const std::span<const PageId> pages = kv_.page_table(q.handle, g);
        for (std::size_t i = 0; i < pages.size(); ++i) unshare(q, g, pages, i);
      }
    q.active = false;
    const std::uint32_t last = active_.back();
    active_[q.pos] = last;
    reqs_[last].pos = q.pos;
    active_.pop_back();
    return q;
  }

  Req& req(std::uint32_t id) {
    if (id >= reqs_.size() || !reqs_[id].active) fail("request = {}: not an active request", id);
    return reqs_[id];
  }

  KVLayout plan_;  // the layout the manager pages (sliced: PolicyOptions::slice_layers)
  KVCacheManager kv_;
  bool vllm_eagle_;
  std::uint64_t block_tokens_;  // vLLM's block in tokens (vllm_block_tokens)
  bool tag_states_;
  bool caching_;
  bool hit_unit_;  // partial-hit copy sources may be held (KVCacheManagerOptions::hit_unit)
  bool cross_;
  bool hinted_;  // requests pass SimRequest::boundaries to the manager
  std::vector<Req> reqs_;
  std::vector<std::uint32_t> active_;
  std::uint32_t parked_ = 0;               // requests preempted, their manager requests kept
  std::vector<std::uint32_t> ids_;         // scratch: ids handed to the manager
  std::vector<std::uint64_t> extra_;       // per image group: duplicate holds of shared pages
  std::vector<std::uint64_t> extra_need_;  // per group: their needed bytes
  // Scratch of stats(), per group and small page: epoch stamp and largest need seen.
  mutable std::uint64_t epoch_ = 0;
  mutable std::vector<std::vector<std::uint64_t>> stamp_;
  mutable std::vector<std::vector<std::uint64_t>> need_;
  mutable std::vector<std::pair<PageId, std::uint64_t>> front_;  // scratch of usage()
  std::uint64_t held_sum_ = 0, held_peak_ = 0, held_steps_ = 0;  // retention_bytes per step (retention_line)
};

}  // namespace

std::vector<std::uint64_t> cache_boundaries_for(const SeqInfo& info, std::uint64_t prompt_tokens) {
  std::vector<std::uint64_t> out;
  if (info.boundaries == nullptr) return out;
  for (const std::uint32_t b : *info.boundaries)
    if (b > 0 && b <= prompt_tokens && (out.empty() || b > out.back())) out.push_back(b);
  if (out.size() > kMaxCacheBoundaries)
    out.erase(out.begin(), out.end() - static_cast<std::ptrdiff_t>(kMaxCacheBoundaries));
  return out;
}

std::unique_ptr<Policy> make_kvmm_policy(const KVLayout& layout, const PolicyOptions& o) {
  return std::make_unique<KvmmPolicy>(layout, o);
}

std::unique_ptr<Policy> make_vllm_eagle_policy(const KVLayout& layout, const PolicyOptions& o) {
  return std::make_unique<KvmmPolicy>(layout, o, true);
}

}  // namespace kvmm::sim
