// Fault injection at every backend call position of ChunkPool and KVArena (with its
// ArenaPagePool), by false, by exception, and on releasing calls (fault_injection.hpp):
// after each, every chunk and mapping is accounted for, the invariants hold, the object
// is unchanged (acquiring failures) or degraded as its header documents (releasing
// failures), and it still serves.
#include "fault_injection.hpp"

#include "kvmm/memory/arena_page_pool.hpp"
#include "kvmm/memory/kv_arena.hpp"

#include <array>
#include <cstring>
#include <memory>
#include <vector>

using namespace kvmm;
using namespace kvmm::test;

namespace {
constexpr std::uint64_t kChunk = 4096;
std::byte* ptr(std::uint64_t a) { return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(a)); }

// A pool with a 32-chunk range, chunks 20 and 21 mapped for the arena (tagged) and two
// idle chunks.
struct PoolEnv {
  HostMemory host{{.chunk_bytes = kChunk}};
  FaultyMemory faulty{host};
  ChunkPool pool{faulty, {.max_chunks = 16, .precreate_chunks = 4}};
  VirtualRange r;
  std::vector<ChunkId> pre = std::vector<ChunkId>(2);
  PoolEnv() {
    REQUIRE(pool.reserve(32 * kChunk, &r));
    REQUIRE(pool.map_batch(ChunkOwner::kKVArena, std::vector<std::uint64_t>{at(20), at(21)}, pre));
    std::memset(ptr(at(20)), 0x3C, 2 * kChunk);
  }
  std::uint64_t at(std::uint32_t c) const { return r.base + c * kChunk; }
  bool tagged() const { return ptr(at(20))[9] == std::byte{0x3C} && ptr(at(21))[kChunk - 1] == std::byte{0x3C}; }
};

struct PoolSnap {
  std::uint32_t created, idle, mapped;
  std::array<std::uint32_t, kNumChunkOwners> owned;
  bool operator==(const PoolSnap&) const = default;
};
PoolSnap snap(const ChunkPool& p) {
  const auto s = p.stats();
  PoolSnap x{s.created, s.idle, s.mapped, {}};
  for (std::size_t o = 0; o < kNumChunkOwners; ++o) x.owned[o] = s.owned[o];
  return x;
}

// 5 chunks in 2 runs: 2 from idle, 3 created.
const std::array<std::uint32_t, 5> kBatch = {0, 1, 2, 6, 7};
}  // namespace

TEST_CASE("fault injection: ChunkPool::map_batch at every call position, by false and by exception") {
  for (const Fault f : kFaults) {
    CAPTURE(fault_name(f));
    const std::uint64_t positions = every_position([&](std::uint64_t n) {
      PoolEnv e;
      std::vector<std::uint64_t> addrs;
      for (std::uint32_t c : kBatch) addrs.push_back(e.at(c));
      std::vector<ChunkId> ids(addrs.size(), kNoChunk);
      const PoolSnap before = snap(e.pool);
      arm(e.faulty, f, n);
      const Outcome o = run_op([&] { return e.pool.map_batch(ChunkOwner::kVirtualTensor, addrs, ids); });
      const bool fired = disarm(e.faulty);
      accounted(e.host, e.pool);
      CHECK(e.tagged());
      if (!fired) {
        REQUIRE(o.ok);
        return false;
      }
      CHECK(o.raised == (f == Fault::kThrow));
      CHECK_FALSE(o.ok);
      CHECK((snap(e.pool) == before));
      // Still serves: the same batch goes through.
      REQUIRE(e.pool.map_batch(ChunkOwner::kVirtualTensor, addrs, ids));
      std::memset(ptr(e.at(0)), 1, 3 * kChunk);
      accounted(e.host, e.pool);
      return true;
    });
    // 3 creates + 5 maps + 2 set_access runs; a successful batch releases nothing.
    CHECK(positions == (f == Fault::kRelease ? 0u : 3u + 5u + 2u));
  }
}

