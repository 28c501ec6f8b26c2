// Admission's calls: see admission.hpp.
#include "manager_core.hpp"

#include "kvmm/error.hpp"
#include "prefetch.hpp"

#include <algorithm>

namespace kvmm::detail {

AllocateResult Admission::allocate(RequestId r, std::uint32_t num_new_tokens, std::uint32_t lookahead) {
  return allocate_at(r, m_.running(r), num_new_tokens, lookahead);
}

std::uint64_t Admission::lookup_prefix(RequestId r, std::uint64_t cap) {
  const Row s = m_.running(r);
  Request& q = m_.reqs_[s];
  if (q.phase != Phase::kRegistered)
    fail("request = {}: lookup_prefix must come once, before the first allocate (or after reset)", r);
  q.to(Phase::kLookedUp);
  ++m_.lookups_;
  const std::uint64_t num_tokens = q.ids.num_tokens();
  m_.lookup_tokens_ += num_tokens;
  q.hit.lookup_tokens = num_tokens;
  // At most prompt - 1 tokens (the last one is computed for its logits), and the cap.
  q.hit.limit = m_.options_.prefix_caching && num_tokens > 1 ? std::min(num_tokens - 1, cap) : 0;
  if (q.hit.limit == 0) {
    if (m_.misses.on()) [[unlikely]]
      m_.misses.explain(q, 0, 0);
    return 0;
  }
  const std::uint64_t limit = q.hit.limit;
  // add_request hashed the prompt's full pages; only ids appended since need hashing.
  for (std::uint32_t c = 0; c < m_.class_tokens_.size(); ++c) q.ids.ensure(c, limit / m_.class_tokens_[c]);
  if (m_.drafts.keeps_ids())
    for (GroupId g = 0; g < m_.groups_.size(); ++g) m_.drafts.ensure_keys(q, g, limit / m_.groups_[g].P);
  std::uint64_t p = m_.lookup_.longest_hit(r, q, limit);
  for (GroupId g = 0; g < m_.groups_.size(); ++g)
    if (m_.groups_[g].draft) q.drafts.hit[g] = m_.lookup_.draft_hit(g);
  if (m_.misses.on()) [[unlikely]]
    m_.misses.explain(q, limit, p);  // after the drafts' hits: it reports them
  m_.lookup_.count_hit(q, p);
  q.hit.branch = m_.lookup_.whole_prefix_hit(limit);
  if (m_.partial_.on()) [[unlikely]]
    p += inside_page(q, p, limit);
  // The request continues from p; allocate pins the pages the hit needs.
  q.hit.tokens = p;
  q.hit.pending = p > 0;
  const std::span<const MultimodalItem> items = q.ids.items();
  // Embedding pages of images the hit consumed entirely are never needed.
  while (q.images.consumed < items.size() && items[q.images.consumed].offset + items[q.images.consumed].length <= p)
    ++q.images.consumed;
  q.progress.computed = q.progress.allocated = p;
  m_.hit_tokens_ += p;
  return p;
}

// How far past p, a page boundary every group accepted, the hit goes inside page p / P
// (hit_unit): the longest unit prefix of q's tokens there that every group holds cached
// (a cached page with those first tokens after the same chain). Records each group's
// source page in q.hit; a group's page matching more than the shortest serves it too.
std::uint64_t Admission::inside_page(Request& q, std::uint64_t p, std::uint64_t limit) {
  q.hit.partial = 0;
  const std::uint64_t P = m_.groups_[0].P, u = m_.partial_.unit();
  if (p < P || p % P != 0 || p + u > limit) return 0;
  q.hit.partial_src.assign(m_.groups_.size(), kNullPage);
  q.hit.partial_full.resize(m_.groups_.size());
  const BlockHash parent = q.ids.chain(m_.groups_[0].hash_class)[p / P - 1];
  std::uint64_t e = std::min<std::uint64_t>(P - 1, limit - p) / u * u;
  for (GroupId g = 0; g < m_.groups_.size() && e > 0; ++g)
    e = std::min(
        e, m_.partial_.longest(m_.groups_, g, parent, q.ids, p, e, &q.hit.partial_src[g], &q.hit.partial_full[g]));
  if (e == 0) std::fill(q.hit.partial_src.begin(), q.hit.partial_src.end(), kNullPage);
  q.hit.partial = e;
  return e;
}

// need_[g]: pages of group g the step needs (a copy-on-write copy first where cow_[g]).
// Whether any page is needed.
bool Admission::compute_need(Row s, const Request& q, std::uint32_t num_new_tokens, std::uint64_t target) {
  bool any = false;
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    const Group& grp = m_.groups_[g];
    m_.need_[g] = 0;
    m_.cow_[g] = 0;
    if (grp.decoder) {
      if (target > q.progress.allocated) {
        // A pending hit will bring its pages (below the policy's first required one: null).
        const std::uint64_t have =
            q.hit.pending ? m_.lookup_.group_hit(q, g, q.hit.tokens) / grp.P : grp.table.num_pages(s);
        const std::uint64_t want = m_.pages_for(target, grp.P);
        m_.need_[g] = want > have ? want - have : 0;
      }
      m_.need_[g] += q.tier.fill[g];  // fresh pages for a tier hit's loads (admit_tier listed them)
      if (num_new_tokens > 0 && grp.successors > 0) {
        m_.cow_[g] = static_cast<std::uint8_t>(m_.drafts.shared_open_pages(s, q, g));  // written below computed
      } else if (num_new_tokens > 0 && q.progress.computed % grp.P != 0) {
        const std::uint64_t idx = q.progress.computed / grp.P;
        const std::span<const PageId> pages = grp.table.pages(s);
        if (idx < pages.size() && pages[idx] != kNullPage && grp.pg[pages[idx]].ref > 1) m_.cow_[g] = 1;
      }
    } else if (!q.images.ready && !q.ids.items().empty()) {
      m_.need_[g] = m_.images.encoder_misses(s, q, g);
    }
    m_.need_[g] += m_.cow_[g];
    any |= m_.need_[g] > 0;
  }
  return any;
}

