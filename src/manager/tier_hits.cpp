// TierHits's calls: see tier_hits.hpp.
#include "manager_core.hpp"

#include "kvmm/error.hpp"
#include "prefetch.hpp"

#include <algorithm>

namespace kvmm::detail {

std::size_t TierHits::tier_candidates(RequestId r, std::vector<TierKey>& out) {
  const Row s = m_.running(r);
  Request& q = m_.reqs_[s];
  if (!q.looked_up() || q.admitted() || q.progress.allocated != q.hit.tokens)
    fail("request = {}: tier_candidates must come after lookup_prefix and before the first allocate", r);
  const std::uint64_t limit = q.hit.limit;
  std::uint64_t off = 0;
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    const Group& grp = m_.groups_[g];
    const std::uint64_t lo = q.hit.tokens / grp.P, hi = limit / grp.P;
    q.tier.lo[g] = lo;
    q.tier.off[g] = off;
    // Drafts and successor-keyed groups: local pages only (tier keys are the chain's).
    q.tier.n[g] = grp.decoder && !grp.draft && grp.successors == 0 && hi > lo ? hi - lo : 0;
    if (q.tier.n[g] == 0) continue;
    const BlockHash* hv = q.ids.chain(grp.hash_class).data();  // lookup_prefix hashed them
    for (std::uint64_t i = lo; i < hi; ++i) out.push_back(TierKey{g, hv[i]});
    off += q.tier.n[g];
  }
  q.tier.keys = off;
  q.to(Phase::kListed);
  return off;
}

std::uint64_t TierHits::extend_prefix(RequestId r, std::span<const TierStatus> present) {
  const Row s = m_.running(r);
  Request& q = m_.reqs_[s];
  if (!q.listed() || q.admitted() || q.progress.allocated != q.hit.tokens)
    fail("request = {}: extend_prefix must follow its tier_candidates, before the first allocate", r);
  if (present.size() != q.tier.keys)
    fail("present.size() = {}: request {} listed {} tier candidates", present.size(), r, q.tier.keys);
  const std::uint64_t limit = q.hit.limit;
  if (limit == 0) {
    q.to(q.tier.pending ? Phase::kAdmitting : Phase::kLookedUp);
    return q.hit.tokens;
  }
  // The local hit again where pages may have left the cache since lookup_prefix (or
  // another request's lookup replaced its probes); else lookup_prefix's still holds.
  // A tier hit ends on a page: a hit inside a page (hit_unit) is not extended by a tier.
  const std::uint64_t local =
      m_.lookup_.current(r) && !q.tier.pending ? q.hit.tokens - q.hit.partial : m_.lookup_.longest_hit(r, q, limit);
  q.hit.partial = 0;
  q.tier.present.resize(present.size());
  for (std::size_t k = 0; k < present.size(); ++k) q.tier.present[k] = present[k] == TierStatus::kOk;
  const TierPresence tier{q.tier.lo.data(), q.tier.n.data(), q.tier.off.data(), q.tier.present.data()};
  const std::uint64_t p = m_.lookup_.longest_hit_with(q, limit, tier);
  m_.hit_tokens_ = m_.hit_tokens_ - q.hit.tokens + local;
  m_.counts_.tier_hit_tokens += p - local;
  q.hit.tokens = p;
  q.hit.pending = p > 0;
  q.tier.local = local;
  q.tier.pending = p > local;
  q.hit.branch = std::max(m_.lookup_.whole_prefix_hit(limit), p);
  const std::span<const MultimodalItem> items = q.ids.items();
  while (q.images.consumed < items.size() && items[q.images.consumed].offset + items[q.images.consumed].length <= p)
    ++q.images.consumed;
  q.progress.computed = q.progress.allocated = p;
  q.to(q.tier.pending ? Phase::kAdmitting : Phase::kLookedUp);
  return p;
}

// The rows of a tier hit: the local part pinned as lookup_prefix's hit would be, images up
// to the whole hit, then per decoder group the pages [local / P, hit / P): null below what
// the hit needs, a cached page when the index holds it (pinned), else an entry for a tier
// load (null until take_pages fills it). false, nothing pinned, when a page is in neither.
bool TierHits::admit_tier(RequestId r, Row s, Request& q) {
  const std::uint64_t local = q.tier.local, p = q.hit.tokens;
  if (!m_.hit_pins_.pin(r, s, q, local, p)) return false;
  q.tier.loads.clear();
  q.tier.load_idx.clear();
  const TierPresence tier{q.tier.lo.data(), q.tier.n.data(), q.tier.off.data(), q.tier.present.data()};
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    Group& grp = m_.groups_[g];
    q.tier.fill[g] = 0;
    if (!grp.decoder) continue;
    if (grp.draft) {  // local pages only: its own hit (pinned), fresh pages from there (draft_groups.hpp)
      const std::uint64_t d = m_.lookup_.group_hit(q, g, local);
      q.progress.lo[g] = std::min(grp.policy->first_required_page(d), d / grp.P);
      q.progress.registered[g] = d / grp.P;
      continue;
    }
    const std::uint64_t lo = local / grp.P, pages = p / grp.P;
    const std::uint64_t need_from = std::min(grp.policy->first_required_page(p), pages);
    const BlockHash* hv = q.ids.chain(grp.hash_class).data();
    for (std::uint64_t i = lo; i < pages; ++i) {
      PageId page = kNullPage;
      if (i >= need_from) {
        page = m_.lookup_.cached(q, g, i);
        if (page != kNullPage) {
          // adopted below
        } else if (tier.has(g, i)) {
          q.tier.loads.push_back(TierLoad{TierKey{g, hv[i]}, kNullPage});
          q.tier.load_idx.push_back(i);
          ++q.tier.fill[g];
        } else {
          m_.admission.release_unpinned_hit(s, q);
          q.tier.loads.clear();
          q.tier.load_idx.clear();
          return false;
        }
      }
      m_.rows_.append_adopted(g, s, page);
    }
    m_.rows_.set_tokens(g, s, p);
    q.progress.lo[g] = std::min(grp.policy->first_required_page(local), lo);
    q.progress.registered[g] = lo;
  }
  q.hit.pending = false;
  return true;
}