TEST_CASE("fault injection: ChunkPool::unmap_batch, trim and free_range when a releasing call raises") {
  // unmap_batch: 3 runs. The runs before the failing one are unmapped, the rest stay.
  const std::uint64_t unmaps = every_position([&](std::uint64_t n) {
    PoolEnv e;
    std::vector<std::uint64_t> addrs;
    for (std::uint32_t c : kBatch) addrs.push_back(e.at(c));
    std::vector<ChunkId> ids(addrs.size());
    REQUIRE(e.pool.map_batch(ChunkOwner::kVirtualTensor, addrs, ids));
    ids.push_back(e.pre[1]);  // a third run
    arm(e.faulty, Fault::kRelease, n);
    const Outcome o = run_op([&] { return e.pool.unmap_batch(ids), true; });
    const bool fired = disarm(e.faulty);
    accounted(e.host, e.pool);
    if (!fired) {
      REQUIRE(o.ok);
      return false;
    }
    REQUIRE(o.raised);
    const std::size_t done = n == 1 ? 0 : n == 2 ? 3 : 5;  // chunks in the runs before
    for (std::size_t k = 0; k < ids.size(); ++k) CHECK((e.pool.address(ids[k]) == 0) == (k < done));
    CHECK(e.pool.owned(ChunkOwner::kVirtualTensor) == 5 - std::min<std::size_t>(done, 5));
    // Still serves: the rest unmaps, everything maps again.
    e.pool.unmap_batch(std::span(ids).subspan(done));
    REQUIRE(e.pool.map_batch(ChunkOwner::kVirtualTensor, addrs, std::span(ids).first(5)));
    accounted(e.host, e.pool);
    return true;
  });
  CHECK(unmaps == 3);

  // trim: a chunk whose release raises stays idle.
  const std::uint64_t trims = every_position([&](std::uint64_t n) {
    PoolEnv e;
    REQUIRE(e.pool.precreate(4));
    arm(e.faulty, Fault::kRelease, n);
    const Outcome o = run_op([&] { return e.pool.trim(0), true; });
    const bool fired = disarm(e.faulty);
    accounted(e.host, e.pool);
    if (!fired) {
      REQUIRE(o.ok);
      return false;
    }
    CHECK(o.raised);
    CHECK(e.pool.stats().idle == 4 - (n - 1));
    e.pool.trim(0);
    CHECK(e.pool.stats().idle == 0);
    accounted(e.host, e.pool);
    return true;
  });
  CHECK(trims == 4);

  // free_range: a range whose release raises stays reserved (and freeable).
  const std::uint64_t frees = every_position([&](std::uint64_t n) {
    PoolEnv e;
    VirtualRange extra;
    REQUIRE(e.pool.reserve(3 * kChunk, &extra));
    arm(e.faulty, Fault::kRelease, n);
    const Outcome o = run_op([&] { return e.pool.free_range(extra), true; });
    const bool fired = disarm(e.faulty);
    accounted(e.host, e.pool);
    if (!fired) {
      REQUIRE(o.ok);
      return false;
    }
    CHECK(o.raised);
    CHECK(e.host.live_ranges() == 2);
    e.pool.free_range(extra);
    CHECK(e.host.live_ranges() == 1);
    return true;
  });
  CHECK(frees == 1);
}

TEST_CASE("fault injection: ChunkPool::reserve and precreate at every acquiring call") {
  for (const Fault f : {Fault::kFalse, Fault::kThrow}) {
    CAPTURE(fault_name(f));
    const std::uint64_t reserves = every_position([&](std::uint64_t n) {
      PoolEnv e;
      VirtualRange extra;
      arm(e.faulty, f, n);
      const Outcome o = run_op([&] { return e.pool.reserve(3 * kChunk, &extra); });
      const bool fired = disarm(e.faulty);
      if (!fired) {
        REQUIRE(o.ok);
        return false;
      }
      CHECK((!o.ok && o.raised == (f == Fault::kThrow)));
      CHECK(e.host.live_ranges() == 1);
      CHECK_THROWS_WITH(e.pool.free_range(extra), Catch::Contains("not reserved through this pool"));
      return true;
    });
    CHECK(reserves == 1);
    // precreate: the chunks created before the failure stay idle (documented).
    const std::uint64_t creates = every_position([&](std::uint64_t n) {
      PoolEnv e;
      arm(e.faulty, f, n);
      const Outcome o = run_op([&] { return e.pool.precreate(5); });
      const bool fired = disarm(e.faulty);
      accounted(e.host, e.pool);
      if (!fired) {
        REQUIRE(o.ok);
        return false;
      }
      CHECK((!o.ok && o.raised == (f == Fault::kThrow)));
      CHECK(e.pool.stats().idle == 2 + (n - 1));
      REQUIRE(e.pool.precreate(5));
      accounted(e.host, e.pool);
      return true;
    });
    CHECK(creates == 3);
  }
}

