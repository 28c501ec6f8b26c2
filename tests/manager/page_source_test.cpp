// The manager over a large-page source that backs pages on demand (issue 15 item 7):
// ArenaPagePool over an elastic KVArena on host memory with a chunk limit, and over a
// backend that fails at a chosen call. An allocate whose pages cannot all be backed
// returns false (or, for a backend that raises, propagates the error) with nothing
// changed; randomized traffic keeps every invariant of the manager, the pool and the arena.
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/memory/arena_page_pool.hpp"
#include "kvmm/memory/host_memory.hpp"
#include "kvmm/memory/kv_arena.hpp"
#include "kvmm/paging/kv_allocator.hpp"
#include "kvmm/testing/faulty_memory.hpp"

#include <catch2/catch.hpp>

#include <random>
#include <vector>

using namespace kvmm;

namespace {

// full: 2 layers x K,V x 16 tokens x 64 dims x 2 bytes = 8192 B; swa: 2048 B; LCM 8192.
KVLayout layout() {
  return KVLayout::plan(
      {LayerGroup::full_attention("full", 2, 1, 64, 2, 16), LayerGroup::sliding_window("swa", 1, 1, 32, 2, 16, 64)});
}

struct Snap {
  std::uint32_t free_large;
  std::vector<std::uint32_t> used, evictable;
  std::vector<std::vector<PageId>> rows;
  std::uint64_t allocated;
  bool operator==(const Snap&) const = default;
};

Snap snap(const KVCacheManager& kv, const std::vector<RequestId>& live) {
  Snap s{kv.large_pages().num_free(), {}, {}, {}, 0};
  for (GroupId g = 0; g < 2; ++g) {
    s.used.push_back(kv.page_counts(g).used);
    s.evictable.push_back(kv.page_counts(g).evictable);
    for (RequestId r : live) s.rows.emplace_back(kv.page_table(r, g).begin(), kv.page_table(r, g).end());
  }
  for (RequestId r : live) s.allocated += kv.num_allocated(r);
  return s;
}

std::vector<std::uint32_t> ids(std::uint32_t n, std::uint32_t salt) {
  std::vector<std::uint32_t> t(n);
  for (std::uint32_t i = 0; i < n; ++i) t[i] = salt * 1000 + i % 64;
  return t;
}

// 16 large pages in an elastic arena whose backend fails where a test arms it.
struct FailingArena {
  HostMemory host{{.chunk_bytes = 16384, .max_chunks = 64}};
  FaultyMemory faulty{host};
  ChunkPool chunks{faulty, {.max_chunks = 64}};
  KVArena arena{chunks, layout(), {.num_large_pages = 16, .backing = ArenaBacking::kElastic}};
  ArenaPagePool source{arena};
};

}  // namespace

TEST_CASE("manager over an elastic arena: pages that cannot be backed refuse the allocate, nothing changed",
          "[manager][source]") {
  HostMemory host({.chunk_bytes = 16384, .max_chunks = 4});  // 2 large pages per chunk: 8 backable
  ChunkPool chunks(host, {.max_chunks = 64});
  KVArena arena(chunks, layout(), {.num_large_pages = 16, .backing = ArenaBacking::kElastic});
  ArenaPagePool source(arena);
  CHECK_THROWS_WITH(KVCacheManager(layout(), {.num_large_pages = 8, .large_page_source = &source}),
                    Catch::Contains("large_page_source: holds 16"));
  KVCacheManager kv(layout(), {.num_large_pages = 16, .max_requests = 4, .large_page_source = &source});
  kv.begin_step();
  const RequestId a = kv.add_request(ids(40, 1));
  kv.lookup_prefix(a);
  REQUIRE(kv.allocate(a, 40));  // full: 3 large pages, swa: 1
  kv.commit(a, 40);
  CHECK(arena.num_backed_chunks() == 2);
  const RequestId b = kv.add_request(ids(128, 2));
  kv.lookup_prefix(b);
  const Snap before = snap(kv, {a, b});
  const std::uint32_t chunks_before = arena.num_backed_chunks();
  CHECK_FALSE(kv.allocate(b, 128));  // 9 large pages: the pool has 12 ids, only 4 can be backed
  CHECK(snap(kv, {a, b}) == before);
  kv.begin_step();  // pages backed for the refused allocate go back at the next step
  CHECK(arena.num_backed_chunks() == chunks_before);
  kv.check_invariants();
  source.check_invariants();
  CHECK(kv.counters().refused_admissions == 1);
  REQUIRE(kv.allocate(b, 48));  // what can be backed still serves
  kv.commit(b, 48);
  kv.free(a);
  kv.free(b);
  kv.check_invariants();
  source.check_invariants();
}

