#include "page_store.hpp"

#include "event_log.hpp"
#include "prefetch.hpp"

#include <algorithm>
#include <tuple>
#include <type_traits>

namespace kvmm::detail {

PageStore::PageStore(std::vector<Group>& groups, LargePagePool& pool, PrefixIndex& index, EventLog& events,
                     bool prefix_caching)
    : groups_(groups),
      pool_(pool),
      index_(index),
      copies_(std::max<std::uint64_t>(index.capacity() / 4, 64), std::max<std::uint32_t>(index.num_groups(), 1)),
      events_(events),
      prefix_caching_(prefix_caching),
      large_(pool.capacity()),
      ev_in_large_(pool.capacity(), 0),
      large_lru_(pool.capacity(), {large_.data()}, 0),
      mixed_lru_(pool.capacity(), {large_.data()}, 1) {
  for (GroupId g = 0; g < groups_.size(); ++g)
    if (groups_[g].n == 1) single_.push_back(g);
}

bool PageStore::register_page(GroupId g, PageId p, const BlockHash& h, bool partial) {
  Group& grp = groups_[g];
  if (!prefix_caching_ || grp.pg[p].hashed) return false;
  if (!index_.insert(g, h, p, hash_of())) {
    // Same content cached already, as page o. While a request uses o, p stays private.
    // Otherwise p, which a running request uses, takes the hash over and o is evicted now:
    // the prefix stays findable for as long as its newest copy lives (a copy left in the
    // LRU with its older time would go first, and the prefix with it), and o's memory
    // returns now instead of at its turn in the LRU.
    const PageId o = index_.find(g, h, hash_of());
    if (o == kNullPage) return false;
    if (grp.pg[o].ref != 0) {
      // A full copies table (or a run too long) leaves p private: only a lost hint.
      if (copies_.find(g, h, hash_of()) == kNullPage) {
        grp.pg[p].hash = h;
        if (copies_.insert(g, h, p, hash_of())) {
          grp.pg[p].copy = 1;
          ++num_copies_;
        }
      }
      return false;
    }
    evict_small(g, o);
    if (const LargePageId lp = grp.large_of(o); grp.n > 1 && pool_.owner_unchecked(lp) == g) refresh_large(g, lp);
    if (!index_.insert(g, h, p, hash_of())) return false;  // adversarial hashes only: a probe run too long
  }
  grp.pg[p].hashed = 1;
  grp.pg[p].hash = h;
  grp.pg[p].partial = static_cast<std::uint8_t>(partial);
  events_.stored(g, p, h);
  return true;
}

std::size_t PageStore::acquire_run(GroupId g, const PageId* pages, const BlockHash* hashes, std::size_t count) {
  return hashes != nullptr ? acquire_run_impl<true>(g, pages, hashes, count)
                           : acquire_run_impl<false>(g, pages, hashes, count);
}

template <bool kCheck>
std::size_t PageStore::acquire_run_impl(GroupId g, const PageId* pages, const BlockHash* hashes, std::size_t count) {
  Group& grp = groups_[g];
  PageRec* rec = grp.pg.data();
  std::uint32_t* ev = ev_in_large_.data();
  const std::uint32_t n = grp.n;
  std::uint32_t newly = 0, full_lost = 0;
  std::size_t i = 0;
  for (; i < count; ++i) {
    const PageId page = pages[i];
    PageRec& r = rec[page];
    if constexpr (kCheck)
      if (!r.hashed || !(r.hash == hashes[i])) break;  // evicted since the lookup
    if (r.ref++ == 0) {
      full_lost += ev[n == 1 ? page : page / n]-- == n;
      ++newly;
    }
  }
  grp.evictable -= newly;
  num_full_ev_ -= full_lost;
  return i;
}

PageId PageStore::small_front(GroupId g) const {
  const Group& grp = groups_[g];
  PageId s = grp.lru.front();
  while (s != kNullPage && grp.pg[s].ref > 0) s = drop_stale(grp.lru, s);
  return s;
}

bool PageStore::victim_before(std::uint32_t sa, LargePageId a, std::uint32_t sb, LargePageId b) const {
  auto node = [this](std::uint32_t src, LargePageId id) -> std::pair<const LruNode*, std::uint64_t> {
    if (src == 0) return {&large_[id.index].node, large_[id.index].seq};
    const PageRec& rec = groups_[single_[src - 1]].pg[id.index];  // a one-page group: small id = large id
    return {&rec.node, rec.seq};
  };
  const auto [x, xs] = node(sa, a);
  const auto [y, ys] = node(sb, b);
  if (x->level != y->level) return x->level < y->level;
  if (!(x->key == y->key)) return evicted_before(x->key, y->key);
  return xs < ys;
}

// A one-page group's entry is stale exactly when its page is pinned; its large page is then
// not wholly evictable either, so !full_evictable tells for every source.
LargePageId PageStore::source_front(std::uint32_t src) const {
  if (src > 0) return LargePageId{small_front(single_[src - 1])};  // a one-page group: small id = large id
  PageId lp = large_lru_.front();
  while (lp != kNullPage && !full_evictable(LargePageId{lp})) lp = drop_stale(large_lru_, lp);
  return LargePageId{lp};
}

LargePageId PageStore::large_front(std::uint32_t& src) const {
  return earliest([this](std::uint32_t s) { return source_front(s); }, src);
}

LargePageId PageStore::mixed_front() const {
  PageId lp = mixed_lru_.front();
  while (lp != kNullPage && !mixed(LargePageId{lp})) lp = drop_stale(mixed_lru_, lp);
  return LargePageId{lp};
}

// Jenga §5.4 step 3: a large page's key is its most recent cached small page's (free small pages
// hold nothing and have no age). Its allocated small pages are exactly its evictable ones,
// so the records alone tell (no allocator read).
std::pair<EvictionKey, std::uint32_t> PageStore::large_entry(GroupId g, LargePageId lp) const {
  const Group& grp = groups_[g];
  bool any = false;
  EvictionKey best;
  std::uint32_t level = 0;
  for (PageId s = grp.first_small(lp); s < grp.first_small(lp) + grp.n; ++s) {
    const PageRec& rec = grp.pg[s];
    if (rec.ref != 0 || !grp.lru.contains(s)) continue;
    if (!any || evicted_before(best, rec.node.key)) best = rec.node.key;
    level = std::max<std::uint32_t>(level, rec.prio);
    any = true;
  }
  return {best, level};
}

// An entry already listed under the same key and level (a stale one revived: its pages
// were pinned by a hit, now released unchanged) stays in place, as small pages' entries
// do, so a hit that is never admitted leaves the order. Groups with n > 1 only: a one-page
// group's small-page LRU is its step-3 source.
void PageStore::refresh_large(GroupId g, LargePageId large) {
  LargeLru* to = full_evictable(large) ? &large_lru_ : mixed(large) ? &mixed_lru_ : nullptr;
  EvictionKey key;
  std::uint32_t level = 0;
  if (to != nullptr) std::tie(key, level) = large_entry(g, large);
  const std::uint32_t lp = large.index;  // the large-page LRUs are indexed by it
  for (LargeLru* l : {&large_lru_, &mixed_lru_}) {
    if (!l->contains(lp)) continue;
    if (l == to && l->key(lp) == key && large_[lp].node.level == level) return;
    l->erase(lp);
  }
  if (to != nullptr) {
    to->insert(lp, key, level);
    large_[lp].seq = ++seq_;
  }
}

void PageStore::release(GroupId g, PageId p, std::uint64_t t, std::uint32_t prio) {
  Group& grp = groups_[g];
  PageRec& rec = grp.pg[p];
  if (rec.ref == 0) fail("internal: group {} page {} released with reference count 0", g, p);
  const EvictionKey key{std::max(rec.node.key.time, aged(g, t)), rec.node.key.prefix_len};
  if (--rec.ref > 0) {
    // Still held: the access counts. A stale entry (lazy pin) keyed by the old time leaves
    // the list now rather than at the front or at the last release; the order is the same.
    if (key.time != rec.node.key.time) {
      if (grp.lru.contains(p)) grp.lru.erase(p);
      rec.node.key.time = key.time;
    }
    return;
  }
  const LargePageId lp = grp.large_of(p);
  if (!rec.hashed) {
    rec.node.key.time = key.time;  // never listed
    if (rec.copy) {                // its cached twin is still in use: it stays the cached one
      copies_.erase(g, rec.hash, p);
      rec.copy = 0;
      --num_copies_;
    }
    free_uncached(g, p);
    return;
  }
  if (num_copies_ > 0) [[unlikely]] {
    if (const PageId d = copies_.find(g, rec.hash, hash_of()); d != kNullPage) {
      hand_over(g, p, d);
      return;
    }
  }
  if (grp.lru.contains(p)) {  // its stale entry from a lazy pin
    // Key and level unchanged (a hit that was never used): the entry is already where a
    // new insert would put it among other keys, so it is revived in place, O(1).
    if (!(rec.node.key == key) || rec.prio != prio) {
      grp.lru.erase(p);
      grp.lru.insert(p, key, prio);
      rec.seq = ++seq_;
    }
  } else {
    grp.lru.insert(p, key, prio);
    rec.seq = ++seq_;
  }
  rec.prio = static_cast<std::uint8_t>(prio);
  ++grp.evictable;
  ev_add(lp, grp.n);
  // lp is g's (p was allocated): wholly evictable iff every small page is; mixed needs n > 1.
  // A one-page large page is listed by its page's entry alone.
  if (grp.n > 1 && (ev_in_large_[lp.index] == grp.n || mixed(lp))) refresh_large(g, lp);
}

void PageStore::free_uncached(GroupId g, PageId p) {
  Group& grp = groups_[g];
  const LargePageId lp = grp.large_of(p);
  grp.alloc.free(p);
  // The large page may now hold only cached pages and free small pages (or be back in the
  // pool: no entry may outlive that). One-page large pages are never listed there.
  if (grp.n > 1 && (mixed(lp) || (pool_.owner_unchecked(lp) == kNoGroup &&
                                  (large_lru_.contains(lp.index) || mixed_lru_.contains(lp.index)))))
    refresh_large(g, lp);
}

void PageStore::hand_over(GroupId g, PageId o, PageId d) {
  Group& grp = groups_[g];
  PageRec& ro = grp.pg[o];
  PageRec& rd = grp.pg[d];
  const BlockHash h = ro.hash;
  if (grp.lru.contains(o)) grp.lru.erase(o);  // its stale entry from a lazy pin
  index_.erase(g, h, o);
  ro.hashed = 0;
  ++uncached_;
  copies_.erase(g, h, d);
  rd.copy = 0;
  --num_copies_;
  if (index_.insert(g, h, d, hash_of())) {
    rd.hashed = 1;
    rd.partial = ro.partial;
    events_.moved(g, o, d, h);
  } else {
    events_.removed(g, o, h, grp.announced() && !ro.partial);  // adversarial hashes only: a probe run too long
  }
  free_uncached(g, o);
}

void PageStore::release_row(GroupId g, std::span<const PageId> pages, std::uint64_t t, std::uint32_t prio) {
  const Group& grp = groups_[g];
  for (std::size_t i = pages.size(); i-- > 0;) {
    if (i >= kReleaseAhead && pages[i - kReleaseAhead] != kNullPage)
      prefetch_release(*this, grp, pages[i - kReleaseAhead]);
    if (pages[i] != kNullPage) release(g, pages[i], t, prio);
  }
}

void PageStore::evict_small(GroupId g, PageId p) {
  Group& grp = groups_[g];
  grp.lru.erase(p);
  const LargePageId lp = grp.large_of(p);
  if (grp.n > 1) {
    if (large_lru_.contains(lp.index)) large_lru_.erase(lp.index);
    if (mixed_lru_.contains(lp.index)) mixed_lru_.erase(lp.index);
  }
  ev_sub(lp, grp.n);
  --grp.evictable;
  index_.erase(g, grp.pg[p].hash, p);
  grp.pg[p].hashed = 0;
  ++uncached_;
  if (evicted_keys_.enabled()) [[unlikely]]
    evicted_keys_.put(KeyTable::of(g, grp.pg[p].hash));
  events_.removed(g, p, grp.pg[p].hash, grp.announced() && !grp.pg[p].partial);
  ++grp.evicted;
  grp.alloc.free(p);
}

void PageStore::drop_cached(GroupId g, PageId p) {
  const Group& grp = groups_[g];
  if (grp.pg[p].ref != 0 || !grp.pg[p].hashed) return;
  evict_small(g, p);
  if (const LargePageId lp = grp.large_of(p); grp.n > 1 && pool_.owner_unchecked(lp) == g) refresh_large(g, lp);
}

void PageStore::evict_large(LargePageId lp) {
  const GroupId g = pool_.owner(lp);
  const Group& grp = groups_[g];
  for (PageId s = grp.first_small(lp); s < grp.first_small(lp) + grp.n; ++s) {
    if (!grp.alloc.is_allocated(s)) continue;
    if (grp.pg[s].ref > 0) fail("internal: evicting large page {} with used small page {}", lp.index, s);
    evict_small(g, s);
  }
}

void PageStore::forget_all() {
  events_.begin_clear();
  ++uncached_;
  for (Group& grp : groups_)
    for (PageRec& rec : grp.pg)
      if (rec.copy) {
        rec.copy = 0;
        --num_copies_;
      }
  copies_.clear();
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    for (PageId s = small_front(g); s != kNullPage; s = small_front(g)) evict_small(g, s);
    for (PageId p = 0; p < grp.pg.size(); ++p) {
      if (!grp.pg[p].hashed) continue;
      if (grp.lru.contains(p)) grp.lru.erase(p);  // stale entries of pinned pages
      const std::uint32_t lp = grp.large_of(p).index;
      if (large_lru_.contains(lp)) large_lru_.erase(lp);
      if (mixed_lru_.contains(lp)) mixed_lru_.erase(lp);
      index_.erase(g, grp.pg[p].hash, p);
      grp.pg[p].hashed = 0;
      events_.removed(g, p, grp.pg[p].hash, grp.announced() && !grp.pg[p].partial);
    }
  }
  events_.end_clear();
}

// Stale entries are dropped as the fronts would drop them; pages the replay already
// evicted, or took a free small page of (the real run makes those stale only when it gets
// there), are skipped. A one-page group's entry is stale exactly when its large page is
// not wholly evictable (see source_front).
template <class Lru>
LargePageId PageStore::replay_next(Lru& lru, LargePageId lp, bool mixed_list) {
  for (;;) {
    if (lp == kNoLargePage) return lp;
    const bool stale = mixed_list ? !mixed(lp) : !full_evictable(lp);
    if (!stale && !replay_skips(lp)) return lp;
    lp = LargePageId{stale ? drop_stale(lru, lp.index) : lru.after(lp.index)};
  }
}

LargePageId PageStore::replay_source_next(std::uint32_t src, LargePageId lp) {
  return src == 0 ? replay_next(large_lru_, lp, false) : replay_next(groups_[single_[src - 1]].lru, lp, false);
}

LargePageId PageStore::replay_mixed_next(LargePageId lp) { return replay_next(mixed_lru_, lp, true); }

}  // namespace kvmm::detail
