// KVCacheManager: what a scheduler calls each step. Prefix caching with per-layer-kind
// rules (Jenga §5) on Jenga §4's two-level paging, plus fork / copy-on-write / swap plans
// (PagedAttention §4.4-4.5). Decode step allocate + commit: O(groups); add_request hashes
// the prompt, O(tokens); lookup_prefix: O(pages probed); free: O(pages). Ids and
// plans only, no KV memory is touched. Single-threaded by contract. Guide: docs/manager.md.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/caching/evictor.hpp"
#include "kvmm/caching/layer_policy.hpp"
#include "kvmm/caching/prefix_index.hpp"
#include "kvmm/paging/large_page_pool.hpp"
#include "kvmm/paging/page_table.hpp"
#include "kvmm/paging/small_page_allocator.hpp"
#include "kvmm/spec/kv_layout.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvmm {

struct KVCacheManagerOptions {
  std::uint32_t num_large_pages = 0;       // device pool
  std::uint32_t num_host_large_pages = 0;  // host pool of the same layout, for swap_out
  std::uint32_t max_requests = 1024;
  bool prefix_caching = true;
  bool record_events = false;  // keep stored/removed events for take_events()
  std::uint64_t seed = 0x6b766d6d;  // random per-image prefix lengths
};

struct RequestExtras {
  std::uint32_t lora_id = 0;
  std::span<const MultimodalItem> items = {};  // sorted by offset, not overlapping, inside the prompt
  // The prompt's full length when its ids arrive in chunks (add_request with the first,
  // append_tokens with the rest); 0: the ids given. Items must end inside it.
  std::uint64_t prompt_tokens = 0;
  std::string_view cache_salt = {};
  std::uint32_t priority = 0;  // retention priority 0..3: pages of higher ones evicted later
  // Expected final length (prompt + output); the slot reserves for it once, so steady-state
  // decode steps never touch the heap. 0: grow on demand (amortized doubling).
  std::uint64_t max_tokens = 0;
};

// Copy `src` to `dst` in `group` before the step's kernels run. Copy-on-write copies
// are device -> device; swap plans are device -> host (swap_out) or host -> device.
struct PageCopy {
  GroupId group = 0;
  PageId src = kNullPage;
  PageId dst = kNullPage;
  friend bool operator==(const PageCopy&, const PageCopy&) = default;
};

enum class CacheEventKind : std::uint8_t { kStored, kRemoved };
struct CacheEvent {
  CacheEventKind kind = CacheEventKind::kStored;
  GroupId group = 0;
  PageId page = kNullPage;
  BlockHash hash;
};

enum class PageState : std::uint8_t { kEmpty, kEvictable, kUsed };

struct GroupStats {
  std::uint32_t used_pages = 0;       // small pages with reference count > 0
  std::uint32_t evictable_pages = 0;  // cached, reference count 0
  std::uint32_t empty_pages = 0;      // free small pages inside this group's large pages
  std::uint32_t large_pages = 0;      // large pages the group holds
  std::uint64_t allocated_bytes = 0;  // used_pages * small_page_bytes
  std::uint64_t needed_bytes = 0;     // bytes of tokens actually held by used pages
  std::uint64_t waste_bytes = 0;      // allocated - needed
  std::uint64_t hit_pages = 0;        // pages served from the cache by lookups
  std::uint64_t evicted_pages = 0;
};

struct CacheStats {
  std::vector<GroupStats> groups;
  std::uint32_t free_large_pages = 0;
  std::uint64_t lookups = 0;
  std::uint64_t lookup_tokens = 0;  // prompt tokens looked up
  std::uint64_t hit_tokens = 0;
};

using PinId = std::uint32_t;

class KVCacheManager {
 public:
  static constexpr std::uint64_t kMaxTokens = (std::uint64_t{1} << 32) - 1;  // per request
  static constexpr std::uint32_t kMaxRequests = std::uint32_t{1} << 24;      // max_requests
  // Raises kvmm::Error naming the option at fault before allocating anything.
  KVCacheManager(KVLayout layout, const KVCacheManagerOptions& options);
  KVCacheManager(const KVCacheManager&) = delete;  // allocators point into the pools
  KVCacheManager& operator=(const KVCacheManager&) = delete;

  const KVLayout& layout() const { return layout_; }
  // Replaces a decoder group's policy (before the first request). Raises kvmm::Error for a
  // group out of range, an encoder-token group, or a tokens_per_page mismatch.
  void set_policy(GroupId g, std::unique_ptr<LayerPolicy> policy);
  const LayerPolicy& policy(GroupId g) const;

