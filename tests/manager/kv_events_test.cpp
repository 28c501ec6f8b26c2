// The manager's KV events (record_kv_events, take_events(KvEventBatch&)), read as a router
// reads them: every stored page's hash is rebuilt from the event's fields alone (parent,
// token ids, LoRA id, salt, multimodal extra keys), and the set the events describe equals
// the manager's own cached set after every step of seeded random traffic (evictions, swaps,
// forks, preemption, reset_prefix_cache). Exact cases: the fields of a worked example, one
// cleared event per reset_prefix_cache, nothing for encoder-token groups, nothing for a hash
// that moves to a copy of the same content, nothing when off.
#include "kvmm/manager/kv_cache_manager.hpp"
#include "support/kv_traffic.hpp"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <set>
#include <vector>

using namespace kvmm;
using namespace kvmm::test;

namespace {

// A router's view of one replica: the (group, hash) blocks its events say are cached.
struct RouterModel {
  const KVLayout& layout;
  std::set<CachedBlock> blocks;
  std::uint64_t stored = 0, removed = 0, cleared = 0, runs = 0, long_runs = 0, with_parent = 0, items = 0, salts = 0,
                lora = 0;
  BlockHasher hasher = {};  // the replica's KVCacheManagerOptions::block_hash

  void apply(const KvEventBatch& b) {
    for (const KvEvent& e : b.events) {
      if (e.kind == KvEventKind::kCleared) {
        blocks.clear();
        ++cleared;
        continue;
      }
      REQUIRE(e.group < layout.num_groups());
      REQUIRE(layout.group(e.group).is_decoder());
      REQUIRE(e.num_pages > 0);
      REQUIRE(e.medium == Medium::kDevice);
      const auto hashes = b.hashes_of(e);
      if (e.kind == KvEventKind::kRemoved) {
        for (const BlockHash& h : hashes) REQUIRE(blocks.erase({e.group, {h.lo, h.hi}}) == 1);
        removed += e.num_pages;
        continue;
      }
      check_stored(b, e);
      for (const BlockHash& h : hashes) REQUIRE(blocks.insert({e.group, {h.lo, h.hi}}).second);
      stored += e.num_pages;
      ++runs;
      long_runs += e.num_pages > 1;
    }
  }

  // The hashes are what a router computes from the fields with the replica's hash function
  // (block_hash.hpp's chain by default). A run from page 0 says whether its request is
  // salted; a later run's parent does under salted_only (bit 63, BlockHasher::kSaltedBit).
  void check_stored(const KvEventBatch& b, const KvEvent& e) {
    const std::uint32_t P = layout.group(e.group).tokens_per_page;
    REQUIRE(e.tokens_per_page == P);
    REQUIRE(e.has_parent == (e.first_page > 0));
    REQUIRE(b.tokens_of(e).size() == std::size_t{e.num_pages} * P);
    with_parent += e.has_parent;
    salts += !b.salt_of(e).empty();
    lora += e.lora_id != 0;
    items += e.num_items;
    BlockHash parent = e.has_parent ? e.parent : BlockHash{};
    const bool salted = e.has_parent ? (e.parent.hi & BlockHasher::kSaltedBit) != 0 : !b.salt_of(e).empty();
    const auto items_of = b.items_of(e);
    std::size_t k = 0;
    for (std::uint32_t j = 0; j < e.num_pages; ++j) {
      PageExtraKeys ex;
      ex.lora_id = e.lora_id;
      if (e.first_page + j == 0) ex.salt = b.salt_of(e);
      std::vector<MultimodalItem> page_items;
      for (; k < items_of.size() && items_of[k].page_in_run == j; ++k)
        page_items.push_back(MultimodalItem{items_of[k].item_hash, 0, 0});
      std::size_t i = 0;
      if (!page_items.empty()) {
        ex.item = &page_items[0];
        ex.item_offset = static_cast<std::uint64_t>(items_of[k - page_items.size()].offset);
        i = 1;
      }
      BlockHash h = hasher.hash_page(salted, parent, b.tokens_of(e).subspan(std::size_t{j} * P, P), ex);
      for (; i < page_items.size(); ++i) {
        PageExtraKeys more;
        more.item = &page_items[i];
        more.item_offset = static_cast<std::uint64_t>(items_of[k - page_items.size() + i].offset);
        h = hasher.hash_page(salted, h, {}, more);
      }
      REQUIRE(h == b.hashes_of(e)[j]);
      parent = h;
    }
    REQUIRE(k == items_of.size());
  }
};

std::uint64_t env_or(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::strtoull(v, nullptr, 10) : fallback;
}

}  // namespace