TEST_CASE("fault injection: ChunkPool's destructor survives a raising release at every position") {
  const std::uint64_t positions = every_position([&](std::uint64_t n) {
    HostMemory host({.chunk_bytes = kChunk});
    FaultyMemory faulty(host);
    {
      ChunkPool pool(faulty, {.max_chunks = 8, .precreate_chunks = 3});
      VirtualRange r;
      REQUIRE(pool.reserve(4 * kChunk, &r));
      std::vector<ChunkId> ids(2);
      REQUIRE(pool.map_batch(ChunkOwner::kActivation, std::vector<std::uint64_t>{r.base, r.base + 2 * kChunk}, ids));
      arm(faulty, Fault::kRelease, n);
    }  // 2 unmaps + 3 releases + 1 free_range, one of which raises: no std::terminate
    host.check_invariants();
    const bool fired = faulty.fired();
    if (!fired) {
      CHECK((host.live_chunks() == 0 && host.live_mappings() == 0 && host.live_ranges() == 0));
      return false;
    }
    // Only what the failing call was about stays with the backend: one chunk (mapped, and
    // then the range around it too), or the range.
    CHECK(host.live_chunks() <= 1);
    CHECK(host.live_mappings() <= host.live_chunks());
    CHECK(host.live_ranges() <= 1);
    CHECK(host.live_chunks() + host.live_ranges() >= 1);
    if (host.live_mappings() == 1) CHECK(host.live_ranges() == 1);
    return true;
  });
  CHECK(positions == 2 + 3 + 1);
}

namespace {
// 3 layers x K,V x 16 tokens x 64 dims x 2 bytes = 12288-byte large pages over 8 KiB
// chunks: page j covers chunks [3j/2, (3j+2)/2], so neighbours share a chunk.
KVLayout straddling() { return KVLayout::plan({LayerGroup::full_attention("full", 3, 1, 64, 2, 16)}); }
constexpr std::uint64_t kArenaChunk = 8192;

struct ArenaSnap {
  std::uint32_t free, backed;
  std::vector<GroupId> owner;
  std::vector<std::uint32_t> users;
  PoolSnap pool;
  bool operator==(const ArenaSnap&) const = default;
};
ArenaSnap snap(const ArenaPagePool& pages, const KVArena& arena, const ChunkPool& pool) {
  ArenaSnap s{pages.num_free(), arena.num_backed_chunks(), {}, {}, snap(pool)};
  for (std::uint32_t j = 0; j < pages.capacity(); ++j) s.owner.push_back(pages.owner(LargePageId{j}));
  for (std::uint32_t c = 0; c < arena.num_chunks(); ++c)
    s.users.push_back(arena.chunk_users(c) * 2 + arena.chunk_backed(c));
  return s;
}
}  // namespace

TEST_CASE("fault injection: KVArena's full backing at construction, at every position") {
  for (const Fault f : kFaults) {
    CAPTURE(fault_name(f));
    const std::uint64_t positions = every_position([&](std::uint64_t n) {
      HostMemory host({.chunk_bytes = kArenaChunk});
      FaultyMemory faulty(host);
      ChunkPool pool(faulty, {.max_chunks = 16});
      arm(faulty, f, n);
      std::unique_ptr<KVArena> arena;
      const Outcome o = run_op([&] {
        arena = std::make_unique<KVArena>(pool, straddling(),
                                          KVArenaOptions{.num_large_pages = 4, .backing = ArenaBacking::kFull});
        return true;
      });
      const bool fired = disarm(faulty);
      accounted(host, pool);
      if (!fired) {
        REQUIRE(o.ok);
        CHECK(pool.stats().mapped == 6);
        return false;
      }
      // Any failure is the constructor's kvmm::Error, with nothing left behind.
      CHECK((o.raised && !arena));
      CHECK((pool.stats().mapped == 0 && pool.stats().created == 0 && host.live_ranges() == 0));
      KVArena again(pool, straddling(), {.num_large_pages = 4, .backing = ArenaBacking::kFull});
      std::memset(again.data(), 0x21, again.bytes());
      return true;
    });
    // reserve + 6 creates + 6 maps + 1 set_access; construction releases nothing.
    CHECK(positions == (f == Fault::kRelease ? 0u : 1u + 6u + 6u + 1u));
  }
}