// Takes need_[g] pages of every group (feasible() said they can be had).
void Admission::take_pages(Row s, Request& q) {
  const std::span<const MultimodalItem> items = q.ids.items();
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    Group& grp = m_.groups_[g];
    if (grp.decoder) {
      if (q.tier.fill[g] > 0) m_.tier.fill_tier_pages(s, q, g);
      if (m_.cow_[g] && grp.successors > 0) {
        m_.drafts.copy_open_pages(s, q, g);
        m_.need_[g] -= m_.cow_[g];
      } else if (m_.cow_[g]) {
        m_.copies_.push_back(
            m_.rows_.copy_on_write(g, s, q.progress.computed / grp.P, m_.step_, q.progress.last_step, q.prio));
        ++m_.counts_.cow_copies;
        --m_.need_[g];
      }
      const std::uint64_t first_fresh = grp.table.num_pages(s);
      for (std::uint64_t k = 0; k < m_.need_[g]; ++k)
        m_.rows_.append_fresh(g, s, m_.step_, grp.policy->prefix_length(grp.table.num_pages(s)));
      if (q.hit.partial > 0 && q.hit.partial_src[g] != kNullPage && first_fresh == q.hit.tokens / grp.P &&
          grp.table.num_pages(s) > first_fresh) {  // a partial hit: its page's first tokens copied
        m_.copies_.push_back(PageCopy{g, q.hit.partial_src[g], grp.table.pages(s)[first_fresh]});
        ++m_.counts_.cow_copies;
        q.hit.partial_src[g] = kNullPage;
      }
      // The table's own token count follows the pages (kernel exports use kv_len instead).
      if (m_.target_ > grp.table.num_tokens(s)) m_.rows_.set_tokens(g, s, m_.target_);
    } else if (m_.need_[g] > 0) {
      m_.images.build_encoder_rows(s, q);
      for (std::uint32_t k = 0; k < items.size(); ++k) {
        if (grp.image.release_when_consumed && k < q.images.consumed) continue;
        for (std::uint64_t i = q.images.page[g][k]; i < q.images.page[g][k + 1]; ++i)
          if (grp.table.pages(s)[i] == kNullPage) m_.rows_.place_fresh(g, s, i, m_.step_, q.images.rank[k]);
      }
    }
  }
}

