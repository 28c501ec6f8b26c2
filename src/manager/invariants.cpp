// The manager's invariants, recomputed from scratch (check_invariants): every reference
// count against the rows and pins that hold the page, every evictable count, list and list
// order against the pages' states, every cached page against the prefix index. O(memory);
// for tests and debug builds (KVMM_DEBUG_CHECKS >= 3 runs it after every call).
#include "manager_core.hpp"

#include "kvmm/error.hpp"

namespace kvmm::detail {

// Group g's rows: shapes, and the holders of each page counted into refs.
// Long by design (lint): an invariant checker, a list of independent recounts read top to bottom.
// NOLINTBEGIN(readability-function-cognitive-complexity)
void ManagerCore::check_tables(GroupId g, std::vector<std::uint32_t>& refs) const {
  // NOLINTEND(readability-function-cognitive-complexity)
  const Group& grp = groups_[g];
  std::uint64_t host_used = 0;
  for (Row s{0}; s.index < reqs_.capacity(); ++s.index) {
    const Request& q = reqs_[s];
    if (!q.active()) {
      if (grp.table.num_pages(s) || swap.host(g).table.num_pages(s))
        fail("invariant: inactive row {} holds pages in group {}", s, g);
      continue;
    }
    for (PageId h : swap.host(g).table.pages(s)) host_used += h != kNullPage;
    const std::span<const PageId> pages = grp.table.pages(s);
    if (q.swapped() || q.hit.pending) {
      if (!pages.empty() || !q.keep.held.empty())
        fail("invariant: row {} (swapped {}, hit pending {}) holds device pages", s, q.swapped(), q.hit.pending);
      continue;
    }
    std::uint32_t num_held = 0;
    for (const HeldPage& h : q.keep.held) {
      if (h.group != g) continue;
      ++num_held;
      if (!grp.alloc.is_allocated(h.page)) fail("invariant: row {} group {} holds empty page {}", s, g, h.page);
      ++refs[h.page];
    }
    if (num_held != q.keep.held_in[g])
      fail("invariant: row {} group {} holds {} pages, counted {}", s, g, num_held, q.keep.held_in[g]);
    if (grp.decoder) {
      if (pages.size() != pages_for(q.progress.allocated, grp.P))
        fail("invariant: row {} group {} has {} pages for {} allocated tokens", s, g, pages.size(),
             q.progress.allocated);
      // A tier hit loading: no page between its local part and what the whole hit needs.
      const std::uint64_t gap_lo = q.loading() ? q.tier.local / grp.P : 0;
      const std::uint64_t gap_hi =
          q.loading() ? std::min(grp.policy->first_required_page(q.hit.tokens), q.hit.tokens / grp.P) : 0;
      for (std::size_t i = 0; i < pages.size(); ++i)
        if ((pages[i] == kNullPage) != (i < q.progress.lo[g] || (i >= gap_lo && i < gap_hi)))
          fail("invariant: row {} group {} entry {} is {} (first held page {})", s, g, i, pages[i], q.progress.lo[g]);
    }
    for (PageId p : pages) {
      if (p == kNullPage) continue;
      if (!grp.alloc.is_allocated(p)) fail("invariant: row {} group {} maps empty page {}", s, g, p);
      ++refs[p];
    }
  }
  for (const auto& pin : pins_)
    for (const auto& [pg, p] : pin)
      if (pg == g) ++refs[p];
  for (const auto& [pg, p] : partial_holds_)
    if (pg == g) ++refs[p];
  if (host_used != swap.host(g).alloc.num_used_small())
    fail("invariant: group {} host pages used {} but {} in host tables", g, swap.host(g).alloc.num_used_small(),
         host_used);
}

void ManagerCore::check_invariants() const {
  std::vector<std::vector<std::uint32_t>> refs(groups_.size());
  for (GroupId g = 0; g < groups_.size(); ++g) {
    groups_[g].alloc.check_invariants();
    swap.host(g).alloc.check_invariants();
    refs[g].assign(groups_[g].pg.size(), 0);
    check_tables(g, refs[g]);
  }
  store_.check_invariants(refs);
  std::uint32_t active = 0;
  std::uint64_t held_bytes = 0;  // retention: the held pages' bytes, within the bound
  for (Row s{0}; s.index < reqs_.capacity(); ++s.index) {
    active += reqs_[s].active();
    if (reqs_[s].active())
      for (const HeldPage& h : reqs_[s].keep.held) held_bytes += layout_.small_page_bytes(h.group);
  }
  if (active != reqs_.num_active()) fail("invariant: {} active request rows, {} counted", active, reqs_.num_active());
  if (held_bytes != retention.held_bytes() || held_bytes > retention.budget_bytes())
    fail("invariant: pages held for retention take {} bytes, counted {}, bound {}", held_bytes, retention.held_bytes(),
         retention.budget_bytes());
}

// Long by design (lint): an invariant checker, a list of independent recounts read top to bottom.
// NOLINTBEGIN(readability-function-cognitive-complexity)
void PageStore::check_invariants(const std::vector<std::vector<std::uint32_t>>& refs) const {
  // NOLINTEND(readability-function-cognitive-complexity)
  std::uint64_t hashed_total = 0, copies = 0;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    std::uint32_t evictable = 0, listed_total = 0;
    std::vector<std::uint32_t> per_large(pool_.capacity(), 0);
    for (PageId p = 0; p < grp.pg.size(); ++p) {
      const PageRec& rec = grp.pg[p];
      if (refs[g][p] != rec.ref)
        fail("invariant: group {} page {} has reference count {} but {} holders", g, p, rec.ref, refs[g][p]);
      const bool alloc = grp.alloc.is_allocated(p), listed = grp.lru.contains(p);
      const bool in_lru = listed && rec.ref == 0;  // else a stale entry (lazy pin)
      if (alloc != (rec.ref > 0 || in_lru))
        fail("invariant: group {} page {} allocated={} but ref {} evictable {}", g, p, alloc, rec.ref, in_lru);
      if (listed && !rec.hashed)
        fail("invariant: group {} listed page {} has ref {} hashed {}", g, p, rec.ref, rec.hashed);
      listed_total += listed;
      if (rec.hashed) {
        ++hashed_total;
        if (!alloc) fail("invariant: group {} page {} is both cached and free", g, p);
        if (index_.find(g, rec.hash, hash_of()) != p) fail("invariant: group {} page {} not indexed by its hash", g, p);
      }
      if (in_lru) {
        ++evictable;
        ++per_large[p / grp.n];
      }
      if (rec.copy) {  // used, uncached, listed as the copy of a cached page in use
        ++copies;
        const PageId o = index_.find(g, rec.hash, hash_of());
        if (rec.hashed || rec.ref == 0 || copies_.find(g, rec.hash, hash_of()) != p || o == kNullPage ||
            groups_[g].pg[o].ref == 0)
          fail("invariant: group {} copy page {} (ref {}, hashed {}) not a listed copy of a used cached page", g, p,
               rec.ref, rec.hashed);
      }
    }
    if (evictable != grp.evictable || listed_total != grp.lru.size())
      fail("invariant: group {} counts {} evictable, list {}, actual {} (+ stale {})", g, grp.evictable, grp.lru.size(),
           evictable, listed_total - evictable);
    check_large_lists(g, per_large);
  }
  // Every step-3 source is ordered by (level, key, insertion), so their merge is one order.
  for (std::uint32_t src = 0; src < num_sources(); ++src) {
    LargePageId prev = kNoLargePage;
    for (LargePageId id = source_peek(src); id != kNoLargePage; id = source_after(src, id)) {
      if (prev != kNoLargePage && !victim_before(src, prev, src, id))
        fail("invariant: step-3 source {} lists {} before {} out of (level, key, insertion) order", src, prev.index,
             id.index);
      prev = id;
    }
  }
  std::uint32_t full_ev = 0;
  for (std::uint32_t lp = 0; lp < pool_.capacity(); ++lp) {
    full_ev += full_evictable(LargePageId{lp});
    if (pool_.owner(LargePageId{lp}) == kNoGroup && (large_lru_.contains(lp) || mixed_lru_.contains(lp)))
      fail("invariant: free large page {} is in a large-page LRU", lp);
  }
  if (full_ev != num_full_ev_)
    fail("invariant: {} wholly evictable large pages counted, actual {}", num_full_ev_, full_ev);
  if (copies != num_copies_ || copies != copies_.size())
    fail("invariant: {} copy pages, {} counted, {} listed", copies, num_copies_, copies_.size());
  if (hashed_total != index_.size())
    fail("invariant: {} hashed pages but {} index entries", hashed_total, index_.size());
}

