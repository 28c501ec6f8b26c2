// PageStore (private to src/manager/): page states and eviction lists, the prefix cache's
// memory. A small page is empty, used (reference count > 0) or evictable (cached under
// its block hash, count 0, listed in its group's LRU). A large page whose small pages are
// all evictable sits in the large-page LRU (Jenga §5.4 step 3); one with no used, some
// evictable and some empty small pages in the mixed LRU (step 6). Release, acquire and a
// small eviction are O(1) (+ O(n) to re-key a large page); fronts are O(1) amortized.
//
// Lazy pinning: a hit takes a page out of the evictable counts only; its list entries turn
// stale and are dropped by whoever meets them at a front, or revived in place when the
// page is released unchanged, so eviction order is exactly that of eager removal.
//
// Step 3's order is a merge of sources: 0 is the large-page LRU (groups with n > 1), source
// k >= 1 the small-page LRU of the k-th group with n = 1, whose small page is its large
// page (one list per page instead of two). Each source is ordered by (level, key,
// insertion number), so the merge by (level, key, seq) is the one list it replaces.
#pragma once

#include "group.hpp"
#include "key_table.hpp"
#include "kvmm/caching/prefix_index.hpp"
#include "kvmm/detail/debug_checks.hpp"
#include "kvmm/error.hpp"

#include <cstdint>
#include <utility>
#include <vector>

namespace kvmm::detail {

class EventLog;

// Per large page, what the list walks and the feasibility replay read: one 64-byte record.
struct alignas(64) LargeRec {
  LruNode node;              // in the large-page or the mixed LRU (tags 0 and 1), or neither
  std::uint32_t replay = 0;  // evicted or small page taken by the current replay (== epoch)
  std::uint32_t taken = 0;   // a small page taken by the current replay (== epoch): now live
  std::uint64_t seq = 0;     // insertion number while in the large-page LRU (see PageRec)
};
using LargeLru = LruOrder<MemberNodes<LargeRec, &LargeRec::node>>;

class PageStore {
 public:
  PageStore(std::vector<Group>& groups, LargePagePool& pool, PrefixIndex& index, EventLog& events, bool prefix_caching);
  PageStore(const PageStore&) = delete;
  PageStore& operator=(const PageStore&) = delete;

  // ---- page states
  // A page just taken from its allocator: used once, its key (step, prefix_len).
  void init_page(GroupId g, PageId p, std::uint64_t step, std::uint64_t prefix_len) {
    PageRec& rec = groups_[g].pg[p];  // an empty page: never listed
    rec.ref = 1;
    rec.hashed = 0;
    rec.partial = 0;
    rec.node.key = EvictionKey{aged(g, step), prefix_len};
    rec.prio = 0;
  }
  // A step as group g's eviction keys take it: draft groups' pages count as older by
  // their group's age_bias (DraftRole::evict_sooner_steps), so they go first. O(1).
  std::uint64_t aged(GroupId g, std::uint64_t t) const {
    const std::uint64_t b = groups_[g].age_bias;
    return t > b ? t - b : 0;
  }
  // Caches p under h. When h is cached already as a page no request uses, p takes it over
  // and that page is evicted (a removed event); as one a request uses, p becomes a copy
  // that takes the hash over when that page's last user releases it. Either way a computed
  // prefix stays findable for as long as its newest copy lives (issue 17 item 4). Records a
  // stored page event; true when p became cached under h (the caller records the KV
  // event, which needs the request). O(1) expected, O(n) when a large page is re-filed.
  // `partial`: h is a partial page's key (PageRec::partial).
  bool register_page(GroupId g, PageId p, const BlockHash& h, bool partial = false);
  // One more reference to a cached page (a hit or a pin). O(1): a lazy pin.
  void acquire(GroupId g, PageId p) {
    Group& grp = groups_[g];
    if (grp.pg[p].ref == 0) {
      ev_sub(grp.large_of(p), grp.n);
      --grp.evictable;
    }
    ++grp.pg[p].ref;
  }
  // One more reference to a page in use (a fork's child, a pin): no list or count moves. O(1).
  void share(GroupId g, PageId p) {
    PageRec& rec = groups_[g].pg[p];
    KVMM_ASSERT(rec.ref > 0);
    ++rec.ref;
  }
  // acquire() for a hit's run of pages in group g, each first checked to be still cached
  // under hashes[i] (lookup_prefix found it; a call since may have evicted it): returns
  // how many were acquired, the run's length when every page held, else the index of the
  // first that did not (none after it acquired). hashes = nullptr: no check (the caller
  // knows no page was uncached since, see uncached()). Counts kept in locals: no
  // store-load chain through the members per page.
  std::size_t acquire_run(GroupId g, const PageId* pages, const BlockHash* hashes, std::size_t count);
  // How many times a page left the cache (an eviction, or every page at forget_all): while
  // it is unchanged, every page found cached is cached still, under the same hash. O(1).
  std::uint64_t uncached() const { return uncached_; }
  // Miss reasons (miss_reasons.hpp): remember the keys of evicted pages, `capacity` slots
  // (0: none, the default; then an eviction pays one test). Whether group g's key h was
  // evicted (and not forgotten since). O(1).
  void remember_evictions(std::uint32_t capacity) { evicted_keys_ = KeyTable(capacity); }
  bool was_evicted(GroupId g, const BlockHash& h) const { return evicted_keys_.get(KeyTable::of(g, h)) != nullptr; }
  // One reference less; at the last, a cached page becomes evictable under key (max(its
  // time, t), its prefix length) at level prio, an uncached one empty. An entry that is
  // still listed under the same key and level (a hit released unchanged) stays in place.
  void release(GroupId g, PageId p, std::uint64_t t, std::uint32_t prio);
  // release() for the non-null entries of a page-table row, last page first (within one
  // step the longest prefix is evicted first, so the evictor appends in O(1)).
  void release_row(GroupId g, std::span<const PageId> pages, std::uint64_t t, std::uint32_t prio);
  void evict_small(GroupId g, PageId p);
  // Evicts p now if it is cached and no one uses it (else nothing), its large page re-filed
  // (KVCacheManagerOptions::sparse_state_checkpoints). O(n).
  void drop_cached(GroupId g, PageId p);
  // Evicts every cached small page of a large page with no used one; the last returns it
  // to the pool.
  void evict_large(LargePageId lp);
  // Forgets every hash (reset_prefix_cache): evictable pages become empty, used ones
  // private. O(pages).
  void forget_all();

