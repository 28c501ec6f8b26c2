#include "kvmm/memory/chunk_pool.hpp"
#include "kvmm/error.hpp"
#include "kvmm/memory/host_memory.hpp"
#include "kvmm/testing/faulty_memory.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

using namespace kvmm;

namespace {
constexpr std::uint64_t kChunk = 4096;
std::byte* ptr(std::uint64_t a) { return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(a)); }

// Counts backend calls by kind, to prove set_access runs once per contiguous run.
class CountingMemory final : public MemoryBackend {
 public:
  explicit CountingMemory(MemoryBackend& inner) : inner_(inner) {}
  const char* name() const override { return "counting"; }
  std::uint64_t granularity() const override { return inner_.granularity(); }
  std::uint64_t chunk_bytes() const override { return inner_.chunk_bytes(); }
  bool reserve(std::uint64_t b, VirtualRange* o) override { return inner_.reserve(b, o); }
  void free_range(const VirtualRange& r) override { inner_.free_range(r); }
  bool create_chunk(ChunkHandle* o) override {
    ++creates;
    return inner_.create_chunk(o);
  }
  void release_chunk(ChunkHandle c) override {
    ++releases;
    inner_.release_chunk(c);
  }
  bool map(ChunkHandle c, std::uint64_t a) override {
    ++maps;
    return inner_.map(c, a);
  }
  bool set_access(std::uint64_t a, std::uint64_t b) override {
    ++accesses;
    return inner_.set_access(a, b);
  }
  void unmap(std::uint64_t a, std::uint64_t b) override {
    ++unmaps;
    inner_.unmap(a, b);
  }
  int creates = 0, releases = 0, maps = 0, accesses = 0, unmaps = 0;

 private:
  MemoryBackend& inner_;
};
}  // namespace

TEST_CASE("ChunkPool: batch maps set access once per contiguous run and reuse idle handles") {
  HostMemory host({.chunk_bytes = kChunk});
  CountingMemory mem(host);
  ChunkPool pool(mem, {.max_chunks = 16, .precreate_chunks = 2});
  CHECK(mem.creates == 2);  // created ahead of need
  VirtualRange r;
  REQUIRE(pool.reserve(16 * kChunk, &r));
  // Two runs: chunks 0..2 and 5..6.
  std::vector<std::uint64_t> addrs = {r.base, r.base + kChunk, r.base + 2 * kChunk, r.base + 5 * kChunk,
                                      r.base + 6 * kChunk};
  std::vector<ChunkId> ids(addrs.size());
  REQUIRE(pool.map_batch(ChunkOwner::kVirtualTensor, addrs, ids));
  CHECK(mem.creates == 5);  // 2 idle reused + 3 new
  CHECK(mem.maps == 5);
  CHECK(mem.accesses == 2);  // one per run
  pool.check_invariants();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    CHECK(pool.owner(ids[i]) == ChunkOwner::kVirtualTensor);
    CHECK(pool.address(ids[i]) == addrs[i]);
    std::memset(ptr(addrs[i]), int(i + 1), kChunk);  // writable
  }
  auto s = pool.stats();
  CHECK(s.created == 5);
  CHECK(s.mapped == 5);
  CHECK(s.idle == 0);
  CHECK(s.owned[std::size_t(ChunkOwner::kVirtualTensor)] == 5);
  CHECK(host.live_mappings() == 5);

  pool.unmap_batch(ids);
  CHECK(mem.unmaps == 2);  // one per run
  CHECK(host.live_mappings() == 0);
  CHECK(pool.stats().idle == 5);
  CHECK(pool.stats().created == 5);
  // Mapping again reuses the idle handles: no create call.
  REQUIRE(pool.map_batch(ChunkOwner::kActivation, std::span(addrs).first(3), std::span(ids).first(3)));
  CHECK(mem.creates == 5);
  pool.check_invariants();
  pool.unmap_batch(std::span(ids).first(3));
  pool.trim(1);
  CHECK(mem.releases == 4);
  CHECK(host.live_chunks() == 1);
  pool.check_invariants();
  pool.free_range(r);
}