// The lookup's hit into r's rows (references +1). false, nothing changed, when a page of
// it was evicted since the lookup.
bool Admission::admit(RequestId r, Row s, Request& q) {
  if (q.tier.pending) return m_.tier.admit_tier(r, s, q);
  if (!m_.hit_pins_.pin(r, s, q, q.hit.tokens)) return false;
  if (q.hit.partial > 0 && !hold_partial_sources(s, q)) return false;
  q.hit.pending = false;
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    const Group& grp = m_.groups_[g];
    if (!grp.decoder) continue;
    const std::uint64_t gp = m_.lookup_.group_hit(q, g, q.hit.tokens);  // a draft group: its own hit
    const std::uint64_t pages = gp / grp.P;
    q.progress.lo[g] = std::min(grp.policy->first_required_page(gp), pages);
    q.progress.registered[g] = pages;
  }
  return true;
}

// A partial hit's source pages, each still cached as the lookup found it, are held until
// the next begin_step (the admitting allocate copies them). false, rows given back,
// when one left the cache since.
bool Admission::hold_partial_sources(Row s, const Request& q) {
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    const PageId src = q.hit.partial_src[g];
    const PageRec& rec = m_.store_.rec(g, src);
    if (!rec.hashed || !(rec.hash == q.hit.partial_full[g])) {  // nothing held yet
      for (GroupId h = 0; h < m_.groups_.size(); ++h) m_.rows_.unadopt_row(h, s, false);
      return false;
    }
  }
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    m_.rows_.hold_cached(g, q.hit.partial_src[g]);
    m_.partial_holds_.emplace_back(g, q.hit.partial_src[g]);
  }
  return true;
}

// The holds hold_partial_sources took for q (the last ones listed), given back as a
// refused admission gives back its pins (time 0, each page's own level).
void Admission::drop_partial_holds(const Request& q) {
  if (q.hit.partial == 0) return;
  for (GroupId g = m_.groups_.size(); g-- > 0 && !m_.partial_holds_.empty();) {
    const auto [hg, hp] = m_.partial_holds_.back();
    if (hg != g || hp != q.hit.partial_src[g]) break;
    m_.rows_.drop(hg, hp, 0, m_.store_.rec(hg, hp).prio);
    m_.partial_holds_.pop_back();
  }
}

// A refused allocate gives back the hit it pinned: every page returns to the list entry
// its lazy pin left (released at time 0 at its own level, so key and level are as the
// lookup found them), and the request is as lookup_prefix left it.
void Admission::release_unpinned_hit(Row s, Request& q) {
  drop_partial_holds(q);
  release_admission_pins(s, q);
  q.hit.pending = true;
}

// What an allocate that is refused (or only asked: would_allocate) pinned goes back: the
// hit (pinning) or the images it took from the cache.
void Admission::give_back_admission(Row s, Request& q, bool pinning, bool images) {
  if (pinning)
    release_unpinned_hit(s, q);
  else if (images)
    release_admission_pins(s, q);
}

// What a refused first allocate pinned (the hit, images from the cache) goes back, the
// rows empty again.
void Admission::release_admission_pins(Row s, Request& q) {
  q.images.cached.clear();
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    m_.rows_.unadopt_row(g, s, true);
    q.progress.lo[g] = q.progress.registered[g] = 0;
  }
}

// The need (compute_need, as if pinned) cannot be had even before the pin: against the
// counts as they are, then, where removing every hit page from the evictable counts would
// refuse too (O(groups)), against the counts less the hit's evictable pages (one read
// pass over the hit, only then: an admission that fits never pays it).
bool Admission::refused_before_pin(RequestId r, const Request& q) {
  if (m_.alloc_.surely_infeasible(m_.need_)) return true;
  m_.leaving_.assign(m_.groups_.size(), 0);
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    const Group& grp = m_.groups_[g];
    if (!grp.decoder) continue;
    const std::uint64_t gp = m_.lookup_.group_hit(q, g, q.hit.tokens);
    const std::uint64_t pages = gp / grp.P;
    m_.leaving_[g] =
        std::min<std::uint64_t>(pages - std::min(grp.policy->first_required_page(gp), pages), grp.evictable);
  }
  if (!m_.alloc_.surely_infeasible(m_.need_, m_.leaving_)) return false;
  return m_.lookup_.evictable_in_hit(r, q, q.hit.tokens, m_.leaving_) &&
         m_.alloc_.surely_infeasible(m_.need_, m_.leaving_);
}