TEST_CASE("fault injection: elastic ArenaPagePool allocate and free at every position") {
  struct Env {
    HostMemory host{{.chunk_bytes = kArenaChunk}};
    FaultyMemory faulty{host};
    ChunkPool pool{faulty, {.max_chunks = 16}};
    KVArena arena{pool, straddling(), {.num_large_pages = 8, .backing = ArenaBacking::kElastic}};
    ArenaPagePool pages{arena};
    void check() {
      pages.check_invariants();
      accounted(host, pool);
      REQUIRE(host.live_mappings() == arena.num_backed_chunks());
    }
  };
  // allocate: page 0 live (chunks 0, 1); page 1 needs chunk 2 backed (chunk 1 is).
  for (const Fault f : kFaults) {
    CAPTURE(fault_name(f));
    const std::uint64_t positions = every_position([&](std::uint64_t n) {
      Env e;
      REQUIRE(e.pages.allocate(0) == LargePageId{0});
      std::memset(ptr(e.arena.large_page_address(LargePageId{0})), 0x44, 12288);
      const ArenaSnap before = snap(e.pages, e.arena, e.pool);
      arm(e.faulty, f, n);
      std::optional<LargePageId> got;
      const Outcome o = run_op([&] { return (got = e.pages.allocate(1)).has_value(); });
      const bool fired = disarm(e.faulty);
      e.check();
      if (!fired) {
        REQUIRE((o.ok && got == LargePageId{1}));
        return false;
      }
      CHECK((!o.ok && o.raised == (f == Fault::kThrow)));
      CHECK((snap(e.pages, e.arena, e.pool) == before));
      CHECK(ptr(e.arena.large_page_address(LargePageId{0}))[12287] == std::byte{0x44});
      REQUIRE(e.pages.allocate(1) == LargePageId{1});
      std::memset(ptr(e.arena.large_page_address(LargePageId{1})), 0x45, 12288);
      e.check();
      return true;
    });
    CHECK(positions == (f == Fault::kRelease ? 0u : 1u + 1u + 1u));  // create, map, set_access of chunk 2
  }
  // free of page 0 after page 1: chunks 0 and 1 lose their last user and are unmapped
  // one by one. The page is free regardless; a chunk whose unmap raised stays backed.
  const std::uint64_t positions = every_position([&](std::uint64_t n) {
    Env e;
    REQUIRE(e.pages.allocate(0) == LargePageId{0});
    REQUIRE(e.pages.allocate(0) == LargePageId{1});
    e.pages.free(LargePageId{1});
    CHECK(e.arena.num_backed_chunks() == 2);
    arm(e.faulty, Fault::kRelease, n);
    const Outcome o = run_op([&] { return e.pages.free(LargePageId{0}), true; });
    const bool fired = disarm(e.faulty);
    e.check();
    if (!fired) {
      REQUIRE((o.ok && e.arena.num_backed_chunks() == 0));
      return false;
    }
    CHECK(o.raised);
    CHECK(e.pages.num_free() == 8);
    CHECK(e.pages.owner(LargePageId{0}) == kNoGroup);
    CHECK(e.arena.num_backed_chunks() == 2 - (n - 1));
    // Still serves: every page once, written, freed; no chunk stays mapped.
    for (std::uint32_t j = 0; j < 8; ++j) {
      const auto p = e.pages.allocate(j % 3);
      REQUIRE(p);
      std::memset(ptr(e.arena.large_page_address(*p)), int(j), 12288);
    }
    for (std::uint32_t j = 0; j < 8; ++j) e.pages.free(LargePageId{j});
    CHECK(e.arena.num_backed_chunks() == 0);
    e.check();
    return true;
  });
  CHECK(positions == 2);
}

TEST_CASE("fault injection: KVArena's destructor survives a raising release at every position") {
  const std::uint64_t positions = every_position([&](std::uint64_t n) {
    HostMemory host({.chunk_bytes = kArenaChunk});
    FaultyMemory faulty(host);
    ChunkPool pool(faulty, {.max_chunks = 16});
    {
      KVArena arena(pool, straddling(), {.num_large_pages = 2, .backing = ArenaBacking::kFull});
      arm(faulty, Fault::kRelease, n);
    }  // 3 unmaps + free_range
    const bool fired = disarm(faulty);
    accounted(host, pool);
    if (!fired) {
      CHECK((pool.stats().mapped == 0 && host.live_ranges() == 0));
      return false;
    }
    // A chunk whose unmap raised stays mapped and owned by the arena's owner in the pool
    // (which then cannot free the range either); the pool releases both when it goes.
    CHECK(pool.stats().mapped == (n <= 3 ? 1u : 0u));
    CHECK(host.live_ranges() == 1);
    return true;
  });
  CHECK(positions == 3 + 1);
}