  // Starts a scheduler step: the timestamp of everything touched until the next call;
  // clears copies(). O(1).
  std::uint64_t begin_step();
  std::uint64_t step() const { return step_; }

  // Registers a request with its prompt token ids. With prefix caching on it hashes every
  // full page, O(tokens), and keeps only the ids past the last full page (later pages
  // need them); with it off it keeps none. No copy of the prompt, slot capacity kept.
  RequestId add_request(std::span<const std::uint32_t> tokens, const RequestExtras& extras = {});
  // Token ids the engine sampled; commit() hashes full pages, so it needs them first.
  void append_tokens(RequestId r, std::span<const std::uint32_t> tokens);
  void append_token(RequestId r, std::uint32_t token) { append_tokens(r, {&token, 1}); }
  // The longest prefix valid in every group (at most prompt - 1 tokens), its pages pinned
  // and mapped; the request continues from there. Once, before the first allocate (and
  // again after reset).
  std::uint64_t lookup_prefix(RequestId r);
  // Pages for tokens [computed, computed + num_new_tokens + lookahead) in every group, or
  // false with nothing changed. May evict (Jenga §5.4) and add copy-on-write copies.
  bool allocate(RequestId r, std::uint32_t num_new_tokens, std::uint32_t lookahead = 0);
  // Tokens [0, num_computed_tokens) now hold KV: full pages become cached, pages out of
  // every policy's need are released. Raises kvmm::Error past the allocated tokens.
  void commit(RequestId r, std::uint64_t num_computed_tokens);
  // A new request sharing parent's computed pages (reference counts +1); a shared partial
  // page is copied on the next write (copies()).
  RequestId fork(RequestId parent);
  void free(RequestId r);
  // Preemption by recompute, or giving up a first allocate that failed: releases every
  // page of r (cached ones stay evictable, as free leaves them) and returns r to its state
  // after add_request, its token ids and block hashes kept, so the next lookup_prefix
  // hashes nothing again (a 128k-token prompt: ~100 us saved per retry). O(pages held).
  // Right after r's lookup_prefix and a refused allocate, with no other call between that
  // changes pages, the lookup's pins are undone in place (a count per page, no list work).
  void reset(RequestId r);
  // Preemption by swapping: every page of r to the host pool, all or nothing (std::nullopt:
  // host full, nothing changed). The span stays valid until the next swap call.
  std::optional<std::span<const PageCopy>> swap_out(RequestId r);
  std::optional<std::span<const PageCopy>> swap_in(RequestId r);
  // Copy-on-write copies made since begin_step().
  std::span<const PageCopy> copies() const { return copies_; }
  // Drops every cached hash; evictable pages become empty. O(pages).
  void reset_prefix_cache();
  // Keeps r's cached pages from eviction until unpin (a reference each). O(pages).
  PinId pin_prefix(RequestId r);
  void unpin(PinId pin);
  void set_priority(RequestId r, std::uint32_t priority);

  CacheStats stats() const;
  // Moves the recorded events into `out` (cleared first; capacities swap, so a reused
  // vector makes no heap allocation in steady state).
  void take_events(std::vector<CacheEvent>& out);

  // Queries.
  bool is_active(RequestId r) const { return r < reqs_.size() && reqs_[r].active; }
  bool is_swapped(RequestId r) const { return is_active(r) && reqs_[r].swapped; }
  std::uint32_t num_active() const { return num_active_; }
  std::uint64_t num_computed(RequestId r) const { return req(r).computed; }
  std::uint64_t num_allocated(RequestId r) const { return req(r).slots; }
  std::uint64_t num_tokens(RequestId r) const { return req(r).token_base + req(r).tokens.size(); }
  std::span<const PageId> page_table(RequestId r, GroupId g) const;
  const PageTableSet& page_tables(GroupId g) const { return groups_[check_group(g)].table; }
  std::span<const PageId> host_page_table(RequestId r, GroupId g) const;
  const LargePagePool& large_pages() const { return pool_; }
  const SmallPageAllocator& small_pages(GroupId g) const { return groups_[check_group(g)].alloc; }
  // Distinct small pages of g held by requests or pins (reference count > 0), and cached
  // ones with none: O(1), unlike stats().
  std::uint32_t num_used_pages(GroupId g) const {
    const Group& grp = groups_[check_group(g)];
    return grp.alloc.num_used_small() - grp.evictable;
  }
  std::uint32_t num_evictable_pages(GroupId g) const { return groups_[check_group(g)].evictable; }
  std::uint64_t num_evicted_pages(GroupId g) const { return groups_[check_group(g)].evicted; }
  PageState page_state(GroupId g, PageId p) const;
  std::uint32_t ref_count(GroupId g, PageId p) const;
  EvictionKey eviction_key(GroupId g, PageId p) const;  // last access and prefix length
  std::optional<BlockHash> page_hash(GroupId g, PageId p) const;
  // Next victims: a group's small-page LRU front and step 3's next large page (or null):
  // the earliest of the large-page LRU's front and the fronts of the groups with one small
  // page per large page. Amortized O(groups): pages pinned by a hit since they became
  // evictable are dropped here.
  PageId next_small_victim(GroupId g) const { return small_front(check_group(g)); }
  PageId next_large_victim() const { return large_front(); }
  // Step 6's next victim: the LRU large page with no used, some cached and some empty
  // small pages (or null).
  PageId next_mixed_victim() const { return mixed_front(); }
  // Recomputes every count, list and reference from scratch. O(memory); for tests.
  void check_invariants() const;

