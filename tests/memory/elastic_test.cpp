#include "kvmm/error.hpp"
#include "kvmm/memory/activation_allocator.hpp"
#include "kvmm/memory/arena_page_pool.hpp"
#include "kvmm/memory/elastic_memory.hpp"
#include "kvmm/memory/host_memory.hpp"
#include "kvmm/memory/host_offload.hpp"
#include "kvmm/memory/virtual_kv_cache.hpp"
#include "kvmm/testing/faulty_memory.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <vector>

using namespace kvmm;

namespace {
constexpr std::uint64_t kChunk = 4096;
std::byte* ptr(std::uint64_t a) { return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(a)); }
}  // namespace

TEST_CASE("ActivationAllocator: best fit over whole chunks, coalescing, idle chunks kept mapped") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 32});
  ActivationAllocator act(pool, 16 * kChunk);
  const auto a = act.allocate(3 * kChunk);      // [0,3)
  const auto b = act.allocate(1);               // [3,4): rounded up to a chunk
  const auto c = act.allocate(2 * kChunk + 1);  // [4,7)
  const auto d = act.allocate(kChunk);          // [7,8)
  REQUIRE((a && b && c && d));
  CHECK(*b == act.base() + 3 * kChunk);
  CHECK(act.mapped_chunks() == 8);
  CHECK(pool.owned(ChunkOwner::kActivation) == 8);
  std::memset(ptr(*c), 0x6D, 3 * kChunk);
  act.free(*a);  // hole of 3
  act.free(*c);  // hole of 3 at [4,7)
  CHECK(act.idle_chunks() == 6);
  CHECK(act.mapped_chunks() == 8);  // freed chunks stay mapped for reuse
  // Best fit: a 2-chunk request takes the smallest hole that holds it (3 at offset 0,
  // the lower of two equal holes), not the 8-chunk tail.
  const auto calls = pool.stats().backend_calls;
  const auto e = act.allocate(2 * kChunk);
  REQUIRE(e);
  CHECK(*e == act.base());
  CHECK(pool.stats().backend_calls == calls);  // already mapped: no backend call
  act.free(*b);                                // [2,7) coalesces: hole of 5
  act.check_invariants();
  const auto f = act.allocate(5 * kChunk);
  REQUIRE(f);
  CHECK(*f == act.base() + 2 * kChunk);
  CHECK(ptr(*f + 2 * kChunk)[17] == std::byte{0x6D});  // same chunk, same bytes
  CHECK_FALSE(act.allocate(17 * kChunk));
  CHECK_THROWS_WITH(act.free(*f + kChunk), Catch::Contains("not a live activation allocation"));
  act.free(*f);
  CHECK_THROWS_WITH(act.free(*f), Catch::Contains("double free"));
  act.check_invariants();
  // GC hands idle chunks back to the pool.
  CHECK(act.gc(4) == 4);
  CHECK(act.mapped_chunks() == 4);
  CHECK(pool.stats().idle == 4);
  act.check_invariants();
  pool.check_invariants();
}

TEST_CASE("ActivationAllocator: seeded random allocate/free/gc with faults keeps every invariant") {
  HostMemory host({.chunk_bytes = kChunk});
  FaultyMemory faulty(host);
  ChunkPool pool(faulty, {.max_chunks = 48});
  ActivationAllocator act(pool, 64 * kChunk);
  std::mt19937 rng(2024);
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint8_t>> live;
  int ok = 0;
  for (int op = 0; op < 5000; ++op) {
    const int kind = int(rng() % 10);
    if (kind < 5) {
      const std::uint64_t bytes = 1 + rng() % (6 * kChunk);
      if (rng() % 10 == 0) faulty.fail_at(1 + rng() % 6);
      const auto mapped = act.mapped_chunks();
      const auto p = act.allocate(bytes);
      faulty.fail_at(0);
      if (p) {
        ++ok;
        const std::uint8_t t = std::uint8_t(rng());
        std::memset(ptr(*p), t, bytes);
        live[*p] = {bytes, t};
      } else {
        REQUIRE(act.mapped_chunks() == mapped);
      }
    } else if (kind < 9 && !live.empty()) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      REQUIRE(ptr(it->first)[it->second.first - 1] == std::byte{it->second.second});
      act.free(it->first);
      live.erase(it);
    } else {
      act.gc(rng() % 8);
    }
    act.check_invariants();
    pool.check_invariants();
    REQUIRE(host.live_chunks() == pool.stats().created);
  }
  CHECK(ok > 1000);
}

