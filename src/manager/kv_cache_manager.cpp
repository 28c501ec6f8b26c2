#include "kvmm/manager/kv_cache_manager.hpp"

#include "../caching/block_hash_detail.hpp"
#include "kvmm/checked.hpp"
#include "kvmm/error.hpp"

#include <algorithm>
#include <numeric>
#include <tuple>
#include <type_traits>
#include <utility>

namespace kvmm {

namespace {

std::uint64_t total_small_pages(const KVLayout& layout, std::uint32_t large_pages) {
  std::uint64_t total = 0;
  for (GroupId g = 0; g < layout.num_groups(); ++g)
    total += std::uint64_t{large_pages} * layout.small_pages_per_large_page(g);
  return total;
}

std::uint64_t splitmix(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Probes one decoder group's prefix index with the request's precomputed page hashes,
// remembering every answer (page id or null) so repeated candidates cost an array read and
// the pinning pass needs no second lookup. A neighbour's known page +-1 is tried first (a
// prefix cached by one prefill sits in consecutive ids; hashed with an equal hash is the
// index's own answer, see probe_full_attention); else the index. Lines are requested
// ahead in the direction of the scan.
constexpr PageId kUnknown = kNullPage - 1;
// Cached: holds(p, h) when page p is cached under hash h; the index's hash_of.
template <class Cached>
class IndexProbe final : public PageProbe {
 public:
  IndexProbe(const PrefixIndex& index, GroupId g, const std::vector<BlockHash>& hashes,
             std::vector<PageId>& memo, Cached cached)
      : index_(index), g_(g), hashes_(hashes), memo_(memo), cached_(cached) {}
  bool hit(std::uint64_t i) override { return page(i) != kNullPage; }
  PageId page(std::uint64_t i) {
    if (i >= memo_.size() || i >= hashes_.size()) return kNullPage;
    if (memo_[i] == kUnknown) memo_[i] = find(i);
    return memo_[i];
  }

 private:
  bool holds(std::uint64_t p, const BlockHash& h) const { return cached_.holds(p, h); }
  PageId find(std::uint64_t i) const {
    const BlockHash& h = hashes_[i];
    const bool down = i + 1 < memo_.size() && memo_[i + 1] < kUnknown;
    const bool up = i > 0 && memo_[i - 1] < kUnknown;
    prefetch_ahead(i, down, up);
    if (down && memo_[i + 1] > 0 && holds(memo_[i + 1] - 1, h)) return memo_[i + 1] - 1;
    if (up && holds(std::uint64_t{memo_[i - 1]} + 1, h)) return memo_[i - 1] + 1;
    return index_.find(g_, h, cached_);
  }
  // Scans run page by page up or down (a known neighbour tells which way; else both):
  // 16 pages on, the index slot; 8 on, the records its fingerprints point at, and the
  // record the consecutive-id guess points at.
  void prefetch_ahead(std::uint64_t i, bool down, bool up) const {
    const std::uint64_t n = hashes_.size();
    auto load = [this](PageId c) { cached_.prefetch(c); };
    if (!down) {
      if (i + 16 < n) index_.prefetch(g_, hashes_[i + 16]);
      if (i + 8 < n) index_.for_candidates(g_, hashes_[i + 8], load);
      if (up && memo_[i - 1] + 9 < cached_.size()) load(memo_[i - 1] + 9);
    }
    if (!up) {
      if (i >= 16) index_.prefetch(g_, hashes_[i - 16]);
      if (i >= 8) index_.for_candidates(g_, hashes_[i - 8], load);
      if (down && memo_[i + 1] >= 9) load(memo_[i + 1] - 9);
    }
  }
  const PrefixIndex& index_;
  GroupId g_;
  const std::vector<BlockHash>& hashes_;
  std::vector<PageId>& memo_;
  Cached cached_;
};

}  // namespace

KVCacheManager::Group::Group(const KVLayout& layout, GroupId g, LargePagePool& pool,
                             LargePagePool& host_pool, std::uint32_t max_requests)
    : spec(layout.group(g)),
      P(spec.tokens_per_page),
      n(layout.small_pages_per_large_page(g)),
      decoder(spec.is_decoder()),
      hash_class(0),
      policy(decoder ? make_policy(spec) : nullptr),
      alloc(g, n, pool, max_requests),
      table(max_requests, P),
      host_alloc(g, n, host_pool, max_requests),
      host_table(max_requests, P),
      pg(std::size_t{pool.capacity()} * n),
      lru(pool.capacity() * n, {pg.data()}),
      host_hashed(std::size_t{host_pool.capacity()} * n, 0),
      host_hash(std::size_t{host_pool.capacity()} * n),
      host_len(std::size_t{host_pool.capacity()} * n, 0) {
  image.release_when_consumed = spec.kind == LayerKind::kVisionEmbedding;
  full_attention = decoder && spec.kind == LayerKind::kFullAttention;
}

// The options, checked before any member allocates: every count the constructor sizes an
// array by must fit (page ids are 32-bit; the prefix index holds fewer than 2^31 pages).
KVLayout KVCacheManager::validated(KVLayout layout, const KVCacheManagerOptions& options) {
  if (options.num_large_pages == 0) fail("num_large_pages = 0: must be >= 1");
  if (options.max_requests == 0 || options.max_requests > kMaxRequests)
    fail("max_requests = {}: must be in [1, {}]", options.max_requests, kMaxRequests);
  std::uint64_t per_large = 0;
  for (GroupId g = 0; g < layout.num_groups(); ++g) per_large += layout.small_pages_per_large_page(g);
  const std::uint64_t limit = (std::uint64_t{1} << 31) - 1;
  for (const auto& [name, n] : {std::pair{"num_large_pages", options.num_large_pages},
                                std::pair{"num_host_large_pages", options.num_host_large_pages}}) {
    const std::uint64_t small = std::uint64_t{n} * per_large;  // < 2^32 * 2^32: no overflow
    if (small > limit)
      fail("{} = {}: {} small pages per large page make {} small pages, more than the {} a manager holds",
           name, n, per_large, small, limit);
  }
  return layout;
}

KVCacheManager::KVCacheManager(KVLayout layout, const KVCacheManagerOptions& options) try
    : layout_(validated(std::move(layout), options)),
      options_(options),
      pool_(options.num_large_pages),
      host_pool_(options.num_host_large_pages),
      large_(options.num_large_pages),
      ev_in_large_(options.num_large_pages, 0),
      large_lru_(options.num_large_pages, {large_.data()}, 0),
      mixed_lru_(options.num_large_pages, {large_.data()}, 1),
      index_(total_small_pages(layout_, options.num_large_pages),
             static_cast<std::uint32_t>(std::max<std::size_t>(layout_.num_groups(), 1))),
      rng_(options.seed) {
  const auto G = static_cast<GroupId>(layout_.num_groups());
  groups_.reserve(G);
  for (GroupId g = 0; g < G; ++g) {
    groups_.emplace_back(layout_, g, pool_, host_pool_, options.max_requests);
    Group& grp = groups_.back();
    if (!grp.decoder) continue;
    auto it = std::find(class_tokens_.begin(), class_tokens_.end(), grp.P);
    grp.hash_class = static_cast<std::uint32_t>(it - class_tokens_.begin());
    if (it == class_tokens_.end()) class_tokens_.push_back(grp.P);
  }
  source_.assign(G, 0);
  for (GroupId g = 0; g < G; ++g) {
    if (groups_[g].n != 1) continue;
    single_.push_back(g);
    source_[g] = static_cast<std::uint32_t>(single_.size());
  }
  vpos_.assign(num_sources(), kNullPage);
  rpos_.assign(num_sources(), kNullPage);
  reqs_.resize(options.max_requests);
  for (Request& q : reqs_) {
    q.lo.assign(G, 0);
    q.registered.assign(G, 0);
    q.hashes.resize(class_tokens_.size());
    q.item_page.resize(G);
  }
  free_ids_.reserve(options.max_requests);
  for (RequestId r = options.max_requests; r-- > 0;) free_ids_.push_back(r);
  need_.assign(G, 0);
  cow_.assign(G, 0);
  slot_units_ = 1;
  for (const Group& grp : groups_) {
    slot_units_ = std::lcm(slot_units_, std::uint64_t{grp.n});
    if (slot_units_ > (std::uint64_t{1} << 24)) {  // products must stay below 2^64
      slot_units_ = 0;
      break;
    }
  }
  sim_a_.assign(G, 0);
  sim_f_.assign(G, 0);
  sim_e_.assign(G, 0);
  probe_memo_.resize(G);
  first_miss_.assign(G, kNotFused);
  accepted_.assign(G, 0);
  copies_.reserve(256);
  events_.reserve(options.record_events ? 4096 : 0);
} catch (const std::bad_alloc&) {
  fail("num_large_pages = {}, num_host_large_pages = {}, max_requests = {}: the manager's metadata does not "
       "fit in memory (about 200 bytes per small page and 100 per request slot)",
       options.num_large_pages, options.num_host_large_pages, options.max_requests);
}

// ---------------------------------------------------------------- small helpers

GroupId KVCacheManager::check_group(GroupId g) const {
  if (g >= groups_.size()) fail("group = {}: layout has {} groups", g, groups_.size());
  return g;
}

void KVCacheManager::bad_request(RequestId r) const {
  if (r >= reqs_.size()) fail("request = {}: out of range, max_requests is {}", r, reqs_.size());
  fail("request = {}: not an active request", r);
}

const KVCacheManager::Request& KVCacheManager::req(RequestId r) const {
  if (!is_active(r)) bad_request(r);
  return reqs_[r];
}

KVCacheManager::Request& KVCacheManager::active_req(RequestId r) {
  if (!is_active(r)) bad_request(r);
  return reqs_[r];
}

KVCacheManager::Request& KVCacheManager::running(RequestId r) {
  if (!is_active(r)) bad_request(r);
  if (reqs_[r].swapped) fail("request = {}: swapped out (swap_in first)", r);
  return reqs_[r];
}

void KVCacheManager::set_policy(GroupId g, std::unique_ptr<LayerPolicy> policy) {
  Group& grp = groups_[check_group(g)];
  if (!policy) fail("policy = null: group {} needs a policy", g);
  if (!grp.decoder) fail("group = {}: {} holds encoder tokens; its policy is fixed", g, grp.spec.name);
  if (policy->tokens_per_page() != grp.P)
    fail("policy tokens_per_page = {}: group {} has {}", policy->tokens_per_page(), g, grp.P);
  if (num_active_ != 0) fail("set_policy: {} requests are active; set policies first", num_active_);
  grp.full_attention = dynamic_cast<const FullAttentionPolicy*>(policy.get()) != nullptr;
  grp.policy = std::move(policy);
}

const LayerPolicy& KVCacheManager::policy(GroupId g) const {
  const Group& grp = groups_[check_group(g)];
  if (!grp.decoder) fail("group = {}: encoder-token group has an ImagePolicy", g);
  return *grp.policy;
}

std::uint64_t KVCacheManager::begin_step() {
  copies_.clear();
  return ++step_;
}

void KVCacheManager::take_events(std::vector<CacheEvent>& out) {
  out.clear();
  std::swap(out, events_);
}

std::span<const PageId> KVCacheManager::page_table(RequestId r, GroupId g) const {
  req(r);
  return groups_[check_group(g)].table.pages(r);
}

std::span<const PageId> KVCacheManager::host_page_table(RequestId r, GroupId g) const {
  req(r);
  return groups_[check_group(g)].host_table.pages(r);
}

PageState KVCacheManager::page_state(GroupId g, PageId p) const {
  const Group& grp = groups_[check_group(g)];
  if (p >= grp.pg.size()) fail("page = {}: group {} has {} small pages", p, g, grp.pg.size());
  if (grp.pg[p].ref > 0) return PageState::kUsed;
  return grp.lru.contains(p) ? PageState::kEvictable : PageState::kEmpty;
}

std::uint32_t KVCacheManager::ref_count(GroupId g, PageId p) const {
  const Group& grp = groups_[check_group(g)];
  if (p >= grp.pg.size()) fail("page = {}: group {} has {} small pages", p, g, grp.pg.size());
  return grp.pg[p].ref;
}

EvictionKey KVCacheManager::eviction_key(GroupId g, PageId p) const {
  page_state(g, p);
  return groups_[g].pg[p].node.key;
}

std::optional<BlockHash> KVCacheManager::page_hash(GroupId g, PageId p) const {
  page_state(g, p);
  if (!groups_[g].pg[p].hashed) return std::nullopt;
  return groups_[g].pg[p].hash;
}

// ---------------------------------------------------------------- hashing

void KVCacheManager::ensure_hashes(Request& q, std::uint32_t cls, std::uint64_t pages) {
  std::vector<BlockHash>& hv = q.hashes[cls];
  const std::uint32_t P = class_tokens_[cls];
  if (hv.size() >= pages) return;
  if (hv.size() * P < q.token_base)
    fail("internal: request ids before {} dropped, class {} hashed {} pages", q.token_base, cls, hv.size());
  // tokens[i] is position token_base + i.
  const std::span<const std::uint32_t> tail(q.tokens);
  const std::uint64_t base = q.token_base;
  auto ids = [&](std::uint64_t start, std::uint64_t len) { return tail.subspan(start - base, len); };
  const std::span<const MultimodalItem> items(q.items);
  if (items.empty() && (!hv.empty() || q.salt.empty())) {
    // Plain text pages: one bulk pass.
    const std::size_t from = hv.size();
    detail::append_page_hashes(hv, ids(from * P, (pages - from) * P), P, q.lora, pages - from, nullptr);
    return;
  }
  for (std::uint64_t i = hv.size(); i < pages; ++i) {
    const std::uint64_t start = i * P, end = start + P;
    const BlockHash parent = i > 0 ? hv[i - 1] : BlockHash{};
    PageExtraKeys ex;
    ex.lora_id = q.lora;
    if (i == 0) ex.salt = q.salt;
    auto it = std::partition_point(items.begin(), items.end(), [&](const MultimodalItem& m) {
      return m.offset + m.length <= start;
    });
    if (it != items.end() && it->offset < end) {
      ex.item = &*it;
      ex.item_offset = start - it->offset;  // wraps when the item starts inside the page
      ++it;
    }
    BlockHash h = hash_page(parent, ids(start, P), ex);
    for (; it != items.end() && it->offset < end; ++it) {
      PageExtraKeys more;
      more.item = &*it;
      more.item_offset = start - it->offset;
      h = hash_page(h, {}, more);
    }
    hv.push_back(h);
  }
}

// The pages FullAttentionPolicy examines: group g's prefix probed with the request's page
// hashes [0, pages) up to the first miss, each hit page recorded in probe_memo_[g].
// Returns the first miss (pages when every page hits). O(pages probed).
// A prefix cached by one prefill mostly sits in consecutive page ids, so the page after
// the previous hit is tried first: pg[p].hashed with pg[p].hash == h means the index maps h to p
// (check_invariants), the same answer as index_.find, from arrays read in order instead
// of a random index slot per page. Otherwise the index answers.
std::uint64_t KVCacheManager::probe_full_attention(const Request& q, GroupId g, std::uint64_t pages) {
  std::vector<PageId>& memo = probe_memo_[g];
  if (memo.size() < pages) memo.resize(pages);  // grows once per longest prompt
  const Group& grp = groups_[g];
  const BlockHash* hv = q.hashes[grp.hash_class].data();
  const Group::PageRec* rec = grp.pg.data();
  const std::uint64_t num_pages = grp.pg.size();
  PageId* out = memo.data();
  std::uint64_t next = num_pages;  // candidate: the page after the previous hit
  // A prefix's pages often come in short runs of consecutive ids (one large page's
  // slots), so every few pages the index answers: while it did within the last 16 pages,
  // its slots are requested 16 pages ahead and, 8 ahead, the records their fingerprints
  // point at. A prefix in one long run (one prefill into fresh pages) skips all that.
  constexpr std::uint64_t kAhead = 16;
  const Cached in_group = cached(grp);
  auto load = [&in_group](PageId c) { in_group.prefetch(c); };
  std::uint64_t i = 0, last_index = 0;
  for (; i < pages; ++i) {
    if (i < last_index + kAhead) {
      if (i + kAhead < pages) index_.prefetch(g, hv[i + kAhead]);
      if (i + kAhead / 2 < pages) index_.for_candidates(g, hv[i + kAhead / 2], load);
    }
    PageId page;
    if (next < num_pages && rec[next].hashed && rec[next].hash == hv[i]) {
      page = static_cast<PageId>(next);
    } else {
      last_index = i;
      page = index_.find(g, hv[i], in_group);
      if (page == kNullPage) break;
    }
    out[i] = page;
    next = std::uint64_t{page} + 1;
  }
  return i;
}

BlockHash KVCacheManager::item_page_hash(const Request& q, std::uint32_t item,
                                         std::uint64_t page_in_item) const {
  return hash_item_page(q.items[item].hash, static_cast<std::uint32_t>(page_in_item), q.lora);
}

// ---------------------------------------------------------------- page states

void KVCacheManager::init_page(GroupId g, PageId p, std::uint64_t prefix_len) {
  Group::PageRec& rec = groups_[g].pg[p];  // an empty page: never listed
  rec.ref = 1;
  rec.hashed = 0;
  rec.node.key = EvictionKey{step_, prefix_len};
  rec.prio = 0;
}

void KVCacheManager::register_page(GroupId g, PageId p, const BlockHash& h) {
  Group& grp = groups_[g];
  if (!options_.prefix_caching || grp.pg[p].hashed) return;
  if (!index_.insert(g, h, p, page_hash_of())) return;  // same content cached already: p stays private
  grp.pg[p].hashed = 1;
  grp.pg[p].hash = h;
  record(CacheEventKind::kStored, g, p, h);
}

// Lazy pinning: a hit page leaves the LRUs only in the counts; its list entry (and its
// large page's) turns stale (ref > 0, or a large page with a used small page) and is
// dropped by whoever meets it at a front, or replaced when the page is released again.
void KVCacheManager::acquire_cached(GroupId g, PageId p) {
  Group& grp = groups_[g];
  if (grp.pg[p].ref == 0) {
    ev_sub(p / grp.n, grp.n);
    --grp.evictable;
  }
  ++grp.pg[p].ref;
}

PageId KVCacheManager::small_front(GroupId g) const {
  const Group& grp = groups_[g];
  PageId s = grp.lru.front();
  for (; s != kNullPage && grp.pg[s].ref > 0; s = grp.lru.front()) {
    grp.lru.erase(s);
    mutated();
  }
  return s;
}

bool KVCacheManager::victim_before(std::uint32_t sa, PageId a, std::uint32_t sb, PageId b) const {
  auto node = [this](std::uint32_t src, PageId id) -> std::pair<const LruNode*, std::uint64_t> {
    if (src == 0) return {&large_[id].node, large_[id].seq};
    const Group::PageRec& rec = groups_[single_[src - 1]].pg[id];
    return {&rec.node, rec.seq};
  };
  const auto [x, xs] = node(sa, a);
  const auto [y, ys] = node(sb, b);
  if (x->level != y->level) return x->level < y->level;
  if (!(x->key == y->key)) return evicted_before(x->key, y->key);
  return xs < ys;
}

// A one-page group's entry is stale exactly when its page is pinned; its large page is then
// not wholly evictable either, so stale_large tells for every source.
PageId KVCacheManager::source_front(std::uint32_t src) const {
  if (src > 0) return small_front(single_[src - 1]);
  PageId lp = large_lru_.front();
  for (; lp != kNullPage && stale_large(lp); lp = large_lru_.front()) {
    large_lru_.erase(lp);
    mutated();
  }
  return lp;
}

PageId KVCacheManager::source_after(std::uint32_t src, PageId id) const {
  return src == 0 ? large_lru_.after(id) : groups_[single_[src - 1]].lru.after(id);
}

template <class At>
PageId KVCacheManager::earliest(At at, std::uint32_t& src) const {
  PageId best = kNullPage;
  src = 0;
  for (std::uint32_t s = 0; s < num_sources(); ++s) {
    const PageId id = at(s);
    if (id != kNullPage && (best == kNullPage || victim_before(s, id, src, best))) {
      best = id;
      src = s;
    }
  }
  return best;
}

PageId KVCacheManager::large_front(std::uint32_t& src) const {
  return earliest([this](std::uint32_t s) { return source_front(s); }, src);
}

PageId KVCacheManager::mixed_front() const {
  PageId lp = mixed_lru_.front();
  for (; lp != kNullPage && stale_mixed(lp); lp = mixed_lru_.front()) {
    mixed_lru_.erase(lp);
    mutated();
  }
  return lp;
}

// The key and level a wholly evictable or mixed large page is listed under: its most
// recent cached small page (Jenga §5.4 step 3; empty slots hold nothing and have no age)
// and the highest retention priority among them. Its allocated small pages are exactly
// its evictable ones, so the records alone tell (no allocator read). O(n).
std::pair<EvictionKey, std::uint32_t> KVCacheManager::large_entry(GroupId g, PageId lp) const {
  const Group& grp = groups_[g];
  bool any = false;
  EvictionKey best;
  std::uint32_t level = 0;
  for (PageId s = lp * grp.n; s < (lp + 1) * grp.n; ++s) {
    const Group::PageRec& rec = grp.pg[s];
    if (rec.ref != 0 || !grp.lru.contains(s)) continue;
    if (!any || evicted_before(best, rec.node.key)) best = rec.node.key;
    level = std::max<std::uint32_t>(level, rec.prio);
    any = true;
  }
  return {best, level};
}

// Files lp in the list its state calls for. An entry already there under the same key and
// level (a stale one revived: its pages were pinned by a hit, now released unchanged) stays
// in place, as small pages' entries do, so a hit that is never admitted leaves the order.
// Groups with n > 1 only: a one-page group's small-page LRU is its step-3 source.
void KVCacheManager::refresh_large(GroupId g, PageId lp) {
  LargeLru* to = full_evictable(lp) ? &large_lru_ : mixed(lp) ? &mixed_lru_ : nullptr;
  EvictionKey key;
  std::uint32_t level = 0;
  if (to != nullptr) std::tie(key, level) = large_entry(g, lp);
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

// What release_page reads of page p: started a few pages ahead in the loops that walk a
// page table, so the misses on these separate arrays overlap.
void KVCacheManager::prefetch_release(GroupId g, PageId p) const {
  const Group& grp = groups_[g];
  __builtin_prefetch(&grp.pg[p], 1);
  const PageId lp = p / grp.n;
  if (grp.n > 1) {  // one-page large pages: neither record is read
    __builtin_prefetch(&pool_.slot(lp));
    __builtin_prefetch(&large_[lp], 1);
  }
  __builtin_prefetch(&ev_in_large_[lp], 1);
}

void KVCacheManager::release_page(GroupId g, PageId p, std::uint64_t t, std::uint32_t prio) {
  Group& grp = groups_[g];
  Group::PageRec& rec = grp.pg[p];
  if (rec.ref == 0) fail("internal: group {} page {} released with reference count 0", g, p);
  const EvictionKey key{std::max(rec.node.key.time, t), rec.node.key.prefix_len};
  if (--rec.ref > 0) {
    // Still held: the access counts. A stale entry (lazy pin) keyed by the old time leaves
    // the list now rather than at the front or at the last release; the order is the same.
    if (key.time != rec.node.key.time) {
      if (grp.lru.contains(p)) grp.lru.erase(p);
      rec.node.key.time = key.time;
    }
    return;
  }
  const PageId lp = p / grp.n;
  if (!rec.hashed) {
    rec.node.key.time = key.time;  // never listed
    grp.alloc.free(p);
    // The large page may now hold only cached pages and empty slots (or be back in the
    // pool: no entry may outlive that). One-page large pages are never listed there.
    if (grp.n > 1 &&
        (mixed(lp) || (pool_.slot(lp).owner == kNoGroup && (large_lru_.contains(lp) || mixed_lru_.contains(lp)))))
      refresh_large(g, lp);
    return;
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
  // lp is g's (p was allocated): wholly evictable iff every slot is; mixed needs n > 1.
  // A one-page large page is listed by its page's entry alone.
  if (grp.n > 1 && (ev_in_large_[lp] == grp.n || mixed(lp))) refresh_large(g, lp);
}

void KVCacheManager::evict_small(GroupId g, PageId p) {
  Group& grp = groups_[g];
  grp.lru.erase(p);
  const PageId lp = p / grp.n;
  if (grp.n > 1) {
    if (large_lru_.contains(lp)) large_lru_.erase(lp);
    if (mixed_lru_.contains(lp)) mixed_lru_.erase(lp);
  }
  ev_sub(lp, grp.n);
  --grp.evictable;
  index_.erase(g, grp.pg[p].hash, p);
  grp.pg[p].hashed = 0;
  record(CacheEventKind::kRemoved, g, p, grp.pg[p].hash);
  ++grp.evicted;
  grp.alloc.free(p);
}

// Step 3 evicts in runs down the large-page LRU, and each victim's records (its large
// page, small pages, allocator slots, LRU neighbours, index slots) sit in separate random
// lines: loaded serially, a victim costs several memory latencies. So the entries after
// the front are kept in a ring (a hint: the LRU alone decides) and their lines are
// requested in stages as they approach, each stage reading only what an earlier one
// requested. `front` is the victim about to be evicted, from source `front_src`; the ring
// continues the merge of the sources from vpos_, each source's next entry.
void KVCacheManager::prefetch_victims(PageId front, std::uint32_t front_src, GroupId taker) {
  constexpr std::uint32_t K = kVictimsAhead;
  const std::uint32_t S = num_sources();
  auto at = [this](std::uint32_t k) -> PageId& { return victims_[(vfirst_ + k) % K]; };
  while (vcount_ > 0) {  // entries up to the front left the list (evicted or stale)
    const PageId v = at(0);
    vfirst_ = (vfirst_ + 1) % K;
    --vcount_;
    if (v == front) break;
  }
  // A ring that lost the front starts again from the fronts (the other sources' fronts come
  // after `front`: large_front compared them). An entry that left its list since is not
  // looked for: after() still yields page ids (or none), and a wrong guess only costs a
  // prefetch until the ring runs dry.
  if (vcount_ == 0)
    for (std::uint32_t s = 0; s < S; ++s) vpos_[s] = s == front_src ? source_after(s, front) : source_front(s);
  // A source's next entry: its list node (the large page's or, for a one-page group, the
  // small page's record) and the pool's record.
  auto request = [this](std::uint32_t src, PageId id) {
    if (src == 0) __builtin_prefetch(&large_[id]);
    else __builtin_prefetch(&groups_[single_[src - 1]].pg[id]);
    __builtin_prefetch(&pool_.slot(id));
  };
  // Stage 1, new entries, the earliest next entry of the sources; that source's next one
  // is requested. Up to two per call, so the ring catches up after a reset while each
  // hop's node was requested a call earlier.
  for (int step = 0; step < 2 && vcount_ < K; ++step) {
    std::uint32_t src;
    const PageId next = earliest([this](std::uint32_t s) { return vpos_[s]; }, src);
    if (next == kNullPage) break;
    at(vcount_++) = next;
    vpos_[src] = source_after(src, next);
    if (vpos_[src] != kNullPage) request(src, vpos_[src]);
  }
  // Stage 2, halfway: the owner is known now; the small pages' records and slots, and
  // the records the taking group will write when the page comes back to it.
  if (vcount_ > K / 2) {
    const PageId v = at(K / 2);
    const GroupId h = pool_.slot(v).owner;
    if (h != kNoGroup) {
      const Group& gh = groups_[h];
      for (PageId s = v * gh.n; s < (v + 1) * gh.n && s < v * gh.n + 8; ++s) {
        __builtin_prefetch(&gh.pg[s]);
        gh.alloc.prefetch(s);
      }
    }
    if (h != taker) {
      const Group& gt = groups_[taker];
      for (PageId s = v * gt.n; s < (v + 1) * gt.n && s < v * gt.n + 8; ++s) __builtin_prefetch(&gt.pg[s], 1);
    }
  }
  // Stage 3, the next victim: its index slots and its small pages' LRU neighbours.
  if (vcount_ > 0) {
    const PageId v = at(0);
    const GroupId h = pool_.slot(v).owner;
    if (h != kNoGroup) {
      const Group& gh = groups_[h];
      for (PageId s = v * gh.n; s < (v + 1) * gh.n && s < v * gh.n + 8; ++s) {
        const Group::PageRec& rec = gh.pg[s];
        if (!rec.hashed) continue;
        index_.prefetch(h, rec.hash);
        if (rec.node.prev != LruNode::kNone) __builtin_prefetch(&gh.pg[rec.node.prev]);
        if (rec.node.next != LruNode::kNone) __builtin_prefetch(&gh.pg[rec.node.next]);
      }
    }
  }
}

// Evicts every cached small page of a large page with no used one; the last one returns
// it to the pool (its other slots are empty).
void KVCacheManager::evict_large(PageId lp) {
  const GroupId g = pool_.owner(lp);
  const Group& grp = groups_[g];
  for (PageId s = lp * grp.n; s < (lp + 1) * grp.n; ++s) {
    if (!grp.alloc.is_allocated(s)) continue;
    if (grp.pg[s].ref > 0) fail("internal: evicting large page {} with used small page {}", lp, s);
    evict_small(g, s);
  }
}

// Jenga §5.4, in order: (1) a free small page associated with r, (2) an empty large
// page, (3) evict the LRU evictable large page, (4) any free small page of the group,
// (5) evict the group's LRU small page; then, where Jenga would fail, (6) reclaim the
// LRU large page of another group that holds cached and empty but no used small pages.
PageId KVCacheManager::take_page(GroupId g, RequestId r) {
  SmallPageAllocator& a = groups_[g].alloc;
  if (const PageId p = a.try_associated(r); p != kNullPage) return p;
  if (const PageId p = a.try_fresh(r); p != kNullPage) return p;
  std::uint32_t src;
  if (const PageId lp = large_front(src); lp != kNullPage) {
    prefetch_victims(lp, src, g);
    evict_large(lp);
    if (const PageId p = a.try_fresh(r); p != kNullPage) return p;
  }
  if (const PageId p = a.try_any(); p != kNullPage) return p;
  if (const PageId s = small_front(g); s != kNullPage) {
    if (const PageId next = groups_[g].lru.after(s); next != kNullPage && groups_[g].pg[next].hashed)
      index_.prefetch(g, groups_[g].pg[next].hash);
    evict_small(g, s);
    if (const PageId p = a.try_associated(r); p != kNullPage) return p;
    if (const PageId p = a.try_any(); p != kNullPage) return p;
    return a.try_fresh(r);
  }
  if (const PageId lp = mixed_front(); lp != kNullPage) {
    evict_large(lp);
    return a.try_fresh(r);
  }
  return kNullPage;
}

// The replay's next step-3 (a source) or step-6 (mixed_lru_) victim from lp on: stale
// entries are dropped as the fronts would drop them; pages the replay already evicted,
// or took an empty slot of (the real run makes those stale only when it gets there),
// are skipped. A one-page group's entry is stale exactly when its large page is not
// wholly evictable (see source_front).
template <class Lru>
PageId KVCacheManager::replay_next(Lru& lru, PageId lp) {
  bool mixed_list = false;
  if constexpr (std::is_same_v<Lru, LargeLru>) mixed_list = &lru == &mixed_lru_;
  for (;;) {
    if (lp == kNullPage) return lp;
    const bool stale = mixed_list ? stale_mixed(lp) : stale_large(lp);
    if (!stale && !replay_skips(lp)) return lp;
    const PageId next = lru.after(lp);
    if (stale) {
      lru.erase(lp);
      mutated();
    }
    lp = next;
  }
}

PageId KVCacheManager::source_replay_next(std::uint32_t src, PageId lp) {
  return src == 0 ? replay_next(large_lru_, lp) : replay_next(groups_[single_[src - 1]].lru, lp);
}

// Marks the mixed large pages that `takes` slot takes of group g fill, walking the list
// the allocator takes them from (r's associated pages for step 1, the group's pages for
// step 4, where r's own are already full) in its order, each until full.
void KVCacheManager::replay_spoil(GroupId g, RequestId r, PageId first, bool by_request, std::uint64_t takes) {
  for (PageId lp = first; lp != kNullPage && takes > 0;) {
    const LargePageSlot& L = pool_.slot(lp);
    const PageId next = by_request ? L.rnext : L.gnext;
    if (!replay_skips(lp) && (by_request || groups_[g].alloc.associated_request(lp) != r)) {
      takes -= std::min<std::uint64_t>(takes, L.free_count);
      if (mixed(lp)) large_[lp].replay = replay_epoch_;
    }
    lp = next == LargePageSlot::kNone ? kNullPage : next;
  }
}

int KVCacheManager::quick_feasible() const {
  // Sufficient, O(groups): group g needs at most ceil(need / n) large pages from steps 2
  // and 3 (each one's other slots then serve it by step 1), and step 3 comes before the
  // steps that could fail. Under memory pressure this answers almost every call.
  std::uint64_t large_needed = 0;
  for (GroupId g = 0; g < groups_.size(); ++g) large_needed += (need_[g] + groups_[g].n - 1) / groups_[g].n;
  if (large_needed <= std::uint64_t{pool_.num_free()} + num_full_ev_) return 1;
  // Necessary, O(groups): every page comes from a free slot, an evictable page or a free
  // large page, so more than all of those together (in 1/lcm(n) large-page units) cannot
  // be had. A blocked queue head, retried every step, is usually refused here.
  if (slot_units_ != 0) {
    std::uint64_t want = 0, have = std::uint64_t{pool_.num_free()} * slot_units_;
    for (GroupId g = 0; g < groups_.size(); ++g) {
      const std::uint64_t w = slot_units_ / groups_[g].n;
      want += need_[g] * w;
      have += (std::uint64_t{groups_[g].alloc.num_free_small()} + groups_[g].evictable) * w;
    }
    if (want > have) return 0;
  }
  return -1;
}

// Whether need_[g] pages per group can be had, exactly (allocate() has no rollback):
// O(groups) bounds first, else the replay.
bool KVCacheManager::feasible(RequestId r) {
  const int quick = quick_feasible();
#if KVMM_DEBUG_CHECKS
  if (quick >= 0 && replay_feasible(r) != (quick == 1))
    fail("debug check: quick feasibility answer {} differs from the replay for request {}", quick, r);
#endif
  return quick >= 0 ? quick == 1 : replay_feasible(r);
}

// Replays take_page's six steps on counters for need_[g] pages per group, in the order
// allocate() and swap_in() take them: true iff every page can be had. Exact, because
// allocate() has no rollback. O(pages needed + large pages touched); changes nothing
// but dropping stale LRU entries.
bool KVCacheManager::replay_feasible(RequestId r) {
  if (++replay_epoch_ == 0) {
    for (LargeRec& l : large_) l.replay = 0;
    replay_epoch_ = 1;
  }
  std::uint64_t pool = pool_.num_free();
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    sim_a_[g] = need_[g] > 0 ? grp.alloc.associated_free_small(r) : 0;
    sim_f_[g] = grp.alloc.num_free_small();
    sim_e_[g] = grp.evictable;
  }
  // Step 3's merged order: a cursor per source, the earliest of them next.
  for (std::uint32_t s = 0; s < num_sources(); ++s) rpos_[s] = source_front(s);
  auto rpos = [this](std::uint32_t s) { return rpos_[s]; };
  std::uint32_t src3 = 0;
  PageId mcursor = kNullPage;
  bool mixed_started = false;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const std::uint32_t n = groups_[g].n;
    if (need_[g] == 0) continue;
    // Step 1 serves first, from r's associated large pages; a mixed one it takes an empty
    // slot of is no longer step 6's to reclaim.
    replay_spoil(g, r, groups_[g].alloc.first_associated(r), true, std::min(need_[g], sim_a_[g]));
    std::uint64_t any_takes = 0;
    bool spoiled_any = false;  // step 4's takes all come before the group's first step 6
    for (std::uint64_t k = 0; k < need_[g]; ++k) {
      if (sim_a_[g] > 0) {
        --sim_a_[g];
        --sim_f_[g];
      } else if (pool > 0) {
        --pool;
        sim_a_[g] += n - 1;
        sim_f_[g] += n - 1;
      } else if (const PageId cursor = earliest(rpos, src3); cursor != kNullPage) {
        // A wholly evictable large page: no empty slot, not associated with a free one.
        const GroupId h = pool_.slot(cursor).owner;
        sim_e_[h] -= groups_[h].n;
        large_[cursor].replay = replay_epoch_;
        rpos_[src3] = source_replay_next(src3, source_after(src3, cursor));
        sim_a_[g] += n - 1;
        sim_f_[g] += n - 1;
      } else if (sim_f_[g] > 0) {
        --sim_f_[g];
        ++any_takes;
      } else if (sim_e_[g] > 0) {
        --sim_e_[g];
      } else {
        // Step 6: another group's large page of cached and empty slots; its empty slots
        // leave that group (and r's associated ones there, for a later group).
        if (!spoiled_any && any_takes > 0) {
          replay_spoil(g, r, groups_[g].alloc.first_with_free(), false, any_takes);
          spoiled_any = true;
        }
        if (!mixed_started) {
          mcursor = mixed_front();
          mixed_started = true;
        }
        mcursor = replay_next(mixed_lru_, mcursor);
        if (mcursor == kNullPage) return false;
        const GroupId h = pool_.slot(mcursor).owner;
        const std::uint32_t empty = pool_.slot(mcursor).free_count;
        sim_e_[h] -= ev_in_large_[mcursor];
        sim_f_[h] -= empty;
        if (h > g && sim_a_[h] > 0 && groups_[h].alloc.associated_request(mcursor) == r) sim_a_[h] -= empty;
        large_[mcursor].replay = replay_epoch_;
        mcursor = replay_next(mixed_lru_, mixed_lru_.after(mcursor));
        sim_a_[g] += n - 1;
        sim_f_[g] += n - 1;
      }
    }
    // Step 4 took empty slots from the group's large pages in list order.
    if (!spoiled_any && any_takes > 0)
      replay_spoil(g, r, groups_[g].alloc.first_with_free(), false, any_takes);
  }
  return true;
}

// ---------------------------------------------------------------- requests

RequestId KVCacheManager::add_request(std::span<const std::uint32_t> tokens,
                                      const RequestExtras& extras) {
  if (free_ids_.empty())
    fail("add_request: all max_requests = {} request slots are active (raise KVCacheManagerOptions::max_requests)",
         reqs_.size());
  if (tokens.size() > kMaxTokens) fail("tokens.size() = {}: a request holds at most {} tokens", tokens.size(), kMaxTokens);
  if (extras.max_tokens > kMaxTokens)
    fail("extras.max_tokens = {}: a request holds at most {} tokens", extras.max_tokens, kMaxTokens);
  if (extras.prompt_tokens > kMaxTokens)
    fail("extras.prompt_tokens = {}: a request holds at most {} tokens", extras.prompt_tokens, kMaxTokens);
  if (extras.prompt_tokens != 0 && extras.prompt_tokens < tokens.size())
    fail("extras.prompt_tokens = {}: fewer than the {} ids given", extras.prompt_tokens, tokens.size());
  const std::uint64_t prompt = std::max<std::uint64_t>(extras.prompt_tokens, tokens.size());
  for (std::size_t k = 0; k < extras.items.size(); ++k) {
    const MultimodalItem& m = extras.items[k];
    if (m.length == 0) fail("extras.items[{}].length = 0: must be >= 1", k);
    const std::optional<std::uint64_t> end = try_add<std::uint64_t>(m.offset, m.length);
    if (!end || *end > prompt)
      fail("extras.items[{}]: offset {} + length {} lies past the prompt's {} tokens", k, m.offset, m.length,
           prompt);
    if (k > 0 && m.offset < extras.items[k - 1].offset + extras.items[k - 1].length)
      fail("extras.items[{}].offset = {}: items must be sorted and not overlap", k, m.offset);
  }
  // The slot is taken last: whatever throws before (bad_alloc reserving for max_tokens)
  // leaves the manager as it was; an inactive record's fields are rewritten on reuse.
  const RequestId r = free_ids_.back();
  Request& q = reqs_[r];
  q.swapped = q.looked_up = q.enc_ready = q.enc_registered = false;
  const std::uint64_t reserve = std::max<std::uint64_t>(extras.max_tokens, tokens.size());
  q.tokens.clear();
  q.token_base = 0;
  for (std::uint32_t c = 0; c < class_tokens_.size(); ++c) q.hashes[c].reserve(reserve / class_tokens_[c]);
  q.lora = extras.lora_id;
  q.salt.assign(extras.cache_salt);
  q.items.assign(extras.items.begin(), extras.items.end());
  q.item_rank.clear();
  for (std::size_t k = 0; k < q.items.size(); ++k) q.item_rank.push_back(splitmix(rng_) >> 1);
  q.prio = std::min<std::uint32_t>(extras.priority, LruEvictor::kLevels - 1);
  levels_used_ |= q.prio != 0;
  q.computed = q.slots = 0;
  q.last_step = 0;
  q.admitted = false;
  q.items_consumed = 0;
  q.undo_mark = kNoUndo;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    q.lo[g] = q.registered[g] = 0;
    q.item_page[g].clear();
    if (groups_[g].decoder) continue;
    std::uint64_t at = 0;
    for (const MultimodalItem& m : q.items) {
      q.item_page[g].push_back(at);
      at += pages_for(m.length, groups_[g].P);
    }
    q.item_page[g].push_back(at);
  }
  for (auto& hv : q.hashes) hv.clear();
  // Every full page is hashed now, once, straight from the caller's ids; only the ids
  // past the last full page of some class are kept, for the pages they will complete.
  // A 128k-token prompt is read once and not copied (512 KiB less per request).
  std::uint64_t keep_from = tokens.size();
  if (options_.prefix_caching) {
    const bool plain = q.items.empty() && q.salt.empty();
    if (!plain) q.tokens.assign(tokens.begin(), tokens.end());  // the general path reads q.tokens
    for (std::uint32_t c = 0; c < class_tokens_.size(); ++c) {
      const std::uint64_t pages = tokens.size() / class_tokens_[c];
      keep_from = std::min<std::uint64_t>(keep_from, pages * class_tokens_[c]);
      if (plain) detail::append_page_hashes(q.hashes[c], tokens, class_tokens_[c], q.lora, pages, nullptr);
      else ensure_hashes(q, c, pages);
    }
    q.tokens.clear();
  }
  q.tokens.reserve(reserve - keep_from);
  q.tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(keep_from), tokens.end());
  q.token_base = keep_from;
  free_ids_.pop_back();
  q.active = true;
  ++num_active_;
  return r;
}