 private:
  static constexpr std::uint64_t kNoUndo = ~std::uint64_t{0};
  struct Group {
    Group(const KVLayout& layout, GroupId g, LargePagePool& pool, LargePagePool& host_pool,
          std::uint32_t max_requests);
    LayerGroup spec;
    std::uint32_t P;  // tokens per page
    std::uint32_t n;  // small pages per large page
    bool decoder;
    std::uint32_t hash_class;  // decoder groups of equal P share one hash chain
    bool full_attention = false;  // policy is the built-in FullAttentionPolicy
    std::unique_ptr<LayerPolicy> policy;
    ImagePolicy image;
    SmallPageAllocator alloc;
    PageTableSet table;
    SmallPageAllocator host_alloc;
    PageTableSet host_table;
    // Per small page: everything allocate, commit, release, eviction and the probes read,
    // in one 64-byte record (one cache line per page touched). node.key is the page's
    // last access step and prefix length, listed or not; a listed key never changes.
    struct alignas(64) PageRec {
      LruNode node;
      BlockHash hash;  // valid while hashed
      std::uint32_t ref = 0;
      std::uint8_t hashed = 0;
      std::uint8_t prio = 0;
      std::uint64_t seq = 0;  // insertion number while listed: step 3's tie-break across lists
    };
    std::vector<PageRec> pg;
    // Evictable pages, plus stale entries of pages a hit pinned (ref > 0) since: a hit
    // only counts them out; whoever meets one at the front drops it (lazy pinning).
    mutable LruOrder<MemberNodes<PageRec, &PageRec::node>> lru;
    // Per host small page.
    std::vector<std::uint8_t> host_hashed;
    std::vector<BlockHash> host_hash;
    std::vector<std::uint64_t> host_len;
    std::uint32_t evictable = 0;
    std::uint64_t hit_pages = 0;
    std::uint64_t evicted = 0;
  };
  struct Request {
    bool active = false, swapped = false, looked_up = false, enc_ready = false,
         enc_registered = false;
    // Its first allocate succeeded: only then do its pages count as accessed (a request
    // that looked up and could not be admitted leaves the hit pages' ages alone).
    bool admitted = false;
    // Ids from position token_base on: those of pages not yet hashed in some class (a
    // prompt's full pages are hashed at add_request and their ids never read again).
    std::vector<std::uint32_t> tokens;
    std::uint64_t token_base = 0;
    std::uint32_t lora = 0;
    std::string salt;
    std::vector<MultimodalItem> items;
    std::vector<std::uint64_t> item_rank;  // random prefix length per item
    std::uint32_t prio = 0;
    std::uint64_t computed = 0, slots = 0, last_step = 0;
    std::uint32_t items_consumed = 0;
    std::vector<std::uint64_t> lo;          // per group: first page still held
    std::vector<std::uint64_t> registered;  // per group: pages considered for caching
    std::vector<std::vector<BlockHash>> hashes;  // per hash class
    std::vector<std::vector<std::uint64_t>> item_page;  // per group: item k's first page
    // mutations_ right after its lookup_prefix if reset may undo that lookup's pins in
    // place (no images; every pinned page already carries the request's priority).
    std::uint64_t undo_mark = kNoUndo;
  };

  // Per large page, what the list walks and the replay read: one 64-byte record.
  struct alignas(64) LargeRec {
    LruNode node;              // in large_lru_ or mixed_lru_ (tags 0 and 1), or neither
    std::uint32_t replay = 0;  // feasible(): evicted or slot taken by its replay (== replay_epoch_)
    std::uint64_t seq = 0;     // insertion number while in large_lru_ (see Group::PageRec)
  };
  using LargeLru = LruOrder<MemberNodes<LargeRec, &LargeRec::node>>;

