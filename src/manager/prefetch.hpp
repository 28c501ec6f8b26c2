// Every prefetch strategy of the manager (private to src/manager/), in one place, each a
// hint behind KVMM_PREFETCH (kvmm/detail/prefetch.hpp): built with -DKVMM_PREFETCH=OFF they
// issue nothing and every result is the same. Why they exist: the manager's per-page work
// is a few cached operations on records that sit in separate random cache lines (a page's
// record, its large page's, the allocator's entry, the index bucket), so where the next
// addresses are known they are requested ahead and the misses overlap.
//   release-ahead   loops releasing a page-table row request the lines 8 pages ahead;
//   victim ring     step 3's next victims, whose lines are requested in stages;
//   probe-ahead     index buckets 16 pages ahead of a probe;
//   insert-ahead    commit's index inserts: the bucket 16 ahead, the page's record 8 ahead.
#pragma once

#include "kvmm/detail/prefetch.hpp"
#include "page_store.hpp"

#include <cstddef>
#include <cstdint>

namespace kvmm::detail {

// ---- release-ahead
inline constexpr std::size_t kReleaseAhead = 8;  // pages

// What PageStore::release reads of page p.
inline void prefetch_release(const PageStore& store, const Group& grp, PageId p) {
  prefetch_write(&grp.pg[p]);
  const LargePageId lp = grp.large_of(p);
  if (grp.n > 1) {  // one-page large pages: neither record is read
    store.pool().prefetch(lp);
    prefetch_write(store.large_record(lp));
  }
  prefetch_write(store.evictable_count(lp));
}

// ---- probe-ahead and insert-ahead
// The records a bucket's fingerprints name are not requested ahead: that costs a demand
// load of the bucket 8 pages early, and measured (docs/results/manager-split.md) it made
// the scattered 128k lookup 1.5x and the caching decode step 1.2x slower. The monolith's
// versions of it had been deleted by GCC (see kvmm/detail/prefetch.hpp), so they never ran.
inline constexpr std::uint64_t kIndexAhead = 16;  // pages ahead: the index bucket
inline constexpr std::uint64_t kRecordAhead = 8;  // pages ahead: commit's page record

// For a scan over pages [0, n) of hashes hv, at page i, in direction up (i rising) or down.
inline void prefetch_probe(const PrefixIndex& index, GroupId g, const BlockHash* hv, std::uint64_t i, std::uint64_t n,
                           bool up) {
  if (!kPrefetch) return;
  if (up) {
    if (i + kIndexAhead < n) index.prefetch(g, hv[i + kIndexAhead]);
  } else {
    if (i >= kIndexAhead) index.prefetch(g, hv[i - kIndexAhead]);
  }
}

// Before commit's insert of page i of [.., full): the bucket 16 ahead, the page's record 8
// ahead.
inline void prefetch_insert(const PrefixIndex& index, const Group& grp, GroupId g, const BlockHash* hv,
                            const PageId* pages, std::uint64_t i, std::uint64_t full) {
  if (!kPrefetch) return;
  if (i + kIndexAhead < full) index.prefetch(g, hv[i + kIndexAhead]);
  if (const std::uint64_t j = i + kRecordAhead; j < full && pages[j] != kNullPage) prefetch_read(&grp.pg[pages[j]]);
}

// ---- victim ring
// Step 3 evicts in runs down the merged step-3 order, and each victim's records (its large
// page, small pages, allocator entries, LRU neighbours, index buckets) sit in separate random
// lines: loaded serially, a victim costs several memory latencies. So the entries after
// the front are kept in a ring (a hint: the lists alone decide) and their lines are
// requested in stages as they approach, each stage reading only what an earlier one
// requested.
class VictimRing {
 public:
  static constexpr std::uint32_t kAhead = 8;
  explicit VictimRing(std::uint32_t num_sources) : pos_(num_sources, kNoLargePage) {}