  // ---- fronts (each drops the stale entries it meets)
  PageId small_front(GroupId g) const;
  // Step 3's next victim: the earliest of the sources' fronts; its source in src.
  LargePageId large_front(std::uint32_t& src) const;
  LargePageId large_front() const {
    std::uint32_t src;
    return large_front(src);
  }
  LargePageId mixed_front() const;

  // ---- large-page states, O(1)
  // Jenga §5.4's evictable large page: every small page evictable (step 3).
  bool full_evictable(LargePageId lp) const {
    const GroupId g = pool_.owner_unchecked(lp);
    return g != kNoGroup && ev_in_large_[lp.index] == groups_[g].n;
  }
  // No used small page, some evictable and some empty (step 6).
  bool mixed(LargePageId lp) const {
    const GroupId g = pool_.owner_unchecked(lp);
    if (g == kNoGroup) return false;
    const std::uint32_t ev = ev_in_large_[lp.index], empty = pool_.free_small_unchecked(lp);
    return ev > 0 && empty > 0 && ev + empty == groups_[g].n;
  }
  std::uint32_t num_full_evictable() const { return num_full_ev_; }
  std::uint32_t evictable_in(LargePageId lp) const { return ev_in_large_[lp.index]; }

  // ---- the merged step-3 sources (for the feasibility replay and the victim ring)
  // Every source's entries are large pages: source 0 lists them, a one-page group lists
  // its small pages, whose id is their large page's (small id = large id * 1 + 0).
  std::uint32_t num_sources() const { return static_cast<std::uint32_t>(single_.size()) + 1; }
  LargePageId source_front(std::uint32_t src) const;
  // A source's first entry, stale or not, without dropping anything (for prefetching).
  LargePageId source_peek(std::uint32_t src) const {
    return LargePageId{src == 0 ? large_lru_.front() : groups_[single_[src - 1]].lru.front()};
  }
  LargePageId source_after(std::uint32_t src, LargePageId id) const {
    return LargePageId{src == 0 ? large_lru_.after(id.index) : groups_[single_[src - 1]].lru.after(id.index)};
  }
  // The earliest of at(s) over the sources (kNoLargePage: every one none), its source in src.
  template <class At>
  LargePageId earliest(At at, std::uint32_t& src) const {
    LargePageId best = kNoLargePage;
    src = 0;
    for (std::uint32_t s = 0; s < num_sources(); ++s) {
      const LargePageId id = at(s);
      if (id != kNoLargePage && (best == kNoLargePage || victim_before(s, id, src, best))) {
        best = id;
        src = s;
      }
    }
    return best;
  }
  // Where the victim of a source is recorded: its list node (the large page's or a one-page
  // group's small page's record).
  const void* source_record(std::uint32_t src, LargePageId id) const {
    if (src == 0) return &large_[id.index];
    return &groups_[single_[src - 1]].pg[id.index];
  }

  // ---- the feasibility replay's marks: evicted, or a free small page taken, by this replay
  void replay_begin() {
    if (++replay_epoch_ == 0) {
      for (LargeRec& l : large_) l.replay = l.taken = 0;
      replay_epoch_ = 1;
    }
  }
  bool replay_skips(LargePageId lp) const { return large_[lp.index].replay == replay_epoch_; }
  void replay_mark(LargePageId lp) { large_[lp.index].replay = replay_epoch_; }
  // A mixed large page the replay took a free small page of: no longer step 6's, and live
  // (it holds a used page), so its cached pages are the packing step's (see allocation.hpp).
  void replay_mark_taken(LargePageId lp) { large_[lp.index].replay = large_[lp.index].taken = replay_epoch_; }
  bool replay_taken(LargePageId lp) const { return large_[lp.index].taken == replay_epoch_; }
  // The next entry of a source (or of the mixed LRU) from lp on that the replay may take:
  // stale entries are dropped as the fronts drop them, marked ones skipped.
  LargePageId replay_source_next(std::uint32_t src, LargePageId lp);
  LargePageId replay_mixed_next(LargePageId lp);
  LargePageId mixed_after(LargePageId lp) const { return LargePageId{mixed_lru_.after(lp.index)}; }