  static KVLayout validated(KVLayout layout, const KVCacheManagerOptions& options);
  const Request& req(RequestId r) const;
  Request& active_req(RequestId r);
  Request& running(RequestId r);
  GroupId check_group(GroupId g) const;
  [[noreturn, gnu::cold]] void bad_request(RequestId r) const;
  static std::uint64_t pages_for(std::uint64_t tokens, std::uint32_t P) { return (tokens + P - 1) / P; }

  void ensure_hashes(Request& q, std::uint32_t cls, std::uint64_t pages);
  std::uint64_t probe_full_attention(const Request& q, GroupId g, std::uint64_t pages);
  BlockHash item_page_hash(const Request& q, std::uint32_t item, std::uint64_t page_in_item) const;
  void register_page(GroupId g, PageId p, const BlockHash& h);
  void acquire_cached(GroupId g, PageId p);
  void release_page(GroupId g, PageId p, std::uint64_t t, std::uint32_t prio);
  static constexpr std::size_t kReleaseAhead = 8;  // pages, in loops that release a table
  void prefetch_release(GroupId g, PageId p) const;
  void evict_small(GroupId g, PageId p);
  void evict_large(PageId lp);
  static constexpr std::uint32_t kVictimsAhead = 8;
  void prefetch_victims(PageId front, std::uint32_t front_src, GroupId taker);
  std::pair<EvictionKey, std::uint32_t> large_entry(GroupId g, PageId lp) const;
  // Jenga §5.4's evictable large page: every small page evictable (step 3). O(1).
  bool full_evictable(PageId lp) const {
    const GroupId g = pool_.slot(lp).owner;
    return g != kNoGroup && ev_in_large_[lp] == groups_[g].n;
  }
  // No used small page, some evictable and some empty (step 6). O(1).
  bool mixed(PageId lp) const {
    const GroupId g = pool_.slot(lp).owner;
    if (g == kNoGroup) return false;
    const std::uint32_t ev = ev_in_large_[lp], empty = pool_.slot(lp).free_count;
    return ev > 0 && empty > 0 && ev + empty == groups_[g].n;
  }
  bool stale_large(PageId lp) const { return !full_evictable(lp); }
  bool stale_mixed(PageId lp) const { return !mixed(lp); }
  // Files lp in the LRU its state calls for (full, mixed or none). O(n).
  void refresh_large(GroupId g, PageId lp);
  bool replay_skips(PageId lp) const { return large_[lp].replay == replay_epoch_; }
  template <class Lru>
  PageId replay_next(Lru& lru, PageId lp);
  // Step 3's order is a merge of sources: 0 is large_lru_ (groups with n > 1), source
  // k >= 1 the small-page LRU of single_[k - 1], a group with n = 1, whose small page is
  // its large page (one list per page instead of two). Each source is ordered by (level,
  // key, insertion), so the merge by (level, key, seq) is the one list it replaces.
  std::uint32_t num_sources() const { return static_cast<std::uint32_t>(single_.size()) + 1; }
  bool victim_before(std::uint32_t sa, PageId a, std::uint32_t sb, PageId b) const;
  PageId source_front(std::uint32_t src) const;  // drops stale entries, as the fronts do
  PageId source_after(std::uint32_t src, PageId id) const;
  PageId source_replay_next(std::uint32_t src, PageId id);  // replay_next down a source
  // The earliest of at(s) over the sources (kNullPage: every one null), its source in src.
  template <class At>
  PageId earliest(At at, std::uint32_t& src) const;
  PageId large_front(std::uint32_t& src) const;
  void replay_spoil(GroupId g, RequestId r, PageId first, bool by_request, std::uint64_t takes);
  PageId mixed_front() const;
  PageId small_front(GroupId g) const;
  PageId large_front() const {
    std::uint32_t src;
    return large_front(src);
  }
  PageId take_page(GroupId g, RequestId r);  // kNullPage: none
  void init_page(GroupId g, PageId p, std::uint64_t prefix_len);
  bool feasible(RequestId r);
  int quick_feasible() const;  // 1 or 0 when O(groups) bounds decide, else -1
  bool replay_feasible(RequestId r);
  // One group's cached pages: holds(p, h) when page p is cached under h (then the index
  // maps h to p); as the index's hash_of, the hash an indexed page is cached under.
  struct Cached {
    const Group* grp;
    bool holds(std::uint64_t p, const BlockHash& h) const {
      return p < grp->pg.size() && grp->pg[p].hashed && grp->pg[p].hash == h;
    }
    const BlockHash& operator()(GroupId, PageId p) const { return grp->pg[p].hash; }
    void prefetch(PageId p) const { __builtin_prefetch(&grp->pg[p]); }
    std::size_t size() const { return grp->pg.size(); }
  };
  static Cached cached(const Group& grp) { return {&grp}; }
  // The index's hash_of over every group.
  auto page_hash_of() const {
    return [this](GroupId g, PageId p) -> const BlockHash& { return groups_[g].pg[p].hash; };
  }
  void admit(Request& q) {
    if (q.admitted) return;
    q.admitted = true;
    q.last_step = step_;
  }
  void build_encoder_rows(RequestId r, Request& q);
  std::uint64_t encoder_misses(RequestId r, const Request& q, GroupId g) const;
  void release_rows(RequestId r, Request& q);
  void undo_lookup(RequestId r);  // reset's in-place path, see undo_mark
  void release_all(RequestId r, Request& q);  // device pages, or host pages if swapped
  // Every eviction and registration calls this: inline, so events off cost one test.
  void record(CacheEventKind kind, GroupId g, PageId p, const BlockHash& h) {
    if (options_.record_events) events_.push_back(CacheEvent{kind, g, p, h});
  }