TEST_CASE(
    "ElasticMemory: inflate lends idle activation chunks to KV, deflate gives them back, never touching live memory") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 16});
  pool.set_quota(ChunkOwner::kKVArena, 8);
  pool.set_quota(ChunkOwner::kActivation, 8);
  ActivationAllocator act(pool, 16 * kChunk);
  // KV: an elastic arena of 16 one-chunk large pages (8192-byte pages on 4 KiB chunks = 2).
  const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 64, 2, 32)});
  REQUIRE(layout.large_page_bytes() == 8192);
  KVArena arena(pool, layout, {.num_large_pages = 8, .backing = ArenaBacking::kElastic});
  ArenaPagePool pages(arena);
  ElasticMemory elastic(pool, act, ChunkOwner::kKVArena);

  // Activations of a prefill: 6 chunks live, then 4 freed (idle but mapped).
  const auto big = act.allocate(4 * kChunk), keep = act.allocate(2 * kChunk);
  REQUIRE((big && keep));
  std::memset(ptr(*keep), 0x21, 2 * kChunk);
  act.free(*big);
  std::vector<LargePageId> kv;
  for (int i = 0; i < 4; ++i) kv.push_back(*pages.allocate(0));
  CHECK_FALSE(pages.allocate(0));  // KV quota of 8 chunks used up
  CHECK(elastic.kv_free() == 0);

  // Inflate by 5: 2 quota slack + 4 idle -> GC unmaps 3 idle chunks and moves quota.
  CHECK_FALSE(elastic.inflate(7));  // only 6 could be freed: nothing changes
  CHECK(elastic.kv_quota() == 8);
  CHECK(act.mapped_chunks() == 6);
  REQUIRE(elastic.inflate(5));
  CHECK(elastic.kv_quota() == 13);
  CHECK(elastic.activation_quota() == 3);
  CHECK(act.mapped_chunks() == 3);
  CHECK(ptr(*keep)[100] == std::byte{0x21});  // live activations untouched
  for (int i = 0; i < 2; ++i) kv.push_back(*pages.allocate(0));
  CHECK(pool.owned(ChunkOwner::kKVArena) == 12);
  pool.check_invariants();
  // Deflate: KV must be able to give back that many (its free pages' chunks are
  // already unmapped in an elastic arena).
  CHECK_FALSE(elastic.deflate(2));  // 13 - 12 = 1 slack
  REQUIRE(elastic.balloon(-1));
  pages.free(kv.back());
  kv.pop_back();
  REQUIRE(elastic.deflate(2));
  CHECK(elastic.kv_quota() == 10);
  CHECK(elastic.activation_quota() == 6);
  REQUIRE(act.allocate(3 * kChunk));
  act.check_invariants();
  pages.check_invariants();
  pool.check_invariants();
  for (const LargePageId p : kv) pages.free(p);
}

TEST_CASE("ElasticMemory: deflation reclaims chunks cached by inactive virtual KV slots") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 24});
  pool.set_quota(ChunkOwner::kVirtualTensor, 16);
  pool.set_quota(ChunkOwner::kActivation, 8);
  VirtualKVCacheOptions o;
  o.num_layers = 1;
  o.max_batch = 4;
  o.max_context = 64;
  o.kv_heads = 1;
  o.head_dim = 128;
  o.dtype_bytes = 2;
  o.page_group_bytes = kChunk;  // 16 tokens per group
  o.background_mapper = false;
  VirtualKVCache cache(pool, o);
  ActivationAllocator act(pool, 24 * kChunk);
  ElasticMemory elastic(
      pool, act, ChunkOwner::kVirtualTensor,
      {[&] { return cache.reclaimable_chunks(); }, [&](std::uint32_t n) { return cache.reclaim(n); }});
  std::vector<std::uint32_t> lens(4, 0);
  const auto a = *cache.alloc_reqid(), b = *cache.alloc_reqid();
  lens[a] = 64;  // 4 groups x 2 tensors = 8 chunks
  lens[b] = 48;  // 6 chunks
  REQUIRE(cache.step(lens));
  cache.free_reqid(b);  // b's 6 chunks stay cached
  lens[b] = 0;
  CHECK(cache.reclaimable_chunks() == 6);
  CHECK_FALSE(elastic.deflate(9));  // 2 slack + 6 cached < 9
  CHECK(pool.owned(ChunkOwner::kVirtualTensor) == 14);
  REQUIRE(elastic.deflate(7));
  CHECK(cache.backed_groups(b) == 0);
  CHECK(cache.backed_groups(a) == 4);  // the active request keeps everything
  CHECK(elastic.activation_quota() == 15);
  REQUIRE(act.allocate(15 * kChunk));
  cache.check_invariants();
  pool.check_invariants();
}