void KVCacheManager::append_tokens(RequestId r, std::span<const std::uint32_t> tokens) {
  Request& q = active_req(r);
  if (tokens.size() > kMaxTokens - (q.token_base + q.tokens.size()))
    fail("tokens.size() = {}: request {} has {} tokens, at most {} in all", tokens.size(), r,
         q.token_base + q.tokens.size(), kMaxTokens);
  q.tokens.insert(q.tokens.end(), tokens.begin(), tokens.end());
}

void KVCacheManager::set_priority(RequestId r, std::uint32_t priority) {
  Request& q = active_req(r);
  mutated();
  q.prio = std::min<std::uint32_t>(priority, LruEvictor::kLevels - 1);
  levels_used_ |= q.prio != 0;
}

void KVCacheManager::build_encoder_rows(RequestId r, Request& q) {
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    if (grp.decoder || q.items.empty() || grp.table.num_pages(r) != 0) continue;
    for (std::uint64_t i = 0; i < q.item_page[g].back(); ++i) grp.table.append(r, kNullPage);
    grp.table.set_num_tokens(r, q.item_page[g].back() * grp.P);
  }
}

std::uint64_t KVCacheManager::lookup_prefix(RequestId r) {
  Request& q = running(r);
  if (q.looked_up || q.slots > 0 || q.admitted)
    fail("request = {}: lookup_prefix must come once, before the first allocate (or after reset)", r);
  q.looked_up = true;
  ++lookups_;
  mutated();
  q.undo_mark = q.items.empty() ? mutations_ : kNoUndo;
  const std::uint64_t num_tokens = q.token_base + q.tokens.size();
  lookup_tokens_ += num_tokens;
  if (!options_.prefix_caching || num_tokens <= 1) {
    build_encoder_rows(r, q);
    return 0;
  }
  const std::uint64_t limit = num_tokens - 1;
  // add_request hashed the prompt's full pages; only ids appended since need hashing.
  for (std::uint32_t c = 0; c < class_tokens_.size(); ++c) ensure_hashes(q, c, limit / class_tokens_[c]);
  for (GroupId g = 0; g < groups_.size(); ++g) {
    first_miss_[g] = kNotFused;
    const Group& grp = groups_[g];
    if (!grp.decoder) continue;
    accepted_[g] = ~std::uint64_t{0};
    if (grp.full_attention)
      first_miss_[g] = probe_full_attention(q, g, limit / grp.P);
    else
      probe_memo_[g].assign(limit / grp.P, kUnknown);
  }
  // The longest prefix valid in every group: shrink p until every group accepts it. A
  // group whose last answer equals p is not asked again.
  std::uint64_t p = limit;
  for (bool changed = true; changed && p > 0;) {
    changed = false;
    for (GroupId g = 0; g < groups_.size() && p > 0; ++g) {
      const Group& grp = groups_[g];
      std::uint64_t v = p;
      if (grp.decoder) {
        if (accepted_[g] == p) continue;
        if (first_miss_[g] != kNotFused) {  // FullAttentionPolicy's answer, pages known
          v = std::min(p / grp.P, first_miss_[g]) * grp.P;
        } else {
          IndexProbe probe(index_, g, q.hashes[grp.hash_class], probe_memo_[g], cached(grp));
          v = grp.policy->longest_valid_prefix(p, probe);
        }
        accepted_[g] = v;
      } else {
        for (std::uint32_t k = 0; k < q.items.size(); ++k) {
          const MultimodalItem& m = q.items[k];
          if (!grp.image.needs(m.offset, m.length, v)) continue;
          const std::uint64_t pages = q.item_page[g][k + 1] - q.item_page[g][k];
          for (std::uint64_t j = 0; j < pages; ++j) {
            if (index_.find(g, item_page_hash(q, k, j), page_hash_of()) == kNullPage) {
              v = m.offset;
              break;
            }
          }
        }
      }
      if (v < p) {
        p = v;
        changed = true;
      }
    }
  }
  // Pin what the hit needs; the rest of the prefix is the null page. A page pinned from
  // evictable under another retention level rules out reset's in-place undo (release_page
  // would re-level it).
  bool relevel = false;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    if (grp.decoder) {
      const std::uint64_t pages = p / grp.P;
      const std::uint64_t lo = std::min(grp.policy->first_required_page(p), pages);
      IndexProbe probe(index_, g, q.hashes[grp.hash_class], probe_memo_[g], cached(grp));
      grp.table.append(r, lo, kNullPage);
      if (first_miss_[g] != kNotFused) {  // every page of [lo, pages) is a hit in the memo
        if (pages > first_miss_[g]) fail("internal: group {} hit of {} pages past its first miss {}", g, pages, first_miss_[g]);
        const PageId* hit = probe_memo_[g].data();
        Group::PageRec* rec = grp.pg.data();
        // Counted locally: no store-load chain through the members per page.
        std::uint32_t* ev = ev_in_large_.data();
        const std::uint32_t n = grp.n;
        std::uint32_t newly = 0, full_lost = 0;
        auto pin = [&](auto check_level) {
          for (std::uint64_t i = lo; i < pages; ++i) {
            const PageId page = hit[i];
            if (rec[page].ref++ == 0) {  // acquire_cached, inlined: a lazy pin
              full_lost += ev[n == 1 ? page : page / n]-- == n;
              ++newly;
              if constexpr (check_level) relevel |= rec[page].prio != q.prio;
            }
          }
        };
        // While no request has had another level than 0, every page and q are at 0.
        if (levels_used_) pin(std::true_type{});
        else pin(std::false_type{});
        grp.evictable -= newly;
        num_full_ev_ -= full_lost;
        grp.table.append(r, std::span<const PageId>(hit + lo, hit + pages));
      } else {
        for (std::uint64_t i = lo; i < pages; ++i) {
          const PageId page = probe.page(i);
          if (page == kNullPage) fail("internal: group {} lost page {} of a validated hit", g, i);
          relevel |= grp.pg[page].ref == 0 && grp.pg[page].prio != q.prio;
          acquire_cached(g, page);
          grp.table.append(r, page);
        }
      }
      grp.hit_pages += pages - lo;
      grp.table.set_num_tokens(r, p);
      q.lo[g] = lo;
      q.registered[g] = pages;
    } else if (!q.items.empty()) {
      build_encoder_rows(r, q);
      for (std::uint32_t k = 0; k < q.items.size(); ++k) {
        const MultimodalItem& m = q.items[k];
        if (!grp.image.needs(m.offset, m.length, p)) continue;
        for (std::uint64_t j = 0; j < q.item_page[g][k + 1] - q.item_page[g][k]; ++j) {
          const PageId page = index_.find(g, item_page_hash(q, k, j), page_hash_of());
          if (page == kNullPage) fail("internal: group {} lost image page {} of a validated hit", g, j);
          acquire_cached(g, page);
          ++grp.hit_pages;
          grp.table.set(r, static_cast<std::uint32_t>(q.item_page[g][k] + j), page);
        }
      }
    }
  }
  // Embedding pages of images the hit consumed entirely are never needed.
  while (q.items_consumed < q.items.size() &&
         q.items[q.items_consumed].offset + q.items[q.items_consumed].length <= p)
    ++q.items_consumed;
  q.computed = q.slots = p;
  hit_tokens_ += p;
  if (relevel) q.undo_mark = kNoUndo;
  return p;
}

