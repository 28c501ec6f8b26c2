// One layer group inside the manager (private to src/manager/): its description and hit
// rules, its small-page allocator and page tables, and one 64-byte record per small page
// that everything a page's allocation, commit, release, eviction and probes read shares
// (one cache line per page touched). Host pages (swap_out) are the swap unit's (swap.hpp).
#pragma once

#include "draft_policy.hpp"
#include "kvmm/caching/block_hash.hpp"
#include "kvmm/caching/evictor.hpp"
#include "kvmm/caching/layer_policy.hpp"
#include "kvmm/paging/large_page_pool.hpp"
#include "kvmm/paging/page_table.hpp"
#include "kvmm/paging/small_page_allocator.hpp"
#include "kvmm/spec/kv_layout.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace kvmm::detail {

// A small page's state. node.key is the page's last access step and prefix length, listed
// in the group's LRU or not; a listed key never changes in place. `seq` is its insertion
// number while listed: step 3's tie-break across lists (see PageStore).
struct alignas(64) PageRec {
  LruNode node;
  BlockHash hash;  // valid while hashed or copy
  std::uint32_t ref = 0;
  std::uint8_t hashed = 0;
  // Used, not cached: the same content as a cached page that was in use when this one was
  // registered; listed in PageStore's copies, it takes the hash over when that page is
  // released (PageStore::hand_over).
  std::uint8_t copy = 0;
  std::uint8_t prio = 0;
  // Cached under a partial page's key (a finished request's last page, hit_unit): its hash
  // is no chain a router follows, so its eviction makes a page event only.
  std::uint8_t partial = 0;
  std::uint64_t seq = 0;
};
static_assert(sizeof(PageRec) == 64, "one cache line per page");
using SmallLru = LruOrder<MemberNodes<PageRec, &PageRec::node>>;

struct Group {
  Group(const KVLayout& layout, GroupId g, LargePagePool& pool, std::uint32_t max_requests);

  // What the group is.
  LayerGroup spec;
  std::uint32_t P;  // tokens per page
  std::uint32_t n;  // small pages per large page
  // The large page small page p lives in, and the first small page of large page lp
  // (small ids of a group are large id * n + slot). O(1): one division or product.
  LargePageId large_of(PageId p) const { return LargePageId{p / n}; }
  PageId first_small(LargePageId lp) const { return lp.index * n; }
  bool decoder;
  std::uint32_t hash_class = 0;  // decoder groups of equal P share one hash chain
  bool whole_prefix = false;     // policy->hit_needs_whole_prefix(): probed in page order
  bool draft = false;            // a draft group (spec.draft): never shortens the hit
  std::uint32_t successors = 0;  // a page's key covers this many ids after it (drafts, spec.successor_tokens)
  std::uint64_t age_bias = 0;    // eviction keys this many steps older (drafts)
  // Whether its pages make router KV events (stored and removed alike): decoder groups
  // keyed by the token chain; not encoder-token groups (keyed by image) nor successor-keyed
  // drafts (no chain a router follows). O(1).
  bool announced() const { return decoder && successors == 0; }
  bool tagged = false;                  // spec.tagged_checkpoints: cached by tag_state only
  std::unique_ptr<LayerPolicy> policy;  // decoder groups
  ImagePolicy image;                    // encoder-token groups

  // Device pages.
  SmallPageAllocator alloc;
  PageTableSet table;
  std::vector<PageRec> pg;
  // Evictable pages, plus stale entries of pages a hit pinned (ref > 0) since: a hit only
  // counts them out; whoever meets one at the front drops it (lazy pinning).
  mutable SmallLru lru;
  std::uint32_t evictable = 0;
  std::uint64_t hit_pages = 0;
  std::uint64_t evicted = 0;
};

inline Group::Group(const KVLayout& layout, GroupId g, LargePagePool& pool, std::uint32_t max_requests)
    : spec(layout.group(g)),
      P(spec.tokens_per_page),
      n(layout.small_pages_per_large_page(g)),
      decoder(spec.is_decoder()),
      policy(decoder ? make_policy(spec) : nullptr),
      alloc(g, n, pool, max_requests),
      table(max_requests, P),
      pg(std::size_t{pool.capacity()} * n),
      lru(pool.capacity() * n, {pg.data()}) {
  image.release_when_consumed = spec.kind == LayerKind::kVisionEmbedding;
  whole_prefix = decoder && policy->hit_needs_whole_prefix();
  draft = spec.is_draft();
  successors = spec.successor_tokens;  // a target group keyed as a draft is (full attention)
  if (draft) {
    successors = spec.draft->successor_tokens;
    age_bias = spec.draft->evict_sooner_steps;
    policy = draft_policy(std::move(policy), age_bias > 0);
  }
  tagged = spec.tagged_checkpoints;
}

}  // namespace kvmm::detail