TEST_CASE("manager over an arena whose backend fails at every call position in turn", "[manager][source]") {
  for (std::uint64_t position = 1; position <= 12; ++position) {
    for (const FaultMode mode : {FaultMode::kReturnFalse, FaultMode::kThrow}) {
      FailingArena env;
      FaultyMemory& faulty = env.faulty;
      KVArena& arena = env.arena;
      ArenaPagePool& source = env.source;
      KVCacheManager kv(layout(), {.num_large_pages = 16, .max_requests = 4, .large_page_source = &source});
      kv.begin_step();
      const RequestId a = kv.add_request(ids(40, 1));
      kv.lookup_prefix(a);
      REQUIRE(kv.allocate(a, 40));
      kv.commit(a, 40);
      const RequestId b = kv.add_request(ids(96, 2));
      kv.lookup_prefix(b);
      const Snap before = snap(kv, {a, b});
      faulty.fail_at(position, mode);
      bool ok = false;
      bool raised = false;
      try {
        ok = static_cast<bool>(kv.allocate(b, 96));
      } catch (const Error&) {
        raised = true;
      }
      INFO("position " << position << " mode " << static_cast<int>(mode));
      if (faulty.fired()) {  // the failure hit the allocate: refused or raised, nothing changed
        CHECK_FALSE(ok);
        CHECK(raised == (mode == FaultMode::kThrow));
        CHECK(snap(kv, {a, b}) == before);
      } else {
        CHECK(ok);  // fewer backend calls than the position: served
      }
      faulty.fail_at(0);
      kv.check_invariants();
      source.check_invariants();
      if (!ok) REQUIRE(kv.allocate(b, 96));  // the backend works again: served
      kv.commit(b, 96);
      kv.free(a);
      kv.free(b);
      kv.check_invariants();
      source.check_invariants();
      kv.reset_prefix_cache();                // the cached pages become empty, their large pages free
      kv.begin_step();                        // freed pages stay backed until the next step (swap plans read them)
      CHECK(arena.num_backed_chunks() == 0);  // every chunk released with its last page
    }
  }
}

