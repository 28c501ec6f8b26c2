// Regression tests for memory-layer defects found by an adversarial run (issue 14, items 1, 2, 9-13, 16-18):
// each case is the reproduction and failed (crash, leak, wrong result or a
// message naming the wrong field) before its fix.
#include "kvmm/error.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"  // item 1: both copy types in one translation unit
#include "kvmm/memory/activation_allocator.hpp"
#include "kvmm/memory/arena_page_pool.hpp"
#include "kvmm/memory/chunk_pool.hpp"
#include "kvmm/memory/elastic_memory.hpp"
#include "kvmm/memory/host_memory.hpp"
#include "kvmm/memory/host_offload.hpp"
#include "kvmm/memory/kv_arena.hpp"
#include "kvmm/memory/virtual_kv_cache.hpp"
#include "kvmm/testing/faulty_memory.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <limits>
#include <vector>

using namespace kvmm;

namespace {
constexpr std::uint64_t kChunk = 4096;
constexpr std::uint64_t kMax64 = std::numeric_limits<std::uint64_t>::max();
std::byte* ptr(std::uint64_t a) { return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(a)); }

VirtualKVCacheOptions cache_options(std::uint32_t batch, bool mapper) {
  VirtualKVCacheOptions o;
  o.num_layers = 2;
  o.max_batch = batch;
  o.max_context = 128;
  o.kv_heads = 2;
  o.head_dim = 64;
  o.dtype_bytes = 2;  // 256 bytes per token per tensor: 16 tokens per 4 KiB group
  o.page_group_bytes = kChunk;
  o.background_mapper = mapper;
  return o;
}
}  // namespace

TEST_CASE("the offload buffer's copy type and the manager's PageCopy are distinct types") {
  static_assert(!std::is_same_v<OffloadCopy, PageCopy>);
  const PageCopy manager_copy{.group = 1, .src = 2, .dst = 3};
  const OffloadCopy offload_copy{.device_offset = 4096, .host_offset = 0, .bytes = 64};
  CHECK(manager_copy.dst == 3);
  CHECK(offload_copy.bytes == 64);
  HostOffloadBuffer buf(64, 4, 4);
  std::vector<OffloadCopy> plan;
  REQUIRE(buf.offload(0, std::vector<PageId>{5}, 64, plan));
  CHECK(plan.at(0).device_offset == 5 * 64);
}

TEST_CASE("a backend that raises inside map_batch (same address twice, already mapped) is rolled back") {
  HostMemory host({.chunk_bytes = kChunk});
  VirtualRange r;
  {
    ChunkPool pool(host, {.max_chunks = 16, .precreate_chunks = 1});
    REQUIRE(pool.reserve(8 * kChunk, &r));
    std::vector<std::uint64_t> pre = {r.base + 5 * kChunk};
    std::vector<ChunkId> pre_id(1);
    REQUIRE(pool.map_batch(ChunkOwner::kKVArena, pre, pre_id));
    const auto before = pool.stats();
    std::vector<std::uint64_t> twice = {r.base, r.base + kChunk, r.base};
    std::vector<ChunkId> ids(3, kNoChunk);
    CHECK_THROWS_WITH(pool.map_batch(ChunkOwner::kVirtualTensor, twice, ids), Catch::Contains("addrs[2]"));
    std::vector<std::uint64_t> over = {r.base + 4 * kChunk, r.base + 5 * kChunk};
    CHECK_THROWS_AS(pool.map_batch(ChunkOwner::kVirtualTensor, over, std::span(ids).first(2)), Error);
    pool.check_invariants();
    CHECK(pool.stats().created == before.created);
    CHECK(pool.stats().mapped == before.mapped);
    CHECK(pool.stats().idle == before.idle);
    CHECK(host.live_chunks() == before.created);
    CHECK(host.live_mappings() == 1);
    // Still serves: the same addresses, once each, map fine.
    REQUIRE(pool.map_batch(ChunkOwner::kVirtualTensor, std::span(twice).first(2), std::span(ids).first(2)));
    std::memset(ptr(r.base), 1, 2 * kChunk);
    pool.unmap_batch(std::span(ids).first(2));
    pool.unmap_batch(pre_id);
    pool.free_range(r);
  }  // destruction no longer ends in std::terminate
  CHECK(host.live_chunks() == 0);
  CHECK(host.live_mappings() == 0);
}