TEST_CASE("KV events rebuild the manager's cached set after every step, each hash from its fields",
          "[manager][events][random]") {
  // 5 seeds x 20,000 operations (KVMM_EVENT_OPS per seed to run longer).
  const std::uint64_t ops = env_or("KVMM_EVENT_OPS", 20000);
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    INFO("seed " << seed);
    KvTraffic traffic(seed);
    RouterModel router{traffic.manager().layout(), {}};
    KvEventBatch batch;
    std::uint64_t steps = 0;
    while (traffic.ops() < ops) {
      traffic.step();
      traffic.manager().take_events(batch);
      router.apply(batch);
      REQUIRE(router.blocks == traffic.cached_set());
      ++steps;
    }
    traffic.manager().check_invariants();
    const ManagerCounters c = traffic.manager().counters();
    // The traffic exercised what the events must follow.
    CHECK(router.removed > 100);
    CHECK(router.cleared == traffic.resets_of_cache());
    CHECK(router.cleared > 0);
    CHECK(router.long_runs > 100);
    CHECK(router.with_parent > 100);
    CHECK(router.items > 10);
    CHECK(router.salts > 10);
    CHECK(router.lora > 10);
    CHECK(c.swapped_in_pages > 0);
    WARN("seed " << seed << ": " << steps << " steps, " << router.stored << " pages stored in " << router.runs
                 << " runs, " << router.removed << " removed, " << router.cleared << " clears, " << c.swapped_in_pages
                 << " pages swapped in");
  }
}

TEST_CASE("KV events carry the block hash function the manager was given", "[manager][events][hasher]") {
  // Per mode, seed 1 for 6,000 operations: a router with the same BlockHasher rebuilds every
  // stored hash from the event's fields, and its set equals the manager's after each step.
  for (const auto& [f, salted_only] :
       {std::pair{BlockHashFunction::kSha256, false}, std::pair{BlockHashFunction::kSha256, true},
        std::pair{BlockHashFunction::kBlake2bKeyed, false}, std::pair{BlockHashFunction::kBlake2bKeyed, true}}) {
    INFO(to_string(f) << " salted_only " << salted_only);
    BlockHashOptions o;
    o.function = f;
    o.salted_only = salted_only;
    if (f == BlockHashFunction::kBlake2bKeyed) o.key = "0123456789abcdef0123456789ABCDEF";
    KvTraffic traffic(1, 40, o);
    RouterModel router{traffic.manager().layout(), {}};
    router.hasher = BlockHasher(o);
    KvEventBatch batch;
    std::uint64_t salted_pages = 0, xxh3_pages = 0;
    while (traffic.ops() < 6000) {
      traffic.step();
      traffic.manager().take_events(batch);
      router.apply(batch);
      REQUIRE(router.blocks == traffic.cached_set());
      for (const KvEvent& e : batch.events) {
        if (e.kind != KvEventKind::kStored) continue;
        // No hash is XXH3-128's (the default's), except unsalted ones under salted_only.
        const bool salted = e.has_parent ? (e.parent.hi & BlockHasher::kSaltedBit) != 0 : !batch.salt_of(e).empty();
        if (salted_only && !salted) {
          ++xxh3_pages;
          continue;
        }
        salted_pages += salted_only;
        if (e.has_parent || e.num_items > 0) continue;
        PageExtraKeys ex;
        ex.lora_id = e.lora_id;
        ex.salt = batch.salt_of(e);
        CHECK_FALSE(batch.hashes_of(e)[0] == hash_page({}, batch.tokens_of(e).subspan(0, e.tokens_per_page), ex));
      }
    }
    CHECK(router.stored > 100);
    CHECK(router.salts > 3);
    if (salted_only) {
      CHECK(salted_pages > 10);
      CHECK(xxh3_pages > 100);
    }
  }
}

TEST_CASE("KV events: the fields of a worked example", "[manager][events]") {
  const KVLayout layout = traffic_layout();  // full P=4, window 12 P=4, Mamba P=8, cross P=4
  KVCacheManager kv(layout, {.num_large_pages = 40, .record_kv_events = true});
  std::vector<std::uint32_t> t(10);
  for (std::uint32_t i = 0; i < 10; ++i) t[i] = 100 + i;
  const MultimodalItem img{hash_bytes(std::as_bytes(std::span("img", 3))), 5, 2};
  const RequestId r = kv.add_request(t, {.lora_id = 7, .items = std::span(&img, 1), .cache_salt = "s1"});
  kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, 10));
  kv.commit(r, 10);
  KvEventBatch b;
  kv.take_events(b);
  // One run per decoder group, in group order: full (pages 0-1), window (0-1), Mamba (0).
  REQUIRE(b.events.size() == 3);
  const std::uint32_t pages[3] = {2, 2, 1};
  for (GroupId g = 0; g < 3; ++g) {
    const KvEvent& e = b.events[g];
    CHECK(e.kind == KvEventKind::kStored);
    CHECK(e.group == g);
    CHECK(e.num_pages == pages[g]);
    CHECK(e.first_page == 0);
    CHECK_FALSE(e.has_parent);
    CHECK(e.lora_id == 7);
    CHECK(b.salt_of(e) == "s1");
    CHECK(e.tokens_per_page == layout.group(g).tokens_per_page);
    const auto tok = b.tokens_of(e);
    CHECK(std::vector<std::uint32_t>(tok.begin(), tok.end()) ==
          std::vector<std::uint32_t>(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(tok.size())));
    // The image is tokens [5, 7): in the 4-token groups it overlaps page 1 ([4, 8)), which
    // starts one token before it (offset -1); in Mamba's page 0 ([0, 8)), five before.
    REQUIRE(e.num_items == 1);
    const KvEventItemKey& item = b.items_of(e)[0];
    CHECK(item.item_hash == img.hash);
    CHECK(item.page_in_run == (g == 2 ? 0u : 1u));
    CHECK(item.offset == (g == 2 ? -5 : -1));
  }
  const std::vector<BlockHash> full(b.hashes_of(b.events[0]).begin(), b.hashes_of(b.events[0]).end());
  // Two more tokens complete page 2: a run of one page whose parent is page 1.
  kv.append_tokens(r, std::vector<std::uint32_t>{110, 111});
  REQUIRE(kv.allocate(r, 2));
  kv.commit(r, 12);
  kv.take_events(b);
  REQUIRE(b.events.size() == 2);  // full and window; Mamba's next page ends at 16
  CHECK(b.events[0].first_page == 2);
  CHECK(b.events[0].has_parent);
  CHECK(b.events[0].parent == full[1]);
  CHECK(b.salt_of(b.events[0]).empty());  // the salt keys page 0 only
  CHECK(b.events[0].num_items == 0);
  // reset_prefix_cache: one cleared event, no removal per page.
  kv.free(r);
  kv.reset_prefix_cache();
  kv.take_events(b);
  REQUIRE(b.events.size() == 1);
  CHECK(b.events[0].kind == KvEventKind::kCleared);
  CHECK(b.hashes.empty());
}