TEST_CASE("manager over an elastic arena: random traffic with caching and evictions stays consistent",
          "[manager][source]") {
  HostMemory host({.chunk_bytes = 16384, .max_chunks = 5});  // 10 of 16 large pages backable
  ChunkPool chunks(host, {.max_chunks = 64});
  KVArena arena(chunks, layout(), {.num_large_pages = 16, .backing = ArenaBacking::kElastic});
  ArenaPagePool source(arena);
  // No retention (a refused allocate releases held pages: retention_pressure_test.cpp), so a
  // refusal changes nothing at all.
  KVCacheManager kv(layout(),
                    {.num_large_pages = 16, .max_requests = 4, .large_page_source = &source, .retention_budget = 0});
  std::mt19937_64 rng(23);
  std::vector<RequestId> live;
  std::uint64_t refused = 0, served = 0;
  for (int op = 0; op < 3000; ++op) {
    kv.begin_step();
    if (live.size() < 4 && rng() % 3 == 0) {
      const RequestId r = kv.add_request(ids(16 + rng() % 64, static_cast<std::uint32_t>(rng() % 3)));
      kv.lookup_prefix(r);
      const Snap before = snap(kv, live);
      if (kv.allocate(r, static_cast<std::uint32_t>(kv.num_tokens(r) - kv.num_computed(r)))) {
        kv.commit(r, kv.num_tokens(r));
        live.push_back(r);
      } else {
        ++refused;
        REQUIRE(snap(kv, live) == before);
        kv.free(r);
      }
    } else if (!live.empty()) {
      const std::size_t k = rng() % live.size();
      const RequestId r = live[k];
      if (rng() % 4 == 0) {
        kv.free(r);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        ++served;
      } else {
        kv.append_token(r, static_cast<std::uint32_t>(rng() % 64));
        const Snap before = snap(kv, live);
        if (kv.allocate(r, 1)) {
          kv.commit(r, kv.num_computed(r) + 1);
        } else {
          ++refused;
          REQUIRE(snap(kv, live) == before);
        }
      }
    }
    kv.check_invariants();
    source.check_invariants();
    REQUIRE(arena.num_backed_chunks() <= 5);
  }
  CHECK(refused > 10);
  CHECK(served > 100);
  CHECK(kv.page_counts(0).evicted > 0);
}

// PagedKVAllocator (the allocation core without caching) over the same failing arena: an
// append_tokens whose backend refuses or raises at any call position leaves every table,
// count and backed chunk as it was (issue 29 item 7: a raising backend left the pages taken
// so far in the request's table, "request 0 group 0 holds 3 pages for 0 tokens").
TEST_CASE("PagedKVAllocator over an arena whose backend fails at every call position in turn", "[paging][source]") {
  struct State {
    std::uint32_t free_large;
    std::vector<std::vector<PageId>> rows;
    std::uint64_t tokens;
    std::uint32_t chunks;
    bool operator==(const State&) const = default;
  };
  std::uint64_t fired = 0;
  for (std::uint64_t position = 1; position <= 40; ++position) {
    for (const FaultMode mode : {FaultMode::kReturnFalse, FaultMode::kThrow}) {
      FailingArena env;
      FaultyMemory& faulty = env.faulty;
      KVArena& arena = env.arena;
      ArenaPagePool& source = env.source;
      PagedKVAllocator kv(layout(), {.num_large_pages = 16, .max_requests = 4, .large_page_source = &source});
      const RequestId a = kv.add_request();
      REQUIRE(kv.append_tokens(a, 20));
      const RequestId b = kv.add_request();
      auto state = [&] {
        State s{kv.large_pages().num_free(), {}, kv.num_tokens(a) + kv.num_tokens(b), arena.num_backed_chunks()};
        for (GroupId g = 0; g < 2; ++g)
          for (RequestId r : {a, b})
            s.rows.emplace_back(kv.page_tables(g).pages(Row{r}).begin(), kv.page_tables(g).pages(Row{r}).end());
        return s;
      };
      const State before = state();
      faulty.fail_at(position, mode);
      bool ok = false, raised = false;
      try {
        ok = kv.append_tokens(b, 100);  // full: 7 pages, swa: 7 pages, over several fresh large pages
      } catch (const Error&) {
        raised = true;
      }
      INFO("position " << position << " mode " << static_cast<int>(mode));
      if (faulty.fired()) {  // refused or raised with nothing changed, or served from other chunks
        ++fired;
        CHECK(raised == (mode == FaultMode::kThrow));
        if (!ok) CHECK(state() == before);
        CHECK((ok || raised || mode == FaultMode::kReturnFalse));
      } else {
        CHECK(ok);
      }
      faulty.fail_at(0);
      kv.check_invariants();
      source.check_invariants();
      if (!ok) REQUIRE(kv.append_tokens(b, 100));  // the backend works again: served
      kv.free_request(a);
      kv.free_request(b);
      kv.check_invariants();
      CHECK(arena.num_backed_chunks() == 0);  // every chunk released with its last page
    }
  }
  CHECK(fired >= 8);  // the append reached the backend at several positions
}