std::uint64_t KVCacheManager::encoder_misses(RequestId r, const Request& q, GroupId g) const {
  const Group& grp = groups_[g];
  const bool built = grp.table.num_pages(r) != 0;
  std::uint64_t misses = 0;
  for (std::uint32_t k = q.items_consumed; k < q.items.size(); ++k) {
    for (std::uint64_t i = q.item_page[g][k]; i < q.item_page[g][k + 1]; ++i)
      misses += !built || grp.table.pages(r)[i] == kNullPage;
  }
  if (grp.image.release_when_consumed) return misses;
  // Cross attention keeps every image, consumed ones included.
  for (std::uint32_t k = 0; k < q.items_consumed; ++k)
    for (std::uint64_t i = q.item_page[g][k]; i < q.item_page[g][k + 1]; ++i)
      misses += !built || grp.table.pages(r)[i] == kNullPage;
  return misses;
}

bool KVCacheManager::allocate(RequestId r, std::uint32_t num_new_tokens, std::uint32_t lookahead) {
  Request& q = running(r);
  const std::uint64_t target = q.computed + num_new_tokens + lookahead;  // < 2^32 + 2^33: no wrap
  if (target > kMaxTokens)
    fail("num_new_tokens = {}, lookahead = {}: request {} would hold {} tokens, at most {}", num_new_tokens,
         lookahead, r, target, kMaxTokens);
  bool any = false;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    need_[g] = 0;
    cow_[g] = 0;
    if (grp.decoder) {
      if (target > q.slots) {
        const std::uint64_t have = grp.table.num_pages(r), want = pages_for(target, grp.P);
        need_[g] = want > have ? want - have : 0;
      }
      if (num_new_tokens > 0 && q.computed % grp.P != 0) {
        const std::uint64_t idx = q.computed / grp.P;
        const std::span<const PageId> pages = grp.table.pages(r);
        if (idx < pages.size() && pages[idx] != kNullPage && grp.pg[pages[idx]].ref > 1) cow_[g] = 1;
      }
    } else if (!q.enc_ready && !q.items.empty()) {
      need_[g] = encoder_misses(r, q, g);
    }
    need_[g] += cow_[g];
    any |= need_[g] > 0;
  }
  if (!any) {
    q.slots = std::max(q.slots, target);
    if (!q.items.empty()) q.enc_ready = true;
    admit(q);
    return true;
  }
  if (!feasible(r)) return false;
  mutated();
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    if (grp.decoder) {
      if (cow_[g]) {
        const auto idx = static_cast<std::uint32_t>(q.computed / grp.P);
        const PageId old = grp.table.pages(r)[idx];
        const PageId p = take_page(g, r);
        if (p == kNullPage) fail("internal: group {} allocation failed after a successful feasibility check", g);
        init_page(g, p, grp.pg[old].node.key.prefix_len);
        grp.table.set(r, idx, p);
        copies_.push_back(PageCopy{g, old, p});
        release_page(g, old, q.last_step, q.prio);
        --need_[g];
      }
      for (std::uint64_t k = 0; k < need_[g]; ++k) {
        const PageId p = take_page(g, r);
        if (p == kNullPage) fail("internal: group {} allocation failed after a successful feasibility check", g);
        init_page(g, p, grp.policy->prefix_length(grp.table.num_pages(r)));
        grp.table.append(r, p);
      }
      if (target > grp.table.num_tokens(r)) grp.table.set_num_tokens(r, target);
    } else if (need_[g] > 0) {
      build_encoder_rows(r, q);
      for (std::uint32_t k = 0; k < q.items.size(); ++k) {
        if (grp.image.release_when_consumed && k < q.items_consumed) continue;
        for (std::uint64_t i = q.item_page[g][k]; i < q.item_page[g][k + 1]; ++i) {
          if (grp.table.pages(r)[i] != kNullPage) continue;
          const PageId p = take_page(g, r);
          if (p == kNullPage) fail("internal: group {} allocation failed after a successful feasibility check", g);
          init_page(g, p, q.item_rank[k]);
          grp.table.set(r, static_cast<std::uint32_t>(i), p);
        }
      }
    }
  }
  if (!q.items.empty()) {
    build_encoder_rows(r, q);
    q.enc_ready = true;
  }
  q.slots = std::max(q.slots, target);
  admit(q);
  return true;
}