TEST_CASE("plan_elastic_batch follows eLLM Algorithm 1") {
  // P_T = 100, theta = 10; queue of (kv, act).
  const std::vector<ElasticRequest> q = {{30, 10}, {20, 10}, {25, 5}, {5, 5}};
  SECTION("decode admits while the threshold holds, then inflates KV from activations") {
    const auto b = plan_elastic_batch(
        {.phase = ElasticPhase::kDecode, .free_kv = 40, .free_act = 60, .total = 100, .threshold = 10}, q);
    CHECK(b.admitted == 2);  // 30+10+20+10 = 70 <= 90; +30 = 100 > 90
    CHECK(b.kv == 50);
    CHECK(b.act == 20);
    CHECK(b.inflation == 10);  // P_kv 40 < M_kv 50 and P_act 60 > M_act 20
  }
  SECTION("prefill offloads the KV of a request that only fits without it") {
    const auto b = plan_elastic_batch({.phase = ElasticPhase::kPrefill,
                                       .free_kv = 70,
                                       .free_act = 10,
                                       .total = 100,
                                       .threshold = 10,
                                       .host_buffer = 25},
                                      q);
    REQUIRE(b.admitted == 4);
    CHECK(b.offloaded == std::vector<std::uint8_t>{0, 0, 1, 0});  // 25 KV to the CPU buffer
    CHECK(b.kv == 55);
    CHECK(b.act == 30);
    CHECK(b.inflation == -20);  // P_act 10 < M_act 30 and P_kv 70 > M_kv 55: deflate
  }
  SECTION("prefill without buffer room stops at the first request that does not fit") {
    const auto b = plan_elastic_batch({.phase = ElasticPhase::kPrefill,
                                       .free_kv = 50,
                                       .free_act = 50,
                                       .total = 100,
                                       .threshold = 10,
                                       .host_buffer = 24},
                                      q);
    CHECK(b.admitted == 2);
    CHECK(b.inflation == 0);
  }
}

TEST_CASE("HostOffloadBuffer: offload and fetch plans move a request's pages and back, byte for byte") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 16});
  const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 64, 2, 32)});
  KVArena arena(pool, layout, {.num_large_pages = 6, .backing = ArenaBacking::kFull});
  const std::uint64_t page = layout.large_page_bytes();
  HostOffloadBuffer buf(page, 4, 4);
  for (PageId p = 0; p < 6; ++p) std::memset(arena.data() + p * page, int(0x10 + p), page);
  std::vector<OffloadCopy> plan;
  const std::vector<PageId> mine = {4, 1, 5};
  REQUIRE(buf.offload(7, mine, page, plan));
  REQUIRE(plan.size() == 3);
  CHECK(plan[0].device_offset == 4 * page);
  buf.copy_to_host(plan, arena.data());
  CHECK(buf.used_pages() == 3);
  CHECK(buf.pages_of(7) == 3);
  CHECK_FALSE(buf.offload(8, std::vector<PageId>{0, 2}, page, plan));  // 1 page left
  CHECK(plan.size() == 3);
  std::memset(arena.data(), 0, arena.bytes());  // the device pages are reused meanwhile
  plan.clear();
  const std::vector<PageId> back = {0, 2, 3};  // fetched into newly allocated pages
  CHECK_THROWS_WITH(buf.fetch(7, std::vector<PageId>{0}, page, plan), Catch::Contains("device_pages.size() = 1"));
  buf.fetch(7, back, page, plan);
  buf.copy_to_device(plan, arena.data());
  CHECK(arena.data()[0 * page + 5] == std::byte{0x14});
  CHECK(arena.data()[2 * page + 5] == std::byte{0x11});
  CHECK(arena.data()[3 * page + page - 1] == std::byte{0x15});
  CHECK(buf.used_pages() == 0);
  CHECK_THROWS_WITH(buf.offload(1, std::vector<PageId>{kNullPage}, page, plan), Catch::Contains("device_pages[0]"));
  CHECK_THROWS_WITH(buf.offload(1, mine, page + 1, plan), Catch::Contains("device_page_bytes"));
}

