// Rows (private to src/manager/): the one unit that writes the requests' device page-table
// rows and changes the reference counts of the pages they hold. Every other unit reads
// rows and asks this one: append a fresh page, adopt a hit's cached pages, release an
// entry or a whole row, copy on write, fork a row, hold a page for a pin or a boundary.
// So a line that writes a row is found here, and a reference can only move with its row
// entry. Each call costs the table write plus the page store's O(1) reference change; a
// fresh page costs the allocator's Jenga steps (which allocate checked feasible first).
// A swapped-out request's host rows are the swap unit's (swap.hpp).
#pragma once

#include "allocation.hpp"
#include "group.hpp"
#include "kvmm/caching/block_hash.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/types.hpp"
#include "page_store.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace kvmm::detail {

class Rows {
 public:
  Rows(std::vector<Group>& groups, PageStore& store, PageAllocation& alloc)
      : groups_(groups), store_(store), alloc_(alloc) {}

  // ---- fresh pages: taken through Jenga's steps (allocate checked them feasible), used
  // once, keyed (step, prefix_len).
  PageId append_fresh(GroupId g, Row s, std::uint64_t step, std::uint64_t prefix_len) {
    const PageId p = take_fresh(g, s, step, prefix_len);
    groups_[g].table.append(s, p);
    return p;
  }
  PageId place_fresh(GroupId g, Row s, std::uint64_t idx, std::uint64_t step, std::uint64_t prefix_len) {
    const PageId p = take_fresh(g, s, step, prefix_len);
    groups_[g].table.set(s, static_cast<std::uint32_t>(idx), p);
    return p;
  }
  // Entry idx, shared since fork, replaced by a fresh copy (keyed as the original); the
  // original loses this row's reference. Returns the copy the engine must run.
  PageCopy copy_on_write(GroupId g, Row s, std::uint64_t idx, std::uint64_t step, std::uint64_t last_step,
                         std::uint32_t prio);
  void append_null(GroupId g, Row s, std::uint64_t count) { groups_[g].table.append(s, count, kNullPage); }
  // The row's own token count (the kernel exports use kv_len instead).
  void set_tokens(GroupId g, Row s, std::uint64_t tokens) { groups_[g].table.set_num_tokens(s, tokens); }

  // ---- cached pages a hit adopts (one more reference each)
  // The hit's pages [lo, pages) of group g after lo null entries, each first checked to be
  // cached under check[i] (nullptr: known unchanged). false, nothing changed, when one
  // left the cache since the lookup.
  bool adopt_run(GroupId g, Row s, std::uint64_t lo, std::uint64_t pages, const PageId* hit, const BlockHash* check);
  // Cached page p into entry idx (an image's page), or appended (kNullPage: a null entry).
  void adopt(GroupId g, Row s, std::uint64_t idx, PageId p) {
    store_.acquire(g, p);
    groups_[g].table.set(s, static_cast<std::uint32_t>(idx), p);
  }
  void append_adopted(GroupId g, Row s, PageId p) {
    if (p != kNullPage) store_.acquire(g, p);
    groups_[g].table.append(s, p);
  }

  // ---- releases
  // Entry idx leaves the row and its page this row's reference (key time t, level prio).
  void release(GroupId g, Row s, std::uint64_t idx, std::uint64_t t, std::uint32_t prio) {
    const PageId p = groups_[g].table.pages(s)[idx];
    store_.release(g, p, t, prio);
    groups_[g].table.set(s, static_cast<std::uint32_t>(idx), kNullPage);
  }
  // Entry idx leaves the row; its page keeps the reference (a page held for a boundary:
  // drop() gives it back).
  PageId detach(GroupId g, Row s, std::uint64_t idx) {
    const PageId p = groups_[g].table.pages(s)[idx];
    groups_[g].table.set(s, static_cast<std::uint32_t>(idx), kNullPage);
    return p;
  }
  // The row cut to `pages` entries (the later ones released) and `tokens`.
  void truncate(GroupId g, Row s, std::uint64_t pages, std::uint64_t tokens, std::uint64_t t, std::uint32_t prio);
  // Every entry released, last first; the row empty and its large pages' association with
  // the request ended.
  void release_row(GroupId g, Row s, std::uint64_t t, std::uint32_t prio);
  // What a refused admission adopted goes back in place (released at time 0 at each
  // page's own level: the pins were lazy, so each list entry is as the lookup found it);
  // the row empty, and with end_association its large pages' association ended.
  void unadopt_row(GroupId g, Row s, bool end_association);

  // ---- sharing
  // The child row: the parent's first k entries, one more reference each, and `tokens`.
  void fork_row(GroupId g, Row parent, Row child, std::size_t k, std::uint64_t tokens);
  // One more reference to a used page (a pin), and one less (a pin or a held page goes).
  void hold(GroupId g, PageId p) { store_.share(g, p); }
  // One more reference to a cached page outside any row (a partial hit's copy source until
  // the next step; drop() gives it back). O(1).
  void hold_cached(GroupId g, PageId p) { store_.acquire(g, p); }
  void drop(GroupId g, PageId p, std::uint64_t t, std::uint32_t prio) { store_.release(g, p, t, prio); }

 private:
  PageId take_fresh(GroupId g, Row s, std::uint64_t step, std::uint64_t prefix_len);

  std::vector<Group>& groups_;
  PageStore& store_;
  PageAllocation& alloc_;
};

}  // namespace kvmm::detail