void KVCacheManager::commit(RequestId r, std::uint64_t num_computed_tokens) {
  Request& q = running(r);
  const std::uint64_t c = num_computed_tokens, c0 = q.computed;
  if (c < c0) fail("num_computed_tokens = {}: request {} already has {} computed", c, r, c0);
  if (c > q.slots)
    fail("num_computed_tokens = {}: request {} has pages for {} tokens only", c, r, q.slots);
  if (options_.prefix_caching && c > q.token_base + q.tokens.size())
    fail("num_computed_tokens = {}: request {} has {} token ids (append_tokens first)", c, r,
         q.token_base + q.tokens.size());
  // The first page the step wrote, if partial, must be r's own: allocate plans the copy of a
  // page shared since fork; a commit without it would have let the kernels write another
  // request's page.
  if (c > c0)
    for (GroupId g = 0; g < groups_.size(); ++g) {
      const Group& grp = groups_[g];
      if (!grp.decoder || c0 % grp.P == 0) continue;
      const std::span<const PageId> pages = grp.table.pages(r);
      const std::uint64_t idx = c0 / grp.P;
      if (idx < pages.size() && pages[idx] != kNullPage && grp.pg[pages[idx]].ref > 1)
        fail("request = {}: commit({}) writes page {} of group {}, shared since fork; call allocate(r, n) "
             "before the step's kernels so its copy-on-write copy is planned",
             r, c, pages[idx], g);
    }
  mutated();
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    if (!grp.decoder) continue;
    const std::span<const PageId> pages = grp.table.pages(r);
    if (options_.prefix_caching) {
      const std::uint64_t full = c / grp.P;
      if (q.registered[g] < full) {
        ensure_hashes(q, grp.hash_class, full);
        const std::vector<BlockHash>& hv = q.hashes[grp.hash_class];
        // Index inserts miss the cache: the slots are requested 16 pages ahead; 8 ahead,
        // the page's record and any record a fingerprint in the slot's line points at
        // (same content cached already: the insert confirms it there).
        constexpr std::uint64_t kAhead = 16;
        for (std::uint64_t i = q.registered[g]; i < full; ++i) {
          if (i + kAhead < full) index_.prefetch(g, hv[i + kAhead]);
          if (const std::uint64_t j = i + kAhead / 2; j < full && pages[j] != kNullPage) {
            __builtin_prefetch(&grp.pg[pages[j]]);
            index_.for_candidates(g, hv[j], [&grp](PageId other) { __builtin_prefetch(&grp.pg[other]); });
          }
          if (pages[i] != kNullPage) register_page(g, pages[i], hv[i]);
        }
        q.registered[g] = full;
      }
    }
    const std::uint64_t new_lo = std::min<std::uint64_t>(grp.policy->first_needed_page(c), pages.size());
    if (new_lo > q.lo[g]) {
      // Pages the step touched get this step's time; the others kept their last one.
      const std::uint64_t touch_lo = grp.policy->first_touched_page(c0, c);
      for (std::uint64_t i = new_lo; i-- > q.lo[g];) {
        if (i >= q.lo[g] + kReleaseAhead && pages[i - kReleaseAhead] != kNullPage)
          prefetch_release(g, pages[i - kReleaseAhead]);
        const PageId p = pages[i];
        if (p == kNullPage) continue;
        release_page(g, p, i >= touch_lo && c > c0 ? step_ : q.last_step, q.prio);
        grp.table.set(r, static_cast<std::uint32_t>(i), kNullPage);
      }
      q.lo[g] = new_lo;
    }
  }
  if (!q.items.empty() && q.enc_ready) {
    for (GroupId g = 0; g < groups_.size(); ++g) {
      Group& grp = groups_[g];
      if (grp.decoder) continue;
      if (options_.prefix_caching && !q.enc_registered && c > 0) {
        for (std::uint32_t k = 0; k < q.items.size(); ++k)
          for (std::uint64_t i = q.item_page[g][k]; i < q.item_page[g][k + 1]; ++i)
            if (const PageId p = grp.table.pages(r)[i]; p != kNullPage)
              register_page(g, p, item_page_hash(q, k, i - q.item_page[g][k]));
      }
      if (!grp.image.release_when_consumed) continue;
      // Vision embedding pages of images the prefill consumed (Jenga §6.2).
      for (std::uint32_t k = q.items_consumed; k < q.items.size(); ++k) {
        if (q.items[k].offset + q.items[k].length > c) break;
        for (std::uint64_t i = q.item_page[g][k + 1]; i-- > q.item_page[g][k];) {
          const PageId p = grp.table.pages(r)[i];
          if (p == kNullPage) continue;
          release_page(g, p, step_, q.prio);
          grp.table.set(r, static_cast<std::uint32_t>(i), kNullPage);
        }
      }
    }
    if (c > 0) q.enc_registered = true;
    while (q.items_consumed < q.items.size() &&
           q.items[q.items_consumed].offset + q.items[q.items_consumed].length <= c)
      ++q.items_consumed;
  }
  q.computed = c;
  if (c > c0) q.last_step = step_;
}