TEST_CASE("a backend raising at every acquiring call of map_batch leaves nothing behind") {
  HostMemory host({.chunk_bytes = kChunk});
  FaultyMemory faulty(host);
  ChunkPool pool(faulty, {.max_chunks = 16, .precreate_chunks = 1});
  VirtualRange r;
  REQUIRE(pool.reserve(8 * kChunk, &r));
  std::vector<std::uint64_t> addrs = {r.base, r.base + kChunk, r.base + 3 * kChunk};
  std::vector<ChunkId> ids(3);
  std::uint64_t n = 1;
  for (;; ++n) {
    faulty.fail_at(n, FaultMode::kThrow);
    bool ok = false;
    try {
      ok = pool.map_batch(ChunkOwner::kActivation, addrs, ids);
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("injected failure"));
    }
    if (ok) break;
    REQUIRE(faulty.fired());
    pool.check_invariants();
    CHECK(pool.stats().mapped == 0);
    CHECK(pool.stats().created == 1);
    CHECK(host.live_chunks() == 1);
    CHECK(host.live_mappings() == 0);
  }
  CHECK(n - 1 == 2 + 3 + 2);  // creates + maps + runs
  pool.unmap_batch(ids);
  pool.free_range(r);
}

TEST_CASE(
    "HostMemory rejects a wrapping chunk size, an unrepresentable reserve, a double free_range, maps "
    "outside a range") {
  CHECK_THROWS_WITH(HostMemory({.chunk_bytes = kMax64}), Catch::Contains("chunk_bytes = 18446744073709551615"));
  HostMemory mem({.chunk_bytes = kChunk});
  VirtualRange r;
  CHECK_THROWS_WITH(mem.reserve(kMax64, &r), Catch::Contains("bytes = 18446744073709551615"));
  CHECK(mem.live_ranges() == 0);
  REQUIRE(mem.reserve(2 * kChunk, &r));
  ChunkHandle c;
  REQUIRE(mem.create_chunk(&c));
  // Outside any reserved range (just past the end; and an address never reserved).
  CHECK_THROWS_WITH(mem.map(c, r.base + 2 * kChunk), Catch::Contains("addr = "));
  CHECK_THROWS_WITH(mem.map(c, kChunk * 16), Catch::Contains("not inside a reserved range"));
  CHECK_THROWS_WITH(mem.set_access(r.base, kChunk), Catch::Contains("no chunk is mapped"));
  CHECK(mem.live_mappings() == 0);
  mem.free_range(r);
  CHECK_THROWS_WITH(mem.free_range(r), Catch::Contains("not a reserved range"));
  CHECK(mem.live_ranges() == 0);
  mem.release_chunk(c);
  mem.check_invariants();
}

TEST_CASE("ChunkPool maps only inside ranges reserved through it") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 8});
  VirtualRange mine, foreign;
  REQUIRE(pool.reserve(2 * kChunk, &mine));
  REQUIRE(host.reserve(2 * kChunk, &foreign));
  std::vector<ChunkId> ids(1);
  const std::vector<std::uint64_t> outside = {foreign.base};
  CHECK_THROWS_WITH(pool.map_batch(ChunkOwner::kActivation, outside, ids), Catch::Contains("addrs[0]"));
  const std::vector<std::uint64_t> past = {mine.base + 2 * kChunk};
  CHECK_THROWS_WITH(pool.map_batch(ChunkOwner::kActivation, past, ids), Catch::Contains("outside every range"));
  CHECK_THROWS_WITH(pool.free_range(foreign), Catch::Contains("not reserved through this pool"));
  CHECK(pool.stats().created == 0);
  pool.check_invariants();
  host.free_range(foreign);
  pool.free_range(mine);
}

TEST_CASE("ActivationAllocator::allocate(2^64-1) fails instead of handing out a used address") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 8});
  ActivationAllocator act(pool, 8 * kChunk);
  CHECK_FALSE(act.allocate(kMax64));
  CHECK_FALSE(act.allocate(kMax64 - kChunk + 2));
  const auto a = act.allocate(kChunk);
  const auto b = act.allocate(kChunk);
  REQUIRE((a && b));
  CHECK(*a != *b);
  CHECK_THROWS_WITH(ActivationAllocator(pool, kMax64), Catch::Contains("max_bytes = 18446744073709551615"));
  act.check_invariants();
}

TEST_CASE("ElasticMemory::balloon refuses amounts beyond 32 bits instead of truncating them") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 8});
  pool.set_quota(ChunkOwner::kKVArena, 4);
  pool.set_quota(ChunkOwner::kActivation, 4);
  ActivationAllocator act(pool, 8 * kChunk);
  ElasticMemory elastic(pool, act, ChunkOwner::kKVArena);
  const std::int64_t big = (std::int64_t{1} << 32) + 1;  // truncated, it would read 1
  CHECK_THROWS_WITH(elastic.balloon(big), Catch::Contains("amount = 4294967297"));
  CHECK_THROWS_WITH(elastic.balloon(-big), Catch::Contains("amount = -4294967297"));
  CHECK_THROWS_WITH(elastic.balloon(std::numeric_limits<std::int64_t>::min()),
                    Catch::Contains("amount = -9223372036854775808"));
  CHECK(elastic.kv_quota() == 4);
  CHECK(elastic.activation_quota() == 4);
  CHECK(elastic.balloon(1));
  CHECK(elastic.kv_quota() == 5);
}

