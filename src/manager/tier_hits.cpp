// ManagerCore's hits from a shared tier (KVTier): tier_candidates lists the pages past the
// local hit (O(pages x groups)), extend_prefix looks r up again with the tier's answers
// (O(pages probed)), the admitting allocate pins the local pages and takes a fresh page per
// tier page (admit_tier, fill_tier_pages: O(hit pages)), and finish_loads commits what
// arrived, cutting the hit back to what every group can serve (O(pages of the hit)).
#include "manager_core.hpp"

#include "kvmm/error.hpp"

#include <algorithm>

namespace kvmm::detail {

std::size_t ManagerCore::tier_candidates(RequestId r, std::vector<TierKey>& out) {
  const std::uint32_t s = running(r);
  Request& q = reqs_[s];
  if (!q.looked_up || q.admitted || q.allocated != q.hit)
    fail("request = {}: tier_candidates must come after lookup_prefix and before the first allocate", r);
  const std::uint64_t limit = q.lookup_tokens > 1 && options_.prefix_caching ? q.lookup_tokens - 1 : 0;
  std::uint64_t off = 0;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    const std::uint64_t lo = q.hit / grp.P, hi = limit / grp.P;
    q.tier_lo[g] = lo;
    q.tier_off[g] = off;
    q.tier_n[g] = grp.decoder && hi > lo ? hi - lo : 0;
    if (q.tier_n[g] == 0) continue;
    const BlockHash* hv = q.ids.chain(grp.hash_class).data();  // lookup_prefix hashed them
    for (std::uint64_t i = lo; i < hi; ++i) out.push_back(TierKey{g, hv[i]});
    off += q.tier_n[g];
  }
  q.tier_keys = off;
  q.tier_listed = true;
  return off;
}

std::uint64_t ManagerCore::extend_prefix(RequestId r, std::span<const TierStatus> present) {
  const std::uint32_t s = running(r);
  Request& q = reqs_[s];
  if (!q.tier_listed || q.admitted || q.allocated != q.hit)
    fail("request = {}: extend_prefix must follow its tier_candidates, before the first allocate", r);
  if (present.size() != q.tier_keys)
    fail("present.size() = {}: request {} listed {} tier candidates", present.size(), r, q.tier_keys);
  q.tier_listed = false;
  const std::uint64_t limit = q.lookup_tokens > 1 && options_.prefix_caching ? q.lookup_tokens - 1 : 0;
  if (limit == 0) return q.hit;
  // The local hit again where pages may have left the cache since lookup_prefix (or
  // another request's lookup replaced its probes); else lookup_prefix's still holds.
  const std::uint64_t local = lookup_.current(r) && !q.tier_pending ? q.hit : lookup_.longest_hit(r, q, limit);
  q.tier_present.resize(present.size());
  for (std::size_t k = 0; k < present.size(); ++k) q.tier_present[k] = present[k] == TierStatus::kOk;
  const TierPresence tier{q.tier_lo.data(), q.tier_n.data(), q.tier_off.data(), q.tier_present.data()};
  const std::uint64_t p = lookup_.longest_hit_with(q, limit, tier);
  hit_tokens_ = hit_tokens_ - q.hit + local;
  counts_.tier_hit_tokens += p - local;
  q.hit = p;
  q.hit_pending = p > 0;
  q.tier_local = local;
  q.tier_pending = p > local;
  q.branch = std::max(lookup_.whole_prefix_hit(limit), p);
  const std::span<const MultimodalItem> items = q.ids.items();
  while (q.items_consumed < items.size() && items[q.items_consumed].offset + items[q.items_consumed].length <= p)
    ++q.items_consumed;
  q.computed = q.allocated = p;
  return p;
}

// The rows of a tier hit: the local part pinned as lookup_prefix's hit would be, images up
// to the whole hit, then per decoder group the pages [local / P, hit / P): null below what
// the hit needs, a cached page when the index holds it (pinned), else an entry for a tier
// load (null until take_pages fills it). false, nothing pinned, when a page is in neither.
bool ManagerCore::admit_tier(RequestId r, std::uint32_t s, Request& q) {
  const std::uint64_t local = q.tier_local, p = q.hit;
  if (!lookup_.pin(r, s, q, local, p)) return false;
  q.loads.clear();
  q.load_idx.clear();
  const TierPresence tier{q.tier_lo.data(), q.tier_n.data(), q.tier_off.data(), q.tier_present.data()};
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    q.tier_fill[g] = 0;
    if (!grp.decoder) continue;
    const std::uint64_t lo = local / grp.P, pages = p / grp.P;
    const std::uint64_t need_from = std::min(grp.policy->first_required_page(p), pages);
    const BlockHash* hv = q.ids.chain(grp.hash_class).data();
    for (std::uint64_t i = lo; i < pages; ++i) {
      PageId page = kNullPage;
      if (i >= need_from) {
        page = lookup_.cached(q, g, i);
        if (page != kNullPage) {
          store_.acquire(g, page);
        } else if (tier.has(g, i)) {
          q.loads.push_back(TierLoad{TierKey{g, hv[i]}, kNullPage});
          q.load_idx.push_back(i);
          ++q.tier_fill[g];
        } else {
          release_unpinned_hit(s, q);
          q.loads.clear();
          q.load_idx.clear();
          return false;
        }
      }
      grp.table.append(s, page);
    }
    grp.table.set_num_tokens(s, p);
    q.lo[g] = std::min(grp.policy->first_required_page(local), lo);
    q.registered[g] = lo;
  }
  q.hit_pending = false;
  return true;
}