void KVCacheManager::release_rows(RequestId r, Request& q) {
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    const std::span<const PageId> pages = grp.table.pages(r);
    // Last page first: within one step the longest prefix is evicted first, so the
    // evictor appends at its tail in O(1).
    for (std::size_t i = pages.size(); i-- > 0;) {
      if (i >= kReleaseAhead && pages[i - kReleaseAhead] != kNullPage) prefetch_release(g, pages[i - kReleaseAhead]);
      if (pages[i] != kNullPage) release_page(g, pages[i], q.last_step, q.prio);
    }
    grp.alloc.release_request(r);
    grp.table.clear(r);
  }
}

void KVCacheManager::release_all(RequestId r, Request& q) {
  if (q.swapped) {
    for (GroupId g = 0; g < groups_.size(); ++g) {
      Group& grp = groups_[g];
      for (PageId h : grp.host_table.pages(r))
        if (h != kNullPage) grp.host_alloc.free(h);
      grp.host_alloc.release_request(r);
      grp.host_table.clear(r);
    }
  } else {
    release_rows(r, q);
  }
  q.swapped = false;
}

// release_rows after lookup_prefix and a refused allocate with nothing between (undo_mark):
// every state the releases would pass through ends where the lookup found it. The hit's
// list entries never moved (lazy pins), their keys and levels are unchanged (never
// admitted: released at time 0; same priority), and a large page's state returns only at
// its last released page, where refresh_large would find its entry as listed. So only
// the counts go back. O(hit pages), about two cached memory operations each.
void KVCacheManager::undo_lookup(RequestId r) {
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    Group::PageRec* rec = grp.pg.data();
    const std::uint32_t n = grp.n;
    std::uint32_t back = 0;
    for (const PageId p : grp.table.pages(r)) {
      if (p == kNullPage || --rec[p].ref > 0) continue;
      ev_add(n == 1 ? p : p / n, n);
      ++back;
    }
    grp.evictable += back;
    grp.alloc.release_request(r);
    grp.table.clear(r);
  }
}