TEST_CASE("ChunkPool: quotas bound each owner and move_quota is all or nothing") {
  HostMemory host({.chunk_bytes = kChunk});
  ChunkPool pool(host, {.max_chunks = 8});
  pool.set_quota(ChunkOwner::kKVArena, 3);
  pool.set_quota(ChunkOwner::kActivation, 5);
  VirtualRange r;
  REQUIRE(pool.reserve(8 * kChunk, &r));
  std::vector<std::uint64_t> a = {r.base, r.base + kChunk, r.base + 2 * kChunk, r.base + 3 * kChunk};
  std::vector<ChunkId> ids(4);
  CHECK_FALSE(pool.map_batch(ChunkOwner::kKVArena, a, ids));  // 4 > quota 3
  CHECK(pool.stats().created == 0);
  REQUIRE(pool.map_batch(ChunkOwner::kKVArena, std::span(a).first(3), std::span(ids).first(3)));
  CHECK(pool.available(ChunkOwner::kKVArena) == 0);
  CHECK_FALSE(pool.move_quota(ChunkOwner::kKVArena, ChunkOwner::kActivation, 1));  // all 3 in use
  CHECK(pool.quota(ChunkOwner::kKVArena) == 3);
  REQUIRE(pool.move_quota(ChunkOwner::kActivation, ChunkOwner::kKVArena, 1));
  CHECK(pool.quota(ChunkOwner::kKVArena) == 4);
  CHECK(pool.quota(ChunkOwner::kActivation) == 4);
  REQUIRE(pool.map_batch(ChunkOwner::kKVArena, std::span(a).subspan(3, 1), std::span(ids).subspan(3, 1)));
  CHECK_THROWS_WITH(pool.set_quota(ChunkOwner::kKVArena, 2), Catch::Contains("quota = 2"));
  CHECK(pool.quota(ChunkOwner::kKVArena) == 4);
  CHECK_THROWS_WITH(pool.move_quota(ChunkOwner::kFree, ChunkOwner::kKVArena, 1), Catch::Contains("from = free"));
  CHECK_THROWS_WITH(pool.map_batch(ChunkOwner::kActivation, std::span(a).first(1), std::span(ids).first(2)),
                    Catch::Contains("ids_out.size() = 2"));
  CHECK_THROWS_WITH(pool.unmap_batch(std::vector<ChunkId>{ids[0], ids[0]}), Catch::Contains("listed twice"));
  CHECK(pool.stats().mapped == 4);
  CHECK_THROWS_WITH(ChunkPool(host, {.max_chunks = 0}), Catch::Contains("max_chunks = 0"));
  pool.check_invariants();
  pool.unmap_batch(ids);
  pool.free_range(r);
}

TEST_CASE("ChunkPool: a failure at every backend call position rolls the batch back completely") {
  HostMemory host({.chunk_bytes = kChunk});
  FaultyMemory faulty(host);
  ChunkPool pool(faulty, {.max_chunks = 32, .precreate_chunks = 3});
  VirtualRange r;
  REQUIRE(pool.reserve(32 * kChunk, &r));
  // Existing state: 2 chunks mapped, 1 idle.
  std::vector<std::uint64_t> pre = {r.base + 20 * kChunk, r.base + 21 * kChunk};
  std::vector<ChunkId> pre_ids(2);
  REQUIRE(pool.map_batch(ChunkOwner::kKVArena, pre, pre_ids));
  std::memset(ptr(pre[0]), 0x3C, kChunk);
  // The batch: 6 chunks in 3 runs, needs 1 idle + 5 created.
  std::vector<std::uint64_t> addrs = {
      r.base, r.base + kChunk, r.base + 4 * kChunk, r.base + 5 * kChunk, r.base + 6 * kChunk, r.base + 10 * kChunk};
  std::vector<ChunkId> ids(addrs.size(), kNoChunk);
  const auto before = pool.stats();
  std::uint64_t positions = 0;
  for (std::uint64_t n = 1;; ++n) {
    faulty.fail_at(n);
    const bool ok = pool.map_batch(ChunkOwner::kVirtualTensor, addrs, ids);
    pool.check_invariants();
    if (ok) {
      CHECK_FALSE(faulty.fired());
      positions = n - 1;
      break;
    }
    REQUIRE(faulty.fired());
    const auto s = pool.stats();
    CHECK(s.created == before.created);
    CHECK(s.idle == before.idle);
    CHECK(s.mapped == before.mapped);
    CHECK(host.live_chunks() == before.created);  // nothing leaked
    CHECK(host.live_mappings() == 2);
    CHECK(ptr(pre[0])[7] == std::byte{0x3C});
  }
  CHECK(positions == 5 + 6 + 3);  // creates + maps + set_access runs
  CHECK(host.live_mappings() == 8);
  pool.unmap_batch(ids);
  pool.unmap_batch(pre_ids);
  pool.free_range(r);
}