TEST_CASE("HostOffloadBuffer: the logical buffer scales as eLLM Algorithm 2") {
  HostOffloadBuffer buf(4096, 20);  // B_max = 20, B_logic starts at 1
  CHECK(buf.logical_pages() == 1);
  buf.on_slo_events(true, false);  // TTFT violation: x alpha
  CHECK(buf.logical_pages() == 2);
  buf.on_slo_events(true, false);
  buf.on_slo_events(true, false);
  buf.on_slo_events(true, false);
  CHECK(buf.logical_pages() == 16);
  buf.on_slo_events(true, false);
  CHECK(buf.logical_pages() == 20);  // bounded by the physical buffer
  buf.on_slo_events(true, true);     // TPOT wins: / alpha
  CHECK(buf.logical_pages() == 10);
  buf.on_slo_events(false, false);
  CHECK(buf.logical_pages() == 10);
  for (int i = 0; i < 6; ++i) buf.on_slo_events(false, true);
  CHECK(buf.logical_pages() == 1);  // never below 1
  std::vector<OffloadCopy> plan;
  CHECK_FALSE(buf.offload(0, std::vector<PageId>{1, 2}, 4096, plan));  // only 1 logical page
  CHECK(buf.offload(0, std::vector<PageId>{1}, 4096, plan));
  CHECK(buf.free_logical_pages() == 0);
  CHECK_THROWS_WITH(buf.on_slo_events(true, false, 1.0), Catch::Contains("alpha = 1"));
}

TEST_CASE("ElasticMemory: seeded random inflate/deflate beside KV and activation traffic keeps every invariant") {
  HostMemory host({.chunk_bytes = kChunk});
  FaultyMemory faulty(host);
  ChunkPool pool(faulty, {.max_chunks = 40});
  pool.set_quota(ChunkOwner::kKVArena, 20);
  pool.set_quota(ChunkOwner::kActivation, 20);
  ActivationAllocator act(pool, 40 * kChunk);
  const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 64, 2, 16)});  // 4 KiB pages
  REQUIRE(layout.large_page_bytes() == kChunk);
  KVArena arena(pool, layout, {.num_large_pages = 40, .backing = ArenaBacking::kElastic});
  ArenaPagePool pages(arena);
  ElasticMemory elastic(pool, act, ChunkOwner::kKVArena);
  std::mt19937 rng(4242);
  std::vector<std::pair<LargePageId, std::uint8_t>> kv;
  std::vector<std::pair<std::uint64_t, std::uint8_t>> acts;
  int inflated = 0, deflated = 0, refused = 0;
  for (int op = 0; op < 6000; ++op) {
    const int kind = int(rng() % 12);
    if (rng() % 20 == 0) faulty.fail_at(1 + rng() % 3);
    if (kind < 3) {
      if (auto p = pages.allocate(0)) {
        const std::uint8_t t = std::uint8_t(rng());
        std::memset(ptr(arena.large_page_address(*p)), t, kChunk);
        kv.push_back({*p, t});
      }
    } else if (kind < 5 && !kv.empty()) {
      const std::size_t k = rng() % kv.size();
      REQUIRE(ptr(arena.large_page_address(kv[k].first))[kChunk - 1] == std::byte{kv[k].second});
      pages.free(kv[k].first);
      kv[k] = kv.back();
      kv.pop_back();
    } else if (kind < 7) {
      const std::uint64_t bytes = (1 + rng() % 3) * kChunk;
      if (auto a = act.allocate(bytes)) {
        const std::uint8_t t = std::uint8_t(rng());
        std::memset(ptr(*a), t, bytes);
        acts.push_back({*a, t});
      }
    } else if (kind < 9 && !acts.empty()) {
      const std::size_t k = rng() % acts.size();
      REQUIRE(ptr(acts[k].first)[0] == std::byte{acts[k].second});
      act.free(acts[k].first);
      acts[k] = acts.back();
      acts.pop_back();
    } else {
      const std::uint32_t n = 1 + rng() % 6;
      const std::uint32_t kq = elastic.kv_quota(), aq = elastic.activation_quota();
      const std::uint32_t kv_owned = pool.owned(ChunkOwner::kKVArena), act_live = act.live_chunks();
      const bool up = kind < 11;
      const bool ok = up ? elastic.inflate(n) : elastic.deflate(n);
      (ok ? (up ? inflated : deflated) : refused) += 1;
      CHECK(elastic.kv_quota() == (ok ? (up ? kq + n : kq - n) : kq));
      CHECK(elastic.activation_quota() == (ok ? (up ? aq - n : aq + n) : aq));
      CHECK(pool.owned(ChunkOwner::kKVArena) == kv_owned);  // KV memory never taken away
      CHECK(act.live_chunks() == act_live);                 // live activations never unmapped
    }
    faulty.fail_at(0);
    REQUIRE(elastic.kv_quota() + elastic.activation_quota() == 40);
    pool.check_invariants();
    pages.check_invariants();
    act.check_invariants();
    REQUIRE(host.live_chunks() == pool.stats().created);
  }
  CHECK(inflated > 50);
  CHECK(deflated > 20);
  CHECK(refused > 20);
  for (auto [p, t] : kv) pages.free(p);
  for (auto [a, t] : acts) act.free(a);
}