// take_pages' part for group g: a fresh page for each of its tier loads.
void ManagerCore::fill_tier_pages(std::uint32_t s, Request& q, GroupId g) {
  Group& grp = groups_[g];
  for (std::size_t k = 0; k < q.loads.size(); ++k) {
    if (q.loads[k].key.group != g) continue;
    const PageId p = alloc_.take_page(g, s);
    if (p == kNullPage) fail("internal: group {} allocation failed after a successful feasibility check", g);
    store_.init_page(g, p, step_, grp.policy->prefix_length(q.load_idx[k]));
    grp.table.set(s, static_cast<std::uint32_t>(q.load_idx[k]), p);
    q.loads[k].page = p;
  }
  need_[g] -= q.tier_fill[g];
  q.tier_fill[g] = 0;
}

// After the admitting allocate: loading until finish_loads, or, with every page cached
// here (nothing to load), computed at once.
void ManagerCore::start_loads(RequestId r, std::uint32_t s, Request& q) {
  q.tier_pending = false;
  q.loading = true;
  q.computed = q.tier_local;
  q.step_end = q.computed;
  if (q.loads.empty()) finish_loads_at(r, s, q, {});
}

std::uint64_t ManagerCore::finish_loads(RequestId r, std::span<const TierStatus> statuses) {
  const std::uint32_t s = reqs_.row(r);
  Request& q = reqs_[s];
  if (!q.loading) fail("request = {}: not loading from a tier (finish_loads follows the allocate of a tier hit)", r);
  if (statuses.size() != q.loads.size())
    fail("statuses.size() = {}: request {} has {} tier loads", statuses.size(), r, q.loads.size());
  return finish_loads_at(r, s, q, statuses);
}

// The hit every group serves from its mapped pages less the failed loads; pages below what
// that hit needs and past it are released, then it is committed.
std::uint64_t ManagerCore::finish_loads_at(RequestId r, std::uint32_t s, Request& q,
                                           std::span<const TierStatus> statuses) {
  std::uint64_t failed = 0;
  for (std::size_t k = 0; k < statuses.size(); ++k) {
    if (statuses[k] == TierStatus::kOk) continue;
    // The failed page leaves the row now: nothing may serve or cache it.
    Group& grp = groups_[q.loads[k].key.group];
    store_.release(q.loads[k].key.group, q.loads[k].page, q.last_step, q.prio);
    grp.table.set(s, static_cast<std::uint32_t>(q.load_idx[k]), kNullPage);
    ++failed;
  }
  std::uint64_t h = q.hit;
  if (failed > 0) h = servable_prefix(s, q.hit);
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    if (!grp.decoder) continue;
    const std::uint64_t keep_from = std::min(grp.policy->first_required_page(h), h / grp.P);
    const std::span<const PageId> row = grp.table.pages(s);
    for (std::uint64_t i = q.lo[g]; i < keep_from; ++i) {
      if (row[i] == kNullPage) continue;
      store_.release(g, row[i], q.last_step, q.prio);
      grp.table.set(s, static_cast<std::uint32_t>(i), kNullPage);
    }
    q.lo[g] = std::max(q.lo[g], keep_from);
    if (h == q.hit) continue;
    while (grp.table.num_pages(s) > h / grp.P)
      if (const PageId p = grp.table.pop_back(s); p != kNullPage) store_.release(g, p, q.last_step, q.prio);
    grp.table.set_num_tokens(s, h);
  }
  if (h < q.hit) q.allocated = h;
  counts_.tier_loaded_pages += statuses.size() - failed;
  counts_.tier_failed_pages += failed;
  counts_.tier_cut_tokens += q.hit - h;
  counts_.admitted_hit_tokens -= q.hit - h;
  if (failed > 0)
    log(LogLevel::kInfo, "request {}: {} of {} tier loads failed, hit cut from {} to {} tokens", r, failed,
        statuses.size(), q.hit, h);
  q.hit = h;
  q.loading = false;
  q.loads.clear();
  q.load_idx.clear();
  commit_at(r, s, h);
  q.step_end = q.computed;
  return q.computed;
}

// The longest prefix <= p every group serves from the pages row s maps (as a lookup).
std::uint64_t ManagerCore::servable_prefix(std::uint32_t s, std::uint64_t p) const {
  class Mapped final : public PageProbe {
   public:
    explicit Mapped(std::span<const PageId> row) : row_(row) {}
    bool hit(std::uint64_t i) override { return i < row_.size() && row_[i] != kNullPage; }

   private:
    std::span<const PageId> row_;
  };
  for (bool changed = true; changed && p > 0;) {
    changed = false;
    for (GroupId g = 0; g < groups_.size() && p > 0; ++g) {
      const Group& grp = groups_[g];
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

std::span<const BlockHash> ManagerCore::block_hashes(RequestId r, GroupId g) const {
  const Request& q = req(r);
  const Group& grp = group(g);
  if (!grp.decoder)
    fail("group = {}: {} holds encoder tokens (keyed by image, not by a block hash chain)", g, grp.spec.name);
  return q.ids.chain(grp.hash_class);
}

}  // namespace kvmm::detail