// Group g's large pages: evictable counts, and the list each belongs in. Wholly evictable:
// the large LRU; cached + empty, nothing used: the mixed LRU; each under its current key.
// Anything else listed is a stale entry (a lazy pin, or a small page taken since).
void PageStore::check_large_lists(GroupId g, const std::vector<std::uint32_t>& per_large) const {
  const Group& grp = groups_[g];
  for (std::uint32_t lp = 0; lp < pool_.capacity(); ++lp) {
    if (pool_.owner(LargePageId{lp}) != g) continue;
    if (per_large[lp] != ev_in_large_[lp])
      fail("invariant: large page {} counts {} evictable small pages, actual {}", lp, ev_in_large_[lp], per_large[lp]);
    if (grp.n == 1) {  // listed by its small page's entry alone
      if (large_lru_.contains(lp) || mixed_lru_.contains(lp))
        fail("invariant: one-page large page {} of group {} is in a large-page LRU", lp, g);
      continue;
    }
    const std::uint32_t empty = grp.alloc.free_in_large(LargePageId{lp});
    if (per_large[lp] > 0 && per_large[lp] + empty == grp.n) {
      const LargeLru& want = empty == 0 ? large_lru_ : mixed_lru_;
      const EvictionKey key = large_entry(g, LargePageId{lp}).first;
      if (!want.contains(lp) || !(want.key(lp) == key))
        fail("invariant: large page {} ({} cached, {} empty) listed = {}, key {}/{}", lp, per_large[lp], empty,
             want.contains(lp), key.time, key.prefix_len);
    }
  }
}

}  // namespace kvmm::detail
