// The kvmm policy: kvmm's real two-level allocator (kvmm::PagedKVAllocator: LCM large
// pages, per-group small pages, request-aware placement) behind the simulator's policy
// interface. Sliding-window pages that leave the window are freed through the page
// table (PagedKVAllocator::free_page puts the null page in their entry).
//
// Prefix caching seam: this policy has none yet. KVCacheManager (issue 3) plugs in here
// one call for one call: add_request -> KVCacheManager::add_request(tokens, extras),
// lookup_prefix -> lookup_prefix (returns the hit, pages pinned), allocate -> allocate
// (all groups or none, five-step allocation with eviction), commit -> commit,
// free -> free, stats -> stats(); used/wasted/group_free are read the same way.
#include "sim/policy.hpp"

#include "kvmm/error.hpp"
#include "kvmm/paging/kv_allocator.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace kvmm::sim {

namespace {

class KvmmPolicy final : public Policy {
 public:
  KvmmPolicy(const KVLayout& layout, const PolicyOptions& o)
      : alloc_(layout, options(layout, o)) {
    for (GroupId g = 0; g < layout.num_groups(); ++g) {
      const LayerGroup& grp = layout.group(g);
      if (grp.kind == LayerKind::kSlidingWindow || grp.kind == LayerKind::kChunkedLocal) windowed_.push_back(g);
      if (!grp.is_decoder()) has_encoder_groups_ = true;
    }
  }

  std::string_view name() const override { return "kvmm"; }
  bool prefix_caching() const override { return false; }
  std::string describe() const override {
    const KVLayout& l = alloc_.layout();
    std::string groups;
    for (GroupId g = 0; g < l.num_groups(); ++g)
      groups += fmt::format("{}{} {} B x {}", groups.empty() ? "" : ", ", l.group(g).name, l.small_page_bytes(g),
                            l.small_pages_per_large_page(g));
    return fmt::format(
        "kvmm PagedKVAllocator: {} large pages of {} B (LCM; small pages per large page: {}), request-aware "
        "placement, out-of-window sliding-window pages freed to the null page; prefix caching not wired yet "
        "(KVCacheManager seam)",
        alloc_.large_pages().capacity(), l.large_page_bytes(), groups);
  }

  void add_request(std::uint32_t id, const SeqInfo& info) override {
    if (id >= reqs_.size()) reqs_.resize(std::size_t{id} + 1);
    Req& q = reqs_[id];
    if (q.active) fail("request = {}: already added", id);
    q = Req{};
    q.active = true;
    q.slot = alloc_.add_request();
    q.encoder_tokens = has_encoder_groups_ ? info.encoder_tokens : 0;
    q.first_live.assign(alloc_.layout().num_groups(), 0);
    q.pos = static_cast<std::uint32_t>(active_.size());
    active_.push_back(id);
  }

  std::uint32_t lookup_prefix(std::uint32_t id, std::uint32_t) override {
    req(id);
    return 0;  // no prefix cache until KVCacheManager is wired in (see the seam above)
  }

  bool allocate(std::uint32_t id, std::uint32_t num_computed, std::uint32_t num_new) override {
    Req& q = req(id);
    drop_out_of_window(q, num_computed);
    if (!q.encoder_done && q.encoder_tokens > 0) {
      if (!alloc_.append_encoder_tokens(q.slot, q.encoder_tokens)) return false;
      q.encoder_done = true;
    }
    if (!alloc_.append_tokens(q.slot, num_new)) return false;
    q.tokens = num_computed + num_new;
    return true;
  }

  // Pages that the next position no longer reads leave as soon as their tokens are
  // computed, so they never sit in memory between steps.
  void commit(std::uint32_t id, std::uint32_t num_computed) override { drop_out_of_window(req(id), num_computed); }

  void free(std::uint32_t id) override {
    Req& q = req(id);
    alloc_.free_request(q.slot);
    q.active = false;
    const std::uint32_t last = active_.back();
    active_[q.pos] = last;
    reqs_[last].pos = q.pos;
    active_.pop_back();
  }