  // `front` is the victim about to be evicted, from source front_src; `taker` the group
  // that takes its memory.
  void advance(const PageStore& store, LargePageId front, std::uint32_t front_src, GroupId taker) {
    if (!kPrefetch) return;
    drop_to(front);
    // A ring that lost the front starts again from the fronts (the other sources' fronts
    // come after `front`: large_front compared them, dropping their stale entries, so a
    // peek sees what a front would). An entry that left its list since is not looked for:
    // after() still yields page ids (or none), and a wrong guess only costs a prefetch
    // until the ring runs dry. Nothing here changes a list.
    if (count_ == 0)
      for (std::uint32_t s = 0; s < store.num_sources(); ++s)
        pos_[s] = s == front_src ? store.source_after(s, front) : store.source_peek(s);
    fill(store);
    if (count_ > kAhead / 2) stage_owner(store, at(kAhead / 2), taker);
    if (count_ > 0) stage_neighbours(store, at(0));
  }

 private:
  LargePageId& at(std::uint32_t k) { return ring_[(first_ + k) % kAhead]; }
  // Entries up to the front left the list (evicted or stale).
  void drop_to(LargePageId front) {
    while (count_ > 0) {
      const LargePageId v = at(0);
      first_ = (first_ + 1) % kAhead;
      --count_;
      if (v == front) break;
    }
  }
  // Stage 1: new entries, the earliest next entry of the sources; that source's next one
  // is requested (its list node and pool record). Up to two per call, so the ring catches
  // up after a reset while each hop's node was requested a call earlier.
  void fill(const PageStore& store) {
    for (int step = 0; step < 2 && count_ < kAhead; ++step) {
      std::uint32_t src;
      const LargePageId next = store.earliest([this](std::uint32_t s) { return pos_[s]; }, src);
      if (next == kNoLargePage) break;
      at(count_++) = next;
      pos_[src] = store.source_after(src, next);
      if (pos_[src] != kNoLargePage) {
        prefetch_read(store.source_record(src, pos_[src]));
        store.pool().prefetch(pos_[src]);
      }
    }
  }
  // Stage 2, halfway: the owner is known now; the small pages' records and allocator entries, and the
  // records the taking group will write when the page comes back to it.
  static void stage_owner(const PageStore& store, LargePageId v, GroupId taker) {
    const GroupId h = store.pool().owner_unchecked(v);
    if (h != kNoGroup) {
      const Group& gh = store.group(h);
      const PageId first = gh.first_small(v);
      for (PageId s = first; s < first + gh.n && s < first + 8; ++s) {
        prefetch_read(&gh.pg[s]);
        gh.alloc.prefetch(s);
      }
    }
    if (h != taker) {
      const Group& gt = store.group(taker);
      const PageId first = gt.first_small(v);
      for (PageId s = first; s < first + gt.n && s < first + 8; ++s) prefetch_write(&gt.pg[s]);
    }
  }
  // Stage 3, the next victim: its index buckets and its small pages' LRU neighbours.
  static void stage_neighbours(const PageStore& store, LargePageId v) {
    const GroupId h = store.pool().owner_unchecked(v);
    if (h == kNoGroup) return;
    const Group& gh = store.group(h);
    const PageId first = gh.first_small(v);
    for (PageId s = first; s < first + gh.n && s < first + 8; ++s) {
      const PageRec& rec = gh.pg[s];
      if (!rec.hashed) continue;
      store.index().prefetch(h, rec.hash);
      if (rec.node.prev != LruNode::kNone) prefetch_read(&gh.pg[rec.node.prev]);
      if (rec.node.next != LruNode::kNone) prefetch_read(&gh.pg[rec.node.next]);
    }
  }

  LargePageId ring_[kAhead] = {};
  std::uint32_t first_ = 0, count_ = 0;
  std::vector<LargePageId> pos_;  // per source: its next entry not yet in the ring (kNoLargePage: none)
};

}  // namespace kvmm::detail