TEST_CASE("HostOffloadBuffer checks its size product and serves any request id without a table of them") {
  CHECK_THROWS_WITH(HostOffloadBuffer(std::uint64_t{1} << 40, 1u << 30, 1),
                    Catch::Contains("page_bytes * capacity_pages"));
  HostOffloadBuffer buf(64, 4, 4);
  std::vector<OffloadCopy> plan;
  const RequestId big = RequestId{1} << 31;
  REQUIRE(buf.offload(big, std::vector<PageId>{7, 9}, 64, plan));
  CHECK(buf.pages_of(big) == 2);
  buf.check_invariants();
  plan.clear();
  buf.fetch(big, std::vector<PageId>{1, 2}, 64, plan);
  CHECK(plan.size() == 2);
  CHECK(buf.used_pages() == 0);
}

TEST_CASE("a step that fails after reclaiming keeps the inactive slot's cached chunks") {
  HostMemory host({.chunk_bytes = kChunk});
  FaultyMemory faulty(host);
  ChunkPool pool(faulty, {.max_chunks = 16});  // 4 groups x 4 tensors
  VirtualKVCache c(pool, cache_options(2, false));
  std::vector<std::uint32_t> lens(2, 0);
  const auto a = *c.alloc_reqid(), b = *c.alloc_reqid();
  lens[a] = 16;
  lens[b] = 48;  // 1 + 3 groups: the pool is full
  REQUIRE(c.step(lens));
  c.free_reqid(b);
  lens[b] = 0;
  lens[a] = 32;  // one more group: only b's cached chunks can give it
  for (const FaultMode mode : {FaultMode::kReturnFalse, FaultMode::kThrow}) {
    faulty.fail_at(1, mode);
    bool ok = true;
    try {
      ok = c.step(lens);
    } catch (const Error&) {
      ok = false;
    }
    CHECK_FALSE(ok);
    CHECK(faulty.fired());
    CHECK(c.backed_groups(a) == 1);
    CHECK(c.backed_groups(b) == 3);  // was 0: reclaim ran before the failing grow
    CHECK(pool.stats().mapped == 16);
    CHECK(host.live_mappings() == 16);
    c.check_invariants();
  }
  faulty.fail_at(0);
  REQUIRE(c.step(lens));
  CHECK(c.backed_groups(a) == 2);
  c.check_invariants();
}

TEST_CASE("KVArena refuses to release a chunk under a live large page") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 16});
  const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 64, 2, 16)});  // 4 KiB pages
  KVArena arena(pool, layout, {.num_large_pages = 4, .backing = ArenaBacking::kElastic});
  ArenaPagePool pages(arena);
  const auto p = pages.allocate(0);
  REQUIRE(p);
  std::memset(ptr(arena.large_page_address(*p)), 0x5E, kChunk);
  CHECK_THROWS_WITH(arena.release_chunk(arena.first_chunk(*p)), Catch::Contains("live large page"));
  CHECK(arena.chunk_backed(arena.first_chunk(*p)));
  CHECK(ptr(arena.large_page_address(*p))[100] == std::byte{0x5E});
  pages.check_invariants();
  pages.free(*p);
}

TEST_CASE("ChunkPool quotas cannot pass the capacity or wrap, and owners outside the enum are refused") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 8});
  CHECK_THROWS_WITH(pool.set_quota(ChunkOwner::kKVArena, ~std::uint32_t{0}), Catch::Contains("quota = 4294967295"));
  CHECK(pool.quota(ChunkOwner::kKVArena) == 8);
  pool.set_quota(ChunkOwner::kActivation, 2);
  REQUIRE(pool.move_quota(ChunkOwner::kActivation, ChunkOwner::kKVArena, 2));
  CHECK(pool.quota(ChunkOwner::kKVArena) == 10);  // above the capacity only by moved quota, never wrapped
  CHECK(pool.quota(ChunkOwner::kActivation) == 0);
  const auto bogus = static_cast<ChunkOwner>(9);
  CHECK_THROWS_WITH(pool.quota(bogus), Catch::Contains("owner = 9"));
  CHECK_THROWS_WITH(pool.owned(bogus), Catch::Contains("owner = 9"));
  CHECK_THROWS_WITH(pool.available(bogus), Catch::Contains("owner = 9"));
  CHECK_THROWS_WITH(pool.set_quota(bogus, 1), Catch::Contains("owner = 9"));
  CHECK_THROWS_WITH(pool.move_quota(bogus, ChunkOwner::kKVArena, 1), Catch::Contains("from = 9"));
  VirtualRange r;
  REQUIRE(pool.reserve(kChunk, &r));
  std::vector<std::uint64_t> a = {r.base};
  std::vector<ChunkId> ids(1);
  CHECK_THROWS_WITH(pool.map_batch(bogus, a, ids), Catch::Contains("owner = 9"));
  pool.check_invariants();
  pool.free_range(r);
}