TEST_CASE("ChunkPool: seeded random map/unmap/trim/quota sequence keeps every invariant") {
  HostMemory host({.chunk_bytes = kChunk, .max_chunks = 40});
  FaultyMemory faulty(host);
  ChunkPool pool(faulty, {.max_chunks = 48});  // more than the backend can give
  VirtualRange r;
  REQUIRE(pool.reserve(64 * kChunk, &r));
  std::mt19937 rng(12345);
  std::vector<ChunkId> at(64, kNoChunk);  // model: which chunk is mapped at each slot
  std::vector<std::uint8_t> tag(64, 0);
  std::vector<std::uint64_t> addrs;
  std::vector<ChunkId> ids;
  const ChunkOwner owners[] = {ChunkOwner::kKVArena, ChunkOwner::kVirtualTensor, ChunkOwner::kActivation};
  int maps_ok = 0, maps_failed = 0;
  for (int op = 0; op < 6000; ++op) {
    const int kind = int(rng() % 10);
    if (kind < 5) {
      // Map a random run of currently unmapped slots.
      const std::uint32_t start = rng() % 64, len = 1 + rng() % 6;
      addrs.clear();
      for (std::uint32_t s = start; s < std::min<std::uint32_t>(64, start + len); ++s)
        if (at[s] == kNoChunk) addrs.push_back(r.base + s * kChunk);
      ids.assign(addrs.size(), kNoChunk);
      const auto owner = owners[rng() % 3];
      if (rng() % 8 == 0) faulty.fail_at(1 + rng() % 8);
      const auto before = pool.stats();
      if (pool.map_batch(owner, addrs, ids)) {
        ++maps_ok;
        for (std::size_t k = 0; k < ids.size(); ++k) {
          const std::uint32_t s = std::uint32_t((addrs[k] - r.base) / kChunk);
          at[s] = ids[k];
          tag[s] = std::uint8_t(rng());
          std::memset(ptr(addrs[k]), tag[s], 64);
        }
      } else {
        ++maps_failed;
        const auto after = pool.stats();
        REQUIRE(after.created == before.created);
        REQUIRE(after.mapped == before.mapped);
      }
      faulty.fail_at(0);
    } else if (kind < 8) {
      ids.clear();
      const std::uint32_t start = rng() % 64, len = 1 + rng() % 8;
      for (std::uint32_t s = start; s < std::min<std::uint32_t>(64, start + len); ++s)
        if (at[s] != kNoChunk) {
          REQUIRE(ptr(r.base + s * kChunk)[13] == std::byte{tag[s]});
          ids.push_back(at[s]);
          at[s] = kNoChunk;
        }
      pool.unmap_batch(ids);
    } else if (kind == 8) {
      pool.trim(rng() % 6);
    } else {
      const auto from = owners[rng() % 3], to = owners[rng() % 3];
      if (from != to) {
        const std::uint32_t n = rng() % 5, qf = pool.quota(from), qt = pool.quota(to);
        const bool ok = pool.move_quota(from, to, n);
        CHECK(pool.quota(from) == (ok ? qf - n : qf));
        CHECK(pool.quota(to) == (ok ? qt + n : qt));
      }
    }
    pool.check_invariants();
    const auto s = pool.stats();
    REQUIRE(host.live_chunks() == s.created);
    REQUIRE(host.live_mappings() == s.mapped);
    for (std::uint32_t k = 0; k < 64; ++k)
      if (at[k] != kNoChunk) REQUIRE(pool.address(at[k]) == r.base + k * kChunk);
  }
  CHECK(maps_ok > 500);
  CHECK(maps_failed > 50);
  for (std::uint32_t k = 0; k < 64; ++k)
    if (at[k] != kNoChunk) pool.unmap_batch(std::span<const ChunkId>(&at[k], 1));
  pool.free_range(r);
}