TEST_CASE("HostOffloadBuffer: seeded random offload/fetch/drop/scaling keeps every page accounted for") {
  HostOffloadBuffer buf(64, 32, 8);
  std::mt19937 rng(77);
  // Device pages of one plan are distinct (the same page twice is refused).
  auto distinct = [&](std::vector<PageId>& pages) {
    for (std::size_t i = 0; i < pages.size(); ++i) do
        pages[i] = rng() % 1000;
      while (std::find(pages.begin(), pages.begin() + std::ptrdiff_t(i), pages[i]) !=
             pages.begin() + std::ptrdiff_t(i));
  };
  std::vector<std::vector<PageId>> held(10);
  std::vector<OffloadCopy> plan;
  int offloads = 0, refused = 0;
  for (int op = 0; op < 5000; ++op) {
    const RequestId r = rng() % 10;
    const int kind = int(rng() % 8);
    if (kind < 3 && held[r].empty()) {
      std::vector<PageId> pages(1 + rng() % 6);
      distinct(pages);
      plan.clear();
      const std::uint32_t before = buf.used_pages();
      if (buf.offload(r, pages, 64, plan)) {
        ++offloads;
        REQUIRE(plan.size() == pages.size());
        held[r] = pages;
      } else {
        ++refused;
        REQUIRE(buf.used_pages() == before);
        REQUIRE(pages.size() > buf.free_logical_pages());
      }
    } else if (kind < 5 && !held[r].empty()) {
      plan.clear();
      std::vector<PageId> dst(held[r].size());
      distinct(dst);
      buf.fetch(r, dst, 64, plan);
      REQUIRE(plan.size() == dst.size());
      for (std::size_t i = 0; i < dst.size(); ++i) REQUIRE(plan[i].device_offset == dst[i] * 64u);
      held[r].clear();
    } else if (kind == 5) {
      buf.drop(r);
      held[r].clear();
    } else {
      buf.on_slo_events(rng() % 2 == 0, rng() % 3 == 0);
    }
    buf.check_invariants();
    std::uint32_t used = 0;
    for (auto& h : held) used += std::uint32_t(h.size());
    REQUIRE(buf.used_pages() == used);
    for (RequestId q = 0; q < 10; ++q) REQUIRE(buf.pages_of(q) == held[q].size());
  }
  CHECK(offloads > 300);
  CHECK(refused > 30);
}