TEST_CASE("VirtualKVCache overflow messages name the field and its value") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 8});
  auto o = cache_options(2, false);
  o.kv_heads = 1u << 31;
  o.head_dim = 1u << 31;
  o.dtype_bytes = 8;
  CHECK_THROWS_WITH(VirtualKVCache(pool, o), Catch::Contains("kv_heads * head_dim * dtype_bytes"));
  o = cache_options(2, false);
  o.num_layers = 1u << 31;
  o.kv_heads = 1u << 20;
  o.head_dim = 1u << 20;
  o.layout = TensorLayout::kSliced;
  CHECK_THROWS_WITH(VirtualKVCache(pool, o), Catch::Contains("num_layers"));
  o = cache_options(2, false);
  o.max_context = ~std::uint32_t{0};
  o.kv_heads = 1u << 16;
  o.head_dim = 1u << 12;
  o.max_batch = 1u << 30;
  try {
    VirtualKVCache c(pool, o);
    FAIL("accepted a virtual size past 64 bits");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("max_batch") || Catch::Contains("max_context"));
    CHECK_THAT(msg, !Catch::Contains("bytes = 0"));
  }
  CHECK(host.live_ranges() == 0);
}

TEST_CASE("the same device page twice in one offload or fetch is refused") {
  HostOffloadBuffer buf(64, 8, 8);
  std::vector<OffloadCopy> plan;
  CHECK_THROWS_WITH(buf.offload(3, std::vector<PageId>{4, 7, 4}, 64, plan), Catch::Contains("device_pages[2] = 4"));
  CHECK(plan.empty());
  CHECK(buf.used_pages() == 0);
  REQUIRE(buf.offload(3, std::vector<PageId>{4, 7}, 64, plan));
  plan.clear();
  CHECK_THROWS_WITH(buf.fetch(3, std::vector<PageId>{1, 1}, 64, plan), Catch::Contains("device_pages[1] = 1"));
  CHECK(buf.pages_of(3) == 2);
  buf.check_invariants();
}

TEST_CASE("a backend raising inside the background mapper does not end the program") {
  HostMemory host({.chunk_bytes = kChunk});
  FaultyMemory faulty(host);
  ChunkPool pool(faulty, {.max_chunks = 64});
  auto o = cache_options(2, true);
  o.prefetch_tokens = 32;
  VirtualKVCache c(pool, o);
  std::vector<std::uint32_t> lens(2, 0);
  const auto a = *c.alloc_reqid();
  c.wait_idle();
  lens[a] = 1;
  // The step maps group 0 itself (4 creates, 4 maps, 4 runs), then queues the prefetch:
  // the mapper's first call raises.
  faulty.fail_at(13, FaultMode::kThrow);
  REQUIRE(c.step(lens));
  c.wait_idle();
  CHECK(faulty.fired());
  c.check_invariants();
  lens[a] = 40;  // step maps what the mapper could not
  REQUIRE(c.step(lens));
  CHECK(c.backed_groups(a) >= 3);
  c.wait_idle();
  c.check_invariants();
}

namespace {
// A backend that reports a chunk size of 0 (a broken wrapper): nothing else is reached.
struct ZeroChunkBackend final : MemoryBackend {
  const char* name() const override { return "zero"; }
  std::uint64_t granularity() const override { return 0; }
  std::uint64_t chunk_bytes() const override { return 0; }
  bool reserve(std::uint64_t, VirtualRange*) override { return false; }
  void free_range(const VirtualRange&) override {}
  bool create_chunk(ChunkHandle*) override { return false; }
  void release_chunk(ChunkHandle) override {}
  bool map(ChunkHandle, std::uint64_t) override { return false; }
  bool set_access(std::uint64_t, std::uint64_t) override { return false; }
  void unmap(std::uint64_t, std::uint64_t) override {}
};
}  // namespace

TEST_CASE("ChunkPool refuses a backend whose chunk size is 0 (every address check divides by it)") {
  ZeroChunkBackend zero;
  CHECK_THROWS_WITH(ChunkPool(zero, {.max_chunks = 4}), Catch::Contains("chunk_bytes() = 0"));
}