  void check_invariants() const override {
    alloc_.check_invariants();
    for (std::uint32_t id : active_) {
      const Req& q = reqs_[id];
      if (!q.active || alloc_.num_tokens(q.slot) != q.tokens)
        fail("invariant: request {} holds {} tokens in the allocator, {} in the policy", id,
             alloc_.num_tokens(q.slot), q.tokens);
      for (GroupId g : windowed_) {
        const auto pages = alloc_.page_tables(g).pages(q.slot);
        for (std::size_t i = 0; i < pages.size(); ++i)
          if ((pages[i] == kNullPage) != (i < q.first_live[g]))
            fail("invariant: request {} group {} entry {} null-ness disagrees with first_live {}", id, g, i,
                 q.first_live[g]);
      }
    }
  }

  void stats(MemoryStats& out) const override {
    const KVLayout& l = alloc_.layout();
    out.groups.resize(l.num_groups());
    for (GroupId g = 0; g < l.num_groups(); ++g) {
      const LayerGroup& grp = l.group(g);
      std::uint64_t need = 0;
      // The next step also writes position `tokens`: needed when its page exists.
      for (std::uint32_t id : active_) {
        const Req& q = reqs_[id];
        const std::uint64_t cap = std::uint64_t{alloc_.page_tables(g).num_pages(q.slot)} * grp.tokens_per_page;
        const std::uint64_t T = grp.is_state() ? q.tokens : std::min<std::uint64_t>(std::uint64_t{q.tokens} + 1, cap);
        need += needed_bytes(grp, T, q.encoder_tokens);
      }
      const SmallPageAllocator& a = alloc_.small_pages(g);
      const std::uint64_t held = std::uint64_t{a.num_used_small()} * l.small_page_bytes(g);
      GroupUsage& u = out.groups[g];
      u.name = grp.name;
      u.used = std::min(need, held);
      u.wasted = held - u.used;
      u.cached = 0;
      u.group_free = std::uint64_t{a.num_free_small()} * l.small_page_bytes(g);
    }
    out.free = std::uint64_t{alloc_.large_pages().num_free()} * l.large_page_bytes();
    out.capacity = std::uint64_t{alloc_.large_pages().capacity()} * l.large_page_bytes();
    out.evictions = 0;
  }

 private:
  struct Req {
    bool active = false;
    bool encoder_done = false;
    RequestId slot = kNoRequest;
    std::uint32_t tokens = 0;
    std::uint32_t encoder_tokens = 0;
    std::uint32_t pos = 0;  // index in active_
    std::vector<std::uint32_t> first_live;
  };

  static PagedKVAllocatorOptions options(const KVLayout& layout, const PolicyOptions& o) {
    PagedKVAllocatorOptions a;
    const std::uint64_t n = o.memory_bytes / layout.large_page_bytes();
    if (n == 0 || n >= kNullPage)
      fail("memory_bytes = {}: holds {} large pages of {} B (need 1 .. 2^32-2)", o.memory_bytes, n,
           layout.large_page_bytes());
    a.num_large_pages = static_cast<std::uint32_t>(n);
    a.max_requests = o.max_seqs + 1;
    return a;
  }

  static std::uint64_t first_needed_page(const LayerGroup& g, std::uint64_t p) {
    if (g.kind == LayerKind::kSlidingWindow) return p + 1 > g.window ? (p + 1 - g.window) / g.tokens_per_page : 0;
    return p / g.chunk * g.chunk / g.tokens_per_page;  // chunked local
  }

  void drop_out_of_window(Req& q, std::uint64_t next_position) {
    for (GroupId g : windowed_) {
      const LayerGroup& grp = alloc_.layout().group(g);
      const std::uint64_t first = std::min<std::uint64_t>(first_needed_page(grp, next_position),
                                                          alloc_.page_tables(g).num_pages(q.slot));
      for (std::uint64_t i = q.first_live[g]; i < first; ++i)
        alloc_.free_page(q.slot, g, static_cast<std::uint32_t>(i));
      q.first_live[g] = static_cast<std::uint32_t>(std::max<std::uint64_t>(q.first_live[g], first));
    }
  }

  Req& req(std::uint32_t id) {
    if (id >= reqs_.size() || !reqs_[id].active) fail("request = {}: not an active request", id);
    return reqs_[id];
  }

  PagedKVAllocator alloc_;
  std::vector<GroupId> windowed_;
  bool has_encoder_groups_ = false;
  std::vector<Req> reqs_;
  std::vector<std::uint32_t> active_;
};

}  // namespace

std::unique_ptr<Policy> make_kvmm_policy(const KVLayout& layout, const PolicyOptions& o) {
  return std::make_unique<KvmmPolicy>(layout, o);
}

}  // namespace kvmm::sim