void KVCacheManager::free(RequestId r) {
  Request& q = active_req(r);
  mutated();
  release_all(r, q);
  q.active = false;
  --num_active_;
  free_ids_.push_back(r);
}

void KVCacheManager::reset(RequestId r) {
  Request& q = active_req(r);
  if (q.undo_mark == mutations_ && !q.admitted && !q.swapped) undo_lookup(r);
  else release_all(r, q);
  mutated();
  q.undo_mark = kNoUndo;
  q.looked_up = q.enc_ready = q.enc_registered = q.admitted = false;
  q.computed = q.slots = q.last_step = 0;
  q.items_consumed = 0;
  for (GroupId g = 0; g < groups_.size(); ++g) q.lo[g] = q.registered[g] = 0;
  // As a new request: its images get new random prefix lengths.
  for (std::uint64_t& rank : q.item_rank) rank = splitmix(rng_) >> 1;
}

RequestId KVCacheManager::fork(RequestId parent) {
  running(parent);
  mutated();
  if (free_ids_.empty()) fail("fork: all max_requests = {} slots are active", reqs_.size());
  const RequestId r = free_ids_.back();
  free_ids_.pop_back();
  const Request& pq = reqs_[parent];
  Request& q = reqs_[r];
  q.active = true;
  q.swapped = false;
  q.looked_up = true;
  q.enc_ready = pq.enc_ready;
  q.enc_registered = pq.enc_registered;
  q.tokens = pq.tokens;
  q.token_base = pq.token_base;
  q.lora = pq.lora;
  q.salt = pq.salt;
  q.items = pq.items;
  q.item_rank = pq.item_rank;
  q.prio = pq.prio;
  q.computed = q.slots = pq.computed;
  q.last_step = pq.last_step;
  q.admitted = pq.admitted;
  q.items_consumed = pq.items_consumed;
  q.lo = pq.lo;
  q.undo_mark = kNoUndo;
  q.hashes = pq.hashes;
  q.item_page = pq.item_page;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    const std::span<const PageId> pages = grp.table.pages(parent);
    const std::size_t k = grp.decoder ? std::min<std::size_t>(pages.size(), pages_for(pq.computed, grp.P))
                                      : pages.size();
    for (std::size_t i = 0; i < k; ++i) {
      grp.table.append(r, pages[i]);
      if (pages[i] != kNullPage) ++grp.pg[pages[i]].ref;
    }
    grp.table.set_num_tokens(r, grp.decoder ? pq.computed : grp.table.num_tokens(parent));
    q.registered[g] = std::min<std::uint64_t>(pq.registered[g], k);
    q.lo[g] = std::min<std::uint64_t>(pq.lo[g], k);
  }
  ++num_active_;
  return r;
}