// Debug tier 2: the refusal before the pin against the full path (pin, need, replay,
// unpin), which must refuse too. Drops stale list entries only (order unchanged).
void Admission::check_refusal(RequestId r, Row s, Request& q, std::uint32_t num_new_tokens, std::uint64_t target) {
  if (!admit(r, s, q)) return;  // allocate's own path answers kHitLost
  const bool fits = !compute_need(s, q, num_new_tokens, target) || m_.alloc_.feasible(s, m_.need_);
  release_unpinned_hit(s, q);
  if (fits) fail("debug check: request {} refused before pinning its hit, but the pinned need fits", r);
}

// A pool over a source backs pages as they are taken, and backing may fail (an elastic
// arena short of chunks): the fresh large pages the step may take (a group's fresh page
// serves it by step 1 until full, after the free small pages of its associated ones) are
// backed first, as many as can be, and the pool then offers only those: the steps and the
// feasibility check count them, evict where they fall short, and cannot fail half way.
// A plain pool: nothing to do.
void Admission::begin_backing(Row s) {
  if (!m_.pool_.has_source()) return;
  std::uint64_t fresh = 0;
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    const std::uint64_t assoc = m_.groups_[g].alloc.associated_free_small(s);
    if (m_.need_[g] > assoc) fresh += (m_.need_[g] - assoc + m_.groups_[g].n - 1) / m_.groups_[g].n;
  }
  const auto want = static_cast<std::uint32_t>(std::min<std::uint64_t>(fresh, m_.pool_.num_free()));
  if (const std::uint32_t got = m_.pool_.reserve(want); got < want)
    m_.log(LogLevel::kInfo, "{} of {} large pages could be backed", got, want);
}

AllocateResult Admission::refused(RequestId r, const Request& q, std::uint32_t num_new_tokens) {
  ++m_.counts_.refused_allocations;
  if (!q.admitted()) ++m_.counts_.refused_admissions;
  m_.log(LogLevel::kDebug, "request {}: allocate of {} tokens refused ({})", r, num_new_tokens,
         q.admitted() ? "running" : "admission");
  return {AllocateStatus::kNoMemory};
}

// Memory held for retention goes before a running request is refused (the engine would
// preempt): options_.retention_release's pages, as many bytes as the allocation needs, then
// twice that, until it fits or nothing is left to release (O(log) tries). An admission
// refused leaves them held: the request waits, and releasing on every refused queue head
// would undo retention whenever memory is full (kvmm-sim's Gemma-2 arXiv-QA: 71.9% ->
// 45.6% first-admission hits, every request's pages released).
AllocateResult Admission::allocate_at(RequestId r, Row s, std::uint32_t num_new_tokens, std::uint32_t lookahead) {
  AllocateResult res = allocate_once(r, s, num_new_tokens, lookahead);
  for (std::uint64_t want = need_bytes(); res.kind == AllocateStatus::kNoMemory && m_.reqs_[s].admitted() &&
                                          m_.retention.release_under_pressure(s, want) > 0;
       want *= 2)
    res = allocate_once(r, s, num_new_tokens, lookahead);
  return res.kind == AllocateStatus::kNoMemory ? refused(r, m_.reqs_[s], num_new_tokens) : res;
}

// The bytes of the pages compute_need last counted (at least 1: a release makes progress).
std::uint64_t Admission::need_bytes() const {
  std::uint64_t b = 0;
  for (GroupId g = 0; g < m_.groups_.size(); ++g) b += m_.need_[g] * m_.layout_.small_page_bytes(g);
  return std::max<std::uint64_t>(b, 1);
}