  KVLayout layout_;
  KVCacheManagerOptions options_;
  LargePagePool pool_;
  LargePagePool host_pool_;
  std::vector<Group> groups_;
  std::vector<std::uint32_t> class_tokens_;  // tokens per page of each hash class
  std::vector<LargeRec> large_;
  // Evictable small pages per large page: dense (4 bytes each, cache-resident), since a
  // hit's pin loop touches it for every page and nothing else of the large page.
  std::vector<std::uint32_t> ev_in_large_;
  mutable LargeLru large_lru_;  // evictable large pages, plus stale ones (see Group::lru)
  // Large pages with no used small page, some evictable and some empty, plus stale ones:
  // reclaimed by any group only when Jenga's five steps find nothing (step 6), so memory
  // is never stranded in a group whose cached pages leave empty slots behind.
  mutable LargeLru mixed_lru_;
  std::vector<GroupId> single_;  // groups with one small page per large page (sources 1..)
  std::vector<std::uint32_t> source_;  // per group: its source, 0 when n > 1
  std::uint64_t seq_ = 0;  // last insertion number handed out
  std::uint32_t num_full_ev_ = 0;  // large pages with every small page evictable
  void ev_add(PageId lp, std::uint32_t n) { num_full_ev_ += ++ev_in_large_[lp] == n; }
  void ev_sub(PageId lp, std::uint32_t n) { num_full_ev_ -= ev_in_large_[lp]-- == n; }
  PrefixIndex index_;
  std::vector<Request> reqs_;
  std::vector<RequestId> free_ids_;
  std::uint32_t num_active_ = 0;
  std::uint64_t step_ = 0;
  std::uint64_t rng_;
  std::vector<PageCopy> copies_;
  std::vector<PageCopy> plan_;
  std::vector<CacheEvent> events_;
  std::vector<std::vector<std::pair<GroupId, PageId>>> pins_;
  std::vector<PinId> free_pins_;
  std::vector<std::uint64_t> need_;  // scratch per group
  std::vector<std::uint8_t> cow_;    // scratch per group
  std::vector<std::uint64_t> sim_a_, sim_f_, sim_e_;  // scratch of feasible()
  std::uint32_t replay_epoch_ = 0;
  std::uint64_t slot_units_ = 0;  // lcm of the groups' n (0: too large, no quick refusal)
  PageId victims_[kVictimsAhead] = {};  // prefetch_victims' ring of step-3 victims ahead
  std::uint32_t vfirst_ = 0, vcount_ = 0;
  std::vector<PageId> vpos_;  // per source: its next entry not yet in the ring (kNullPage: none)
  std::vector<PageId> rpos_;  // per source: replay_feasible's cursor
  std::vector<std::vector<PageId>> probe_memo_;  // scratch of lookup_prefix, per group
  std::vector<std::uint64_t> accepted_;          // per group: its last valid prefix
  static constexpr std::uint64_t kNotFused = ~std::uint64_t{0};
  std::vector<std::uint64_t> first_miss_;  // per group: first missing page (probe_full_attention)
  std::uint64_t lookups_ = 0, lookup_tokens_ = 0, hit_tokens_ = 0;
  // Changes to page references, lists or allocators since construction (a public call
  // that makes any, and each stale entry dropped): a reset with the count its lookup left
  // is undone in place.
  mutable std::uint64_t mutations_ = 0;
  // A request had a retention level other than 0 (only then can a page be released at one).
  bool levels_used_ = false;
  void mutated() const { ++mutations_; }
};

}  // namespace kvmm