TEST_CASE("KV events: evictions are removed runs; encoder groups and hand-overs emit nothing", "[manager][events]") {
  const KVLayout layout = traffic_layout();
  KVCacheManager kv(layout, {.num_large_pages = 40, .record_events = true, .record_kv_events = true});
  RouterModel router{layout, {}};
  KvEventBatch b;
  std::vector<CacheEvent> page_events;
  auto take = [&] {
    kv.take_events(page_events);
    kv.take_events(b);
    router.apply(b);
    REQUIRE(router.blocks == cached_blocks(kv));
  };
  std::vector<std::uint32_t> t(16, 5);
  const MultimodalItem img{hash_bytes(std::as_bytes(std::span("img", 3))), 0, 8};
  // A request whose image fills cross-attention pages: page events for the cross group,
  // no KV event.
  const RequestId a = kv.add_request(t, {.items = std::span(&img, 1)});
  kv.lookup_prefix(a);
  REQUIRE(kv.allocate(a, 16));
  kv.commit(a, 16);
  take();
  const GroupId cross = 3;
  std::uint64_t cross_pages = 0;
  for (const CacheEvent& e : page_events) cross_pages += e.group == cross;
  CHECK(cross_pages == 2);
  for (const KvEvent& e : b.events) CHECK(e.group != cross);
  // The same content computed again by a second request while a holds its pages: the
  // pages a still uses stay a's, c's become copies; the pages a released (the window's
  // first page, Mamba's first checkpoint) are taken over at once (removed, stored again).
  // When a frees, c's copies take the hashes over (issue 17's hand-over): page events
  // show the moves, the router's set does not change, so no KV event.
  const std::set<CachedBlock> before = router.blocks;
  const RequestId c = kv.add_request(t, {.items = std::span(&img, 1)});
  REQUIRE(kv.allocate(c, 16));  // no lookup: computed again
  kv.commit(c, 16);
  take();
  CHECK(router.blocks == before);
  kv.free(a);
  take();
  std::uint64_t moved = 0;
  for (const CacheEvent& e : page_events) moved += e.kind == CacheEventKind::kStored;
  CHECK(moved > 0);
  CHECK(b.events.empty());
  // Growing a request past the pool evicts everything cached before: removed runs, no
  // encoder group among them.
  kv.free(c);
  take();
  std::vector<std::uint32_t> big(400);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::uint32_t>(1000 + i);
  const RequestId d = kv.add_request(big);
  std::uint64_t removed = 0;
  for (std::uint64_t done = 0; kv.allocate(d, 16); done += 16) {
    kv.commit(d, done + 16);
    take();
    for (const KvEvent& e : b.events) {
      CHECK(e.group != cross);
      if (e.kind == KvEventKind::kRemoved) removed += e.num_pages;
    }
  }
  CHECK(removed >= before.size());
  for (const CachedBlock& x : before) CHECK(router.blocks.count(x) == 0);
  kv.free(d);
}

TEST_CASE("KV events: nothing is recorded when record_kv_events is off", "[manager][events]") {
  KVCacheManager kv(traffic_layout(), {.num_large_pages = 40, .record_events = true});
  std::vector<std::uint32_t> t(16, 5);
  const RequestId r = kv.add_request(t);
  REQUIRE(kv.allocate(r, 16));
  kv.commit(r, 16);
  kv.reset_prefix_cache();
  KvEventBatch b;
  b.events.resize(3);  // cleared by take_events
  kv.take_events(b);
  CHECK(b.empty());
  std::vector<CacheEvent> pages;
  kv.take_events(pages);
  CHECK_FALSE(pages.empty());
}