// ---------------------------------------------------------------- swapping

std::optional<std::span<const PageCopy>> KVCacheManager::swap_out(RequestId r) {
  Request& q = running(r);
  // Exact host capacity check: the host pool has no cache, so this is PagedKVAllocator's.
  std::uint64_t large_needed = 0;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    need_[g] = 0;
    for (PageId p : grp.table.pages(r)) need_[g] += p != kNullPage;
    const std::uint64_t free_small = grp.host_alloc.num_free_small();
    if (need_[g] > free_small) large_needed += (need_[g] - free_small + grp.n - 1) / grp.n;
  }
  if (large_needed > host_pool_.num_free()) return std::nullopt;
  mutated();
  plan_.clear();
  std::uint64_t reserve = large_needed;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    const std::uint64_t free_small = grp.host_alloc.num_free_small();
    if (need_[g] > free_small) reserve -= (need_[g] - free_small + grp.n - 1) / grp.n;
    for (PageId p : grp.table.pages(r)) {
      if (p == kNullPage) {
        grp.host_table.append(r, kNullPage);
        continue;
      }
      const std::optional<PageId> h = grp.host_alloc.allocate(r, static_cast<std::uint32_t>(reserve));
      if (!h) fail("internal: host group {} allocation failed after a capacity check", g);
      grp.host_hashed[*h] = grp.pg[p].hashed;
      grp.host_hash[*h] = grp.pg[p].hash;
      grp.host_len[*h] = grp.pg[p].node.key.prefix_len;
      grp.host_table.append(r, *h);
      plan_.push_back(PageCopy{g, p, *h});
    }
    grp.host_table.set_num_tokens(r, grp.table.num_tokens(r));
  }
  release_rows(r, q);
  q.swapped = true;
  return std::span<const PageCopy>(plan_);
}

std::optional<std::span<const PageCopy>> KVCacheManager::swap_in(RequestId r) {
  Request& q = active_req(r);
  if (!q.swapped) fail("request = {}: not swapped out", r);
  for (GroupId g = 0; g < groups_.size(); ++g) {
    need_[g] = 0;
    for (PageId h : groups_[g].host_table.pages(r)) need_[g] += h != kNullPage;
  }
  if (!feasible(r)) return std::nullopt;
  mutated();
  plan_.clear();
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    for (PageId h : grp.host_table.pages(r)) {
      if (h == kNullPage) {
        grp.table.append(r, kNullPage);
        continue;
      }
      const PageId p = take_page(g, r);
      if (p == kNullPage) fail("internal: group {} allocation failed after a successful feasibility check", g);
      init_page(g, p, grp.host_len[h]);
      grp.table.append(r, p);
      plan_.push_back(PageCopy{g, h, p});
    }
    grp.table.set_num_tokens(r, grp.host_table.num_tokens(r));
  }
  // Re-cache after every page is placed: an eviction above may have dropped the device
  // copy of a hash that a swapped-in page now holds.
  for (const PageCopy& c : plan_) {
    Group& grp = groups_[c.group];
    if (grp.host_hashed[c.src]) register_page(c.group, c.dst, grp.host_hash[c.src]);
    grp.host_alloc.free(c.src);
  }
  for (GroupId g = 0; g < groups_.size(); ++g) {
    groups_[g].host_alloc.release_request(r);
    groups_[g].host_table.clear(r);
  }
  q.swapped = false;
  q.last_step = step_;
  return std::span<const PageCopy>(plan_);
}

// ---------------------------------------------------------------- cache control

void KVCacheManager::reset_prefix_cache() {
  mutated();
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    // Swapped-out pages come back private: their pre-reset content is not cached again.
    std::fill(grp.host_hashed.begin(), grp.host_hashed.end(), std::uint8_t{0});
    for (PageId s = small_front(g); s != kNullPage; s = small_front(g)) evict_small(g, s);
    for (PageId p = 0; p < grp.pg.size(); ++p) {
      if (!grp.pg[p].hashed) continue;
      if (grp.lru.contains(p)) grp.lru.erase(p);  // stale entries of pinned pages
      if (large_lru_.contains(p / grp.n)) large_lru_.erase(p / grp.n);
      if (mixed_lru_.contains(p / grp.n)) mixed_lru_.erase(p / grp.n);
      index_.erase(g, grp.pg[p].hash, p);
      grp.pg[p].hashed = 0;
      record(CacheEventKind::kRemoved, g, p, grp.pg[p].hash);
    }
  }
}