// One try: kNoMemory with nothing changed (allocate_at counts the refusal).
AllocateResult Admission::allocate_once(RequestId r, Row s, std::uint32_t num_new_tokens, std::uint32_t lookahead) {
  Request& q = m_.reqs_[s];
  const std::uint64_t target = q.progress.computed + num_new_tokens + lookahead;  // < 2^32 + 2^33: no wrap
  if (target > KVCacheManager::kMaxTokens)
    fail("num_new_tokens = {}, lookahead = {}: request {} would hold {} tokens, at most {}", num_new_tokens, lookahead,
         r, target, KVCacheManager::kMaxTokens);
  if (q.loading()) [[unlikely]]
    m_.loading_error(r, "allocate");
  const bool pinning = q.hit.pending;
  if (pinning) {
    // Refused for sure? Then the hit is not pinned at all. The need counted as if it were
    // (the hit's pages are had) against the evictable counts before the pin takes the hit
    // out of them (more capacity): a refusal here is a refusal after it. Image pages are
    // counted only once the rows exist, so requests with images skip this.
    if (q.ids.items().empty() && !q.tier.pending && compute_need(s, q, num_new_tokens, target) &&
        refused_before_pin(r, q)) {
      if constexpr (kCheckInternal) {
        const bool was = m_.store_.keep_stale(true);
        check_refusal(r, s, q, num_new_tokens, target);
        m_.store_.keep_stale(was);
      }
      return {AllocateStatus::kNoMemory};
    }
    if (!admit(r, s, q)) {
      ++m_.counts_.lost_hits;
      m_.log(LogLevel::kWarning, "request {}: its {}-token prefix hit was evicted before its allocate", r,
             q.hit.tokens);
      return {AllocateStatus::kHitLost};  // nothing changed: the engine resets r and looks it up again
    }
  }
  const bool images = m_.images.pin_cached_images(s, q);
  auto give_back = [&] { give_back_admission(s, q, pinning, images); };
  if (compute_need(s, q, num_new_tokens, target)) {
    try {
      begin_backing(s);
    } catch (...) {  // the source raised: nothing reserved, the hit given back
      give_back();
      throw;
    }
    if (!m_.alloc_.feasible(s, m_.need_)) {
      m_.pool_.end_reservation();
      give_back();
      return {AllocateStatus::kNoMemory};
    }
    m_.target_ = target;
    take_pages(s, q);
    m_.pool_.end_reservation();
  }
  if (images) {
    if (q.images.cached.empty()) q.images.cached.assign(q.ids.items().size(), 0);  // prefix caching off
    q.images.ready = true;
  }
  q.progress.allocated = std::max(q.progress.allocated, target);
  q.progress.step_end = q.progress.computed + num_new_tokens;
  if (!q.admitted()) {  // only now do its pages count as accessed
    q.to(q.tier.pending ? Phase::kLoading : Phase::kRunning);
    q.progress.last_step = m_.step_;
    ++m_.counts_.admissions;
    m_.counts_.admitted_lookup_tokens += q.hit.lookup_tokens;
    m_.counts_.admitted_hit_tokens += q.hit.tokens;
    q.miss.usage.read_tokens += q.hit.tokens;
    m_.retention.learn_at_admission(q);
  }
  if (q.tier.pending) m_.tier.start_loads(r, s, q);
  m_.expensive_check();
  return {};
}

// As allocate: retention's pages go first (allocate_at), then it looks again.
bool Admission::would_allocate(RequestId r, std::uint32_t num_new_tokens, std::uint32_t lookahead) {
  bool fits = would_allocate_once(r, num_new_tokens, lookahead);
  const Row s = m_.running(r);
  for (std::uint64_t want = need_bytes();
       !fits && m_.reqs_[s].admitted() && m_.retention.release_under_pressure(s, want) > 0; want *= 2)
    fits = would_allocate_once(r, num_new_tokens, lookahead);
  return fits;
}

bool Admission::would_allocate_once(RequestId r, std::uint32_t num_new_tokens, std::uint32_t lookahead) {
  const Row s = m_.running(r);
  Request& q = m_.reqs_[s];
  const std::uint64_t target = q.progress.computed + num_new_tokens + lookahead;
  if (target > KVCacheManager::kMaxTokens)
    fail("num_new_tokens = {}, lookahead = {}: request {} would hold {} tokens, at most {}", num_new_tokens, lookahead,
         r, target, KVCacheManager::kMaxTokens);
  if (q.loading()) [[unlikely]]
    m_.loading_error(r, "would_allocate");
  if (q.tier.pending) fail("request = {}: would_allocate of a pending tier hit is not supported", r);
  if (m_.pool_.has_source())
    fail("would_allocate: not supported with a large_page_source (allocate decides the backing)");
  const bool pinning = q.hit.pending;
  if (pinning && !admit(r, s, q)) return false;           // the hit was evicted: allocate returns kHitLost
  const bool images = m_.images.pin_cached_images(s, q);  // as allocate: cached images count as had
  const bool fits = !compute_need(s, q, num_new_tokens, target) || m_.alloc_.feasible(s, m_.need_);
  give_back_admission(s, q, pinning, images);
  m_.expensive_check();
  return fits;
}

}  // namespace kvmm::detail