// take_pages' part for group g: a fresh page for each of its tier loads.
void TierHits::fill_tier_pages(Row s, Request& q, GroupId g) {
  Group& grp = m_.groups_[g];
  for (std::size_t k = 0; k < q.tier.loads.size(); ++k) {
    if (q.tier.loads[k].key.group != g) continue;
    q.tier.loads[k].page =
        m_.rows_.place_fresh(g, s, q.tier.load_idx[k], m_.step_, grp.policy->prefix_length(q.tier.load_idx[k]));
  }
  m_.need_[g] -= q.tier.fill[g];
  q.tier.fill[g] = 0;
}

// After the admitting allocate: loading until finish_loads, or, with every page cached
// here (nothing to load), computed at once.
void TierHits::start_loads(RequestId r, Row s, Request& q) {
  q.tier.pending = false;
  q.progress.computed = q.tier.local;
  q.progress.step_end = q.progress.computed;
  if (q.tier.loads.empty()) finish_loads_at(r, s, q, {});
}

std::uint64_t TierHits::finish_loads(RequestId r, std::span<const TierStatus> statuses) {
  const Row s = m_.reqs_.row(r);
  Request& q = m_.reqs_[s];
  if (!q.loading()) fail("request = {}: not loading from a tier (finish_loads follows the allocate of a tier hit)", r);
  if (statuses.size() != q.tier.loads.size())
    fail("statuses.size() = {}: request {} has {} tier loads", statuses.size(), r, q.tier.loads.size());
  return finish_loads_at(r, s, q, statuses);
}

// The hit every group serves from its mapped pages less the failed loads; pages below what
// that hit needs and past it are released, then it is committed.
std::uint64_t TierHits::finish_loads_at(RequestId r, Row s, Request& q, std::span<const TierStatus> statuses) {
  std::uint64_t failed = 0;
  for (std::size_t k = 0; k < statuses.size(); ++k) {
    if (statuses[k] == TierStatus::kOk) continue;
    // The failed page leaves the row now: nothing may serve or cache it.
    m_.rows_.release(q.tier.loads[k].key.group, s, q.tier.load_idx[k], q.progress.last_step, q.prio);
    ++failed;
  }
  std::uint64_t h = q.hit.tokens;
  if (failed > 0) h = servable_prefix(s, q.hit.tokens);
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    Group& grp = m_.groups_[g];
    if (!grp.decoder) continue;
    const std::uint64_t keep_from = std::min(grp.policy->first_required_page(h), h / grp.P);
    const std::span<const PageId> row = grp.table.pages(s);
    for (std::uint64_t i = q.progress.lo[g]; i < keep_from; ++i)
      if (row[i] != kNullPage) m_.rows_.release(g, s, i, q.progress.last_step, q.prio);
    q.progress.lo[g] = std::max(q.progress.lo[g], keep_from);
    if (h == q.hit.tokens) continue;
    m_.rows_.truncate(g, s, h / grp.P, h, q.progress.last_step, q.prio);
  }
  if (h < q.hit.tokens) q.progress.allocated = h;
  m_.counts_.tier_loaded_pages += statuses.size() - failed;
  m_.counts_.tier_failed_pages += failed;
  m_.counts_.tier_cut_tokens += q.hit.tokens - h;
  m_.counts_.admitted_hit_tokens -= q.hit.tokens - h;
  q.miss.usage.read_tokens -= q.hit.tokens - h;
  if (failed > 0)
    m_.log(LogLevel::kInfo, "request {}: {} of {} tier loads failed, hit cut from {} to {} tokens", r, failed,
           statuses.size(), q.hit.tokens, h);
  q.hit.tokens = h;
  q.to(Phase::kRunning);
  q.tier.loads.clear();
  q.tier.load_idx.clear();
  m_.lifecycle.commit_at(r, s, h);
  q.progress.step_end = q.progress.computed;
  return q.progress.computed;
}

// The longest prefix <= p every group serves from the pages row s maps (as a lookup).
std::uint64_t TierHits::servable_prefix(Row s, std::uint64_t p) const {
  class Mapped final : public PageProbe {
   public:
    explicit Mapped(std::span<const PageId> row) : row_(row) {}
    bool hit(std::uint64_t i) override { return i < row_.size() && row_[i] != kNullPage; }

   private:
    std::span<const PageId> row_;
  };
  for (bool changed = true; changed && p > 0;) {
    changed = false;
    for (GroupId g = 0; g < m_.groups_.size() && p > 0; ++g) {
      const Group& grp = m_.groups_[g];
      if (!grp.decoder) continue;
      Mapped probe(grp.table.pages(s));
      if (const std::uint64_t v = grp.policy->longest_valid_prefix(p, probe); v < p) {
        p = v;
        changed = true;
      }
    }
  }
  return p;
}

}  // namespace kvmm::detail