PinId KVCacheManager::pin_prefix(RequestId r) {
  running(r);
  mutated();
  PinId id;
  if (!free_pins_.empty()) {
    id = free_pins_.back();
    free_pins_.pop_back();
  } else {
    id = static_cast<PinId>(pins_.size());
    pins_.emplace_back();
  }
  auto& held = pins_[id];
  held.clear();
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    for (PageId p : grp.table.pages(r)) {
      if (p == kNullPage || !grp.pg[p].hashed) continue;
      ++grp.pg[p].ref;
      held.emplace_back(g, p);
    }
  }
  return id;
}

void KVCacheManager::unpin(PinId pin) {
  if (pin >= pins_.size() || std::find(free_pins_.begin(), free_pins_.end(), pin) != free_pins_.end())
    fail("pin = {}: not an active pin", pin);
  mutated();
  for (auto it = pins_[pin].rbegin(); it != pins_[pin].rend(); ++it)
    release_page(it->first, it->second, step_, 0);
  pins_[pin].clear();
  free_pins_.push_back(pin);
}

// ---------------------------------------------------------------- stats and checks

CacheStats KVCacheManager::stats() const {
  CacheStats s;
  s.free_large_pages = pool_.num_free();
  s.lookups = lookups_;
  s.lookup_tokens = lookup_tokens_;
  s.hit_tokens = hit_tokens_;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    GroupStats gs;
    gs.evictable_pages = grp.evictable;
    gs.used_pages = grp.alloc.num_used_small() - grp.evictable;
    gs.empty_pages = grp.alloc.num_free_small();
    gs.large_pages = grp.alloc.num_large_pages();
    gs.allocated_bytes = std::uint64_t{gs.used_pages} * layout_.small_page_bytes(g);
    gs.hit_pages = grp.hit_pages;
    gs.evicted_pages = grp.evicted;
    // Needed bytes: the tokens each distinct used page really holds (a page shared by a
    // fork or a hit counts once, at its fullest).
    std::vector<std::uint32_t> held(grp.pg.size(), 0);
    for (RequestId r = 0; r < reqs_.size(); ++r) {
      const Request& q = reqs_[r];
      if (!q.active || q.swapped) continue;
      const std::span<const PageId> pages = grp.table.pages(r);
      for (std::size_t i = 0; i < pages.size(); ++i) {
        if (pages[i] == kNullPage) continue;
        std::uint64_t tok = grp.P;
        if (grp.decoder) {
          const std::uint64_t start = i * std::uint64_t{grp.P};
          tok = q.computed > start ? std::min<std::uint64_t>(grp.P, q.computed - start) : 0;
        }
        held[pages[i]] = std::max<std::uint32_t>(held[pages[i]], static_cast<std::uint32_t>(tok));
      }
    }
    for (const auto& pin : pins_)
      for (const auto& [pg, p] : pin)
        if (pg == g) held[p] = grp.P;
    for (PageId p = 0; p < held.size(); ++p) {
      if (held[p] == 0) continue;
      gs.needed_bytes += grp.spec.is_state() ? layout_.natural_page_bytes(g)
                                             : held[p] * grp.spec.bytes_per_token();
    }
    gs.waste_bytes = gs.allocated_bytes > gs.needed_bytes ? gs.allocated_bytes - gs.needed_bytes : 0;
    s.groups.push_back(gs);
  }
  return s;
}

void KVCacheManager::check_invariants() const {
  std::uint64_t hashed_total = 0;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    grp.alloc.check_invariants();
    grp.host_alloc.check_invariants();
    std::vector<std::uint32_t> refs(grp.pg.size(), 0);
    std::uint64_t host_used = 0;
    for (RequestId r = 0; r < reqs_.size(); ++r) {
      const Request& q = reqs_[r];
      if (!q.active) {
        if (grp.table.num_pages(r) || grp.host_table.num_pages(r))
          fail("invariant: inactive request {} holds pages in group {}", r, g);
        continue;
      }
      for (PageId h : grp.host_table.pages(r)) host_used += h != kNullPage;
      if (q.swapped) {
        if (grp.table.num_pages(r)) fail("invariant: swapped request {} holds device pages", r);
        continue;
      }
      const std::span<const PageId> pages = grp.table.pages(r);
      if (grp.decoder) {
        if (pages.size() != pages_for(q.slots, grp.P))
          fail("invariant: request {} group {} has {} pages for {} allocated tokens", r, g,
               pages.size(), q.slots);
        for (std::size_t i = 0; i < pages.size(); ++i)
          if ((pages[i] == kNullPage) != (i < q.lo[g]))
            fail("invariant: request {} group {} entry {} is {} (first held page {})", r, g, i,
                 pages[i], q.lo[g]);
      }
      for (PageId p : pages) {
        if (p == kNullPage) continue;
        if (!grp.alloc.is_allocated(p)) fail("invariant: request {} group {} maps empty page {}", r, g, p);
        ++refs[p];
      }
    }
    for (const auto& pin : pins_)
      for (const auto& [pg, p] : pin)
        if (pg == g) ++refs[p];
    std::uint32_t evictable = 0;
    std::vector<std::uint32_t> per_large(pool_.capacity(), 0);
    std::uint32_t listed_total = 0;
    for (PageId p = 0; p < grp.pg.size(); ++p) {
      const Group::PageRec& rec = grp.pg[p];
      if (refs[p] != rec.ref)
        fail("invariant: group {} page {} has reference count {} but {} holders", g, p, rec.ref, refs[p]);
      const bool alloc = grp.alloc.is_allocated(p), listed = grp.lru.contains(p);
      const bool in_lru = listed && rec.ref == 0;  // else a stale entry (lazy pin)
      if (alloc != (rec.ref > 0 || in_lru))
        fail("invariant: group {} page {} allocated={} but ref {} evictable {}", g, p, alloc, rec.ref, in_lru);
      if (listed && !rec.hashed)
        fail("invariant: group {} listed page {} has ref {} hashed {}", g, p, rec.ref, rec.hashed);
      if (listed) ++listed_total;
      if (rec.hashed) {
        ++hashed_total;
        if (!alloc) fail("invariant: group {} page {} is both cached and free", g, p);
        if (index_.find(g, rec.hash, page_hash_of()) != p) fail("invariant: group {} page {} not indexed by its hash", g, p);
      }
      if (in_lru) {
        ++evictable;
        ++per_large[p / grp.n];
      }
    }
    if (evictable != grp.evictable || listed_total != grp.lru.size())
      fail("invariant: group {} counts {} evictable, list {}, actual {} (+ stale {})", g, grp.evictable,
           grp.lru.size(), evictable, listed_total - evictable);
    for (PageId lp = 0; lp < pool_.capacity(); ++lp) {
      if (pool_.owner(lp) != g) continue;
      if (per_large[lp] != ev_in_large_[lp])
        fail("invariant: large page {} counts {} evictable small pages, actual {}", lp, ev_in_large_[lp], per_large[lp]);
      if (grp.n == 1) {  // listed by its small page's entry alone
        if (large_lru_.contains(lp) || mixed_lru_.contains(lp))
          fail("invariant: one-page large page {} of group {} is in a large-page LRU", lp, g);
        continue;
      }
      // Wholly evictable: in the large LRU; cached + empty, nothing used: in the mixed
      // LRU; each under its current key. Anything else listed is a stale entry (a lazy
      // pin, or a slot taken since).
      const std::uint32_t empty = grp.alloc.free_in_large(lp);
      if (per_large[lp] > 0 && per_large[lp] + empty == grp.n) {
        const LargeLru& want = empty == 0 ? large_lru_ : mixed_lru_;
        const EvictionKey key = large_entry(g, lp).first;
        if (!want.contains(lp) || !(want.key(lp) == key))
          fail("invariant: large page {} ({} cached, {} empty) listed = {}, key {}/{}", lp, per_large[lp], empty,
               want.contains(lp), key.time, key.prefix_len);
      }
    }
    if (host_used != grp.host_alloc.num_used_small())
      fail("invariant: group {} host pages used {} but {} in host tables", g, grp.host_alloc.num_used_small(), host_used);
  }
  // Every step-3 source is ordered by (level, key, insertion), so their merge is one order.
  for (std::uint32_t src = 0; src < num_sources(); ++src) {
    PageId prev = kNullPage;
    for (PageId id = src == 0 ? large_lru_.front() : groups_[single_[src - 1]].lru.front(); id != kNullPage;
         id = source_after(src, id)) {
      if (prev != kNullPage && !victim_before(src, prev, src, id))
        fail("invariant: step-3 source {} lists {} before {} out of (level, key, insertion) order", src, prev, id);
      prev = id;
    }
  }
  std::uint32_t full_ev = 0;
  for (PageId lp = 0; lp < pool_.capacity(); ++lp) full_ev += full_evictable(lp);
  if (full_ev != num_full_ev_) fail("invariant: {} wholly evictable large pages counted, actual {}", num_full_ev_, full_ev);
  for (PageId lp = 0; lp < pool_.capacity(); ++lp)
    if (pool_.owner(lp) == kNoGroup && (large_lru_.contains(lp) || mixed_lru_.contains(lp)))
      fail("invariant: free large page {} is in a large-page LRU", lp);
  if (hashed_total != index_.size())
    fail("invariant: {} hashed pages but {} index entries", hashed_total, index_.size());
  if (num_active_ + free_ids_.size() != reqs_.size())
    fail("invariant: {} active + {} free request ids != {}", num_active_, free_ids_.size(), reqs_.size());
}

}  // namespace kvmm