  // Addresses prefetch strategies request (prefetch.hpp).
  const LargeRec* large_record(LargePageId lp) const { return &large_[lp.index]; }
  const std::uint32_t* evictable_count(LargePageId lp) const { return &ev_in_large_[lp.index]; }
  const LargePagePool& pool() const { return pool_; }
  const Group& group(GroupId g) const { return groups_[g]; }
  const PrefixIndex& index() const { return index_; }

  // ---- queries for tests, stats and checks
  const PageRec& rec(GroupId g, PageId p) const { return groups_[g].pg[p]; }
  bool listed(GroupId g, PageId p) const { return groups_[g].lru.contains(p); }
  // Recounts every evictable count, list and list order; kvmm::Error naming the first
  // mismatch. `refs[g][p]` are the holders the caller counted. O(memory).
  void check_invariants(const std::vector<std::vector<std::uint32_t>>& refs) const;
  std::uint64_t num_copies() const { return num_copies_; }
  // While set, the fronts and the replay step over stale entries instead of dropping them,
  // so a debug check that replays (allocation's feasibility, a refusal) leaves the lists
  // exactly as they were: a dropped entry of a page later released unchanged is inserted
  // anew rather than revived in place, which orders it after its equals. O(1).
  // Returns the previous setting (checks nest).
  bool keep_stale(bool on) const { return std::exchange(keep_stale_, on); }

 private:
  template <class Lru>
  LargePageId replay_next(Lru& lru, LargePageId lp, bool mixed_list);
  template <bool kCheck>
  std::size_t acquire_run_impl(GroupId g, const PageId* pages, const BlockHash* hashes, std::size_t count);
  bool victim_before(std::uint32_t sa, LargePageId a, std::uint32_t sb, LargePageId b) const;
  // The key and level lp is listed under: its most recent cached small page's key and the
  // highest retention level among them. O(n).
  std::pair<EvictionKey, std::uint32_t> large_entry(GroupId g, LargePageId lp) const;
  // Files lp in the list its state calls for (wholly evictable, mixed or none). O(n).
  void refresh_large(GroupId g, LargePageId lp);
  void ev_add(LargePageId lp, std::uint32_t n) { num_full_ev_ += ++ev_in_large_[lp.index] == n; }
  void ev_sub(LargePageId lp, std::uint32_t n) { num_full_ev_ -= ev_in_large_[lp.index]-- == n; }
  // The entry after stale entry e of list l, e dropped unless keep_stale. O(1).
  template <class Lru>
  PageId drop_stale(Lru& l, PageId e) const {
    const PageId next = l.after(e);
    if (!keep_stale_) l.erase(e);
    return next;
  }
  // Cached page o, just released by its last user, gives its hash to copy d (in use) and
  // is freed. O(1) + O(n) to re-file o's large page.
  void hand_over(GroupId g, PageId o, PageId d);
  // Frees a page no request uses and no hash names; re-files its large page. O(1) + O(n).
  void free_uncached(GroupId g, PageId p);
  auto hash_of() const {
    return [this](GroupId g, PageId p) -> const BlockHash& { return groups_[g].pg[p].hash; };
  }
  void check_large_lists(GroupId g, const std::vector<std::uint32_t>& per_large) const;

  std::vector<Group>& groups_;
  LargePagePool& pool_;
  PrefixIndex& index_;
  PrefixIndex copies_;            // (group, hash) -> a copy waiting to take the hash over
  std::uint64_t num_copies_ = 0;  // while 0, a release does not look for one
  mutable bool keep_stale_ = false;
  EventLog& events_;
  bool prefix_caching_;
  std::vector<LargeRec> large_;
  // Evictable small pages per large page: dense (4 bytes each, cache-resident), since a
  // hit's pin loop touches it for every page and nothing else of the large page.
  std::vector<std::uint32_t> ev_in_large_;
  std::uint32_t num_full_ev_ = 0;  // large pages with every small page evictable
  mutable LargeLru large_lru_;     // wholly evictable large pages, plus stale ones
  // Large pages with no used small page, some evictable and some empty, plus stale ones:
  // reclaimed by any group only when Jenga's five steps find nothing (step 6), so memory
  // is never stranded in a group whose cached pages leave free small pages behind.
  mutable LargeLru mixed_lru_;
  std::vector<GroupId> single_;  // groups with one small page per large page (sources 1..)
  std::uint64_t seq_ = 0;        // last insertion number handed out
  std::uint64_t uncached_ = 0;   // see uncached()
  KeyTable evicted_keys_;        // remember_evictions
  std::uint32_t replay_epoch_ = 0;
};

}  // namespace kvmm::detail
