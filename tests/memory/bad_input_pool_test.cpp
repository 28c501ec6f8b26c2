// Bad input against HostMemory, ChunkPool, KVArena and ArenaPagePool, mixed into seeded
// random operation sequences (tests/memory/bad_input.hpp): every bad call raises a
// kvmm::Error naming the argument (or reports failure by value), leaves the invariants
// and the observable state unchanged, and the object serves a request end to end after.
#include "bad_input.hpp"

#include "kvmm/memory/arena_page_pool.hpp"
#include "kvmm/memory/chunk_pool.hpp"
#include "kvmm/memory/host_memory.hpp"
#include "kvmm/memory/kv_arena.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

using namespace kvmm;
using kvmm::test::BadCase;

namespace {
constexpr std::uint64_t kChunk = 4096;
constexpr std::uint64_t kMax64 = std::numeric_limits<std::uint64_t>::max();
std::byte* ptr(std::uint64_t a) { return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(a)); }
const auto kBogus = static_cast<ChunkOwner>(7);
}  // namespace

TEST_CASE("bad input: HostMemory") {
  CHECK_THROWS_WITH(HostMemory({.chunk_bytes = 0}), Catch::Contains("chunk_bytes = 0"));
  CHECK_THROWS_WITH(HostMemory({.chunk_bytes = kMax64 - 5}), Catch::Contains("chunk_bytes = 18446744073709551610"));
  HostMemory mem({.chunk_bytes = kChunk});
  // Anchors the bad cases aim at: range R with chunk C mapped at its base, chunk D live
  // and unmapped, handle X never created. Valid operations churn range E and chunks of
  // their own.
  VirtualRange R, E;
  ChunkHandle C, D;
  const ChunkHandle X = 1000;
  const std::uint64_t nowhere = 16 * kChunk;  // a low address no mmap hands out
  REQUIRE(mem.reserve(8 * kChunk, &R));
  REQUIRE(mem.reserve(16 * kChunk, &E));
  REQUIRE((mem.create_chunk(&C) && mem.create_chunk(&D)));
  REQUIRE((mem.map(C, R.base) && mem.set_access(R.base, kChunk)));
  std::memset(ptr(R.base), 0xC1, kChunk);
  std::vector<ChunkHandle> spare;
  std::array<ChunkHandle, 16> at;
  at.fill(~ChunkHandle{0});
  std::array<std::uint8_t, 16> tag{};
  std::vector<VirtualRange> temp;
  auto valid = [&](std::mt19937& rng) {
    const std::uint32_t slot = rng() % 16;
    ChunkHandle h;
    switch (rng() % 5) {
      case 0:
        if (temp.empty()) {
          VirtualRange t;
          REQUIRE(mem.reserve(1 + rng() % (3 * kChunk), &t));
          temp.push_back(t);
        } else {
          mem.free_range(temp.back());
          temp.pop_back();
        }
        break;
      case 1:
        if (spare.size() < 4 && mem.create_chunk(&h)) spare.push_back(h);
        break;
      case 2:
        if (!spare.empty()) mem.release_chunk(spare.back()), spare.pop_back();
        break;
      case 3:
        if (at[slot] == ~ChunkHandle{0} && !spare.empty()) {
          REQUIRE(mem.map(spare.back(), E.base + slot * kChunk));
          REQUIRE(mem.set_access(E.base + slot * kChunk, kChunk));
          at[slot] = spare.back();
          spare.pop_back();
          tag[slot] = std::uint8_t(rng());
          std::memset(ptr(E.base + slot * kChunk), tag[slot], kChunk);
        }
        break;
      default:
        if (at[slot] != ~ChunkHandle{0}) {
          REQUIRE(ptr(E.base + slot * kChunk)[kChunk - 1] == std::byte{tag[slot]});
          mem.unmap(E.base + slot * kChunk, kChunk);
          spare.push_back(at[slot]);
          at[slot] = ~ChunkHandle{0};
        }
    }
  };
  VirtualRange out;
  const std::vector<BadCase> cases = {
      {"reserve 0", "bytes = 0", [&] { return mem.reserve(0, &out); }},
      {"reserve 2^64-1", "bytes = 18446744073709551615", [&] { return mem.reserve(kMax64, &out); }},
      {"reserve 2^64-chunk", "bytes = 18446744073709547520", [&] { return mem.reserve(kMax64 - kChunk + 1, &out); }},
      {"free an unknown range", "not a reserved range",
       [&] {
         return mem.free_range({R.base + kChunk, kChunk}), true;
       }},
      {"free with the wrong size", "not a reserved range",
       [&] {
         return mem.free_range({R.base, R.bytes + kChunk}), true;
       }},
      {"free with a chunk mapped", "still mapped", [&] { return mem.free_range(R), true; }},
      {"release a dead chunk", fmt::format("chunk = {}", X), [&] { return mem.release_chunk(X), true; }},
      {"release a mapped chunk", "still mapped", [&] { return mem.release_chunk(C), true; }},
      {"map a dead chunk", "not live", [&] { return mem.map(X, R.base + kChunk); }},
      {"map unaligned", "not a run of whole chunks", [&] { return mem.map(D, R.base + 1); }},
      {"map outside every range", "not inside a reserved range", [&] { return mem.map(D, nowhere); }},
      {"map over a mapping", "already mapped", [&] { return mem.map(D, R.base); }},
      {"access no bytes", "not a run of whole chunks", [&] { return mem.set_access(R.base, 0); }},
      {"access an unmapped chunk", "no chunk is mapped", [&] { return mem.set_access(R.base, 2 * kChunk); }},
      {"access past the range", "not inside a reserved range",
       [&] { return mem.set_access(R.base, R.bytes + kChunk); }},
      {"unmap an unmapped chunk", "no chunk is mapped", [&] { return mem.unmap(R.base + kChunk, kChunk), true; }},
      {"unmap past the range", "not inside a reserved range", [&] { return mem.unmap(R.base, 2 * R.bytes), true; }},
      {"map_count of a dead chunk", "not live", [&] { return mem.map_count(X) == 0; }},
  };
  using Snap = std::array<std::uint64_t, 6>;
  std::function<Snap()> snapshot = [&] {
    return Snap{mem.live_chunks(), mem.live_mappings(), mem.live_ranges(),
                mem.map_count(C),  mem.map_count(D),    std::uint64_t(ptr(R.base)[17])};
  };
  kvmm::test::run_bad_inputs<Snap>(
      1401, 3000, cases, snapshot, [&] { mem.check_invariants(); }, valid);
  // Serves end to end: a fresh range, a chunk mapped at two addresses, data through both.
  VirtualRange a, b;
  ChunkHandle h;
  REQUIRE((mem.reserve(kChunk, &a) && mem.reserve(kChunk, &b) && mem.create_chunk(&h)));
  REQUIRE(
      (mem.map(h, a.base) && mem.map(h, b.base) && mem.set_access(a.base, kChunk) && mem.set_access(b.base, kChunk)));
  ptr(a.base)[99] = std::byte{0x42};
  CHECK(ptr(b.base)[99] == std::byte{0x42});
  mem.unmap(a.base, kChunk);
  mem.unmap(b.base, kChunk);
  mem.release_chunk(h);
  mem.free_range(a);
  mem.free_range(b);
  mem.check_invariants();
}

TEST_CASE("bad input: ChunkPool") {
  HostMemory host({.chunk_bytes = kChunk, .max_chunks = 30});
  CHECK_THROWS_WITH(ChunkPool(host, {.max_chunks = 0}), Catch::Contains("max_chunks = 0"));
  CHECK_THROWS_WITH(ChunkPool(host, {.max_chunks = ~0u}), Catch::Contains("max_chunks = 4294967295"));
  CHECK_THROWS_WITH(ChunkPool(host, {.max_chunks = 4, .precreate_chunks = 5}), Catch::Contains("precreate_chunks = 5"));
  CHECK_THROWS_WITH(ChunkPool(host, {.max_chunks = 40, .precreate_chunks = 31}),
                    Catch::Contains("precreate_chunks = 31"));
  CHECK(host.live_chunks() == 0);  // the failed precreate released what it made
  ChunkPool pool(host, {.max_chunks = 24, .precreate_chunks = 2});
  // Quotas sum to 22 < 24, so two ids are always unmapped.
  pool.set_quota(ChunkOwner::kKVArena, 8);
  pool.set_quota(ChunkOwner::kVirtualTensor, 8);
  pool.set_quota(ChunkOwner::kActivation, 6);
  VirtualRange R, F;
  REQUIRE(pool.reserve(64 * kChunk, &R));
  REQUIRE(host.reserve(kChunk, &F));  // foreign: not the pool's
  std::vector<ChunkId> anchor(1);
  REQUIRE(pool.map_batch(ChunkOwner::kKVArena, std::vector<std::uint64_t>{R.base}, anchor));  // slot 0, forever
  std::memset(ptr(R.base), 0xA7, kChunk);
  std::array<ChunkId, 64> at;
  at.fill(kNoChunk);
  at[0] = anchor[0];
  const ChunkOwner owners[] = {ChunkOwner::kKVArena, ChunkOwner::kVirtualTensor, ChunkOwner::kActivation};
  auto valid = [&](std::mt19937& rng) {
    std::vector<std::uint64_t> addrs;
    std::vector<ChunkId> ids;
    const std::uint32_t start = 2 + rng() % 62, len = 1 + rng() % 4;
    switch (rng() % 6) {
      case 0:
      case 1:
        if (pool.stats().mapped >= 16) break;  // some owner keeps a slack of 2 for the bad cases
        for (std::uint32_t s = start; s < std::min<std::uint32_t>(64, start + len); ++s)
          if (at[s] == kNoChunk) addrs.push_back(R.base + s * kChunk);
        ids.resize(addrs.size());
        if (pool.map_batch(owners[rng() % 3], addrs, ids))
          for (std::size_t k = 0; k < ids.size(); ++k) at[(addrs[k] - R.base) / kChunk] = ids[k];
        break;
      case 2:
      case 3:
        for (std::uint32_t s = start; s < std::min<std::uint32_t>(64, start + len); ++s)
          if (at[s] != kNoChunk) ids.push_back(at[s]), at[s] = kNoChunk;
        pool.unmap_batch(ids);
        break;
      case 4:
        rng() % 2 ? pool.trim(rng() % 4) : void(pool.precreate(rng() % 4));
        break;
      default: {
        const std::uint32_t f = rng() % 3, t = (f + 1 + rng() % 2) % 3;
        pool.move_quota(owners[f], owners[t], rng() % 3);
      }
    }
  };
  auto unmapped_id = [&] {
    for (ChunkId id = 0; id < pool.capacity(); ++id)
      if (pool.address(id) == 0) return id;
    FAIL("no unmapped chunk id");
    return kNoChunk;
  };
  std::vector<ChunkId> ids1(1), ids2(2);
  auto batch = [&](ChunkOwner o, std::vector<std::uint64_t> a, std::span<ChunkId> ids) {
    return pool.map_batch(o, a, ids);
  };
  const std::vector<BadCase> cases = {
      {"map for free", "owner = free", [&] { return batch(ChunkOwner::kFree, {R.base + kChunk}, ids1); }},
      {"map for owner 7", "owner = 7", [&] { return batch(kBogus, {R.base + kChunk}, ids1); }},
      {"ids of the wrong size", "ids_out.size() = 2",
       [&] { return batch(ChunkOwner::kActivation, {R.base + kChunk}, ids2); }},
      {"address 0", "addrs[0] = 0x0", [&] { return batch(ChunkOwner::kActivation, {0}, ids1); }},
      {"unaligned", "not a chunk-aligned address", [&] { return batch(ChunkOwner::kActivation, {R.base + 8}, ids1); }},
      {"past the range", "outside every range",
       [&] { return batch(ChunkOwner::kActivation, {R.base + R.bytes}, ids1); }},
      {"foreign range", "outside every range", [&] { return batch(ChunkOwner::kActivation, {F.base}, ids1); }},
      {"same address twice", "addrs[1]",
       [&] {
         return batch(ChunkOwner::kActivation, {R.base + kChunk, R.base + kChunk}, ids2);
       }},
      {"over a mapping (the backend raises)", "already mapped",
       [&] {
         ChunkOwner roomy = owners[0];
         for (ChunkOwner o : owners)
           if (pool.available(o) > pool.available(roomy)) roomy = o;
         return batch(roomy, {R.base + kChunk, R.base}, ids2);
       }},
      {"past the quota", "",
       [&] {
         std::vector<std::uint64_t> a;
         const std::uint32_t n = pool.available(ChunkOwner::kVirtualTensor) + 1;
         for (std::uint32_t s = 1; s < 64 && a.size() < n; ++s)
           if (at[s] == kNoChunk) a.push_back(R.base + s * kChunk);
         std::vector<ChunkId> ids(a.size());
         return a.size() == n && !pool.map_batch(ChunkOwner::kVirtualTensor, a, ids);
       }},
      {"unmap id past capacity", "chunk id = 24", [&] { return pool.unmap_batch(std::vector<ChunkId>{24}), true; }},
      {"unmap an unmapped id", "is not mapped",
       [&] { return pool.unmap_batch(std::vector<ChunkId>{unmapped_id()}), true; }},
      {"unmap twice", "listed twice",
       [&] {
         return pool.unmap_batch(std::vector<ChunkId>{at[0], at[0]}), true;
       }},
      {"quota of free", "owner = free", [&] { return pool.set_quota(ChunkOwner::kFree, 1), true; }},
      {"quota of owner 7", "owner = 7", [&] { return pool.set_quota(kBogus, 1), true; }},
      {"quota past capacity", "quota = 25", [&] { return pool.set_quota(ChunkOwner::kActivation, 25), true; }},
      {"quota below holdings", "quota = 0", [&] { return pool.set_quota(ChunkOwner::kKVArena, 0), true; }},
      {"move to itself", "from = to", [&] { return pool.move_quota(ChunkOwner::kKVArena, ChunkOwner::kKVArena, 1); }},
      {"move from free", "from = free", [&] { return pool.move_quota(ChunkOwner::kFree, ChunkOwner::kKVArena, 1); }},
      {"move to owner 7", "to = 7", [&] { return pool.move_quota(ChunkOwner::kKVArena, kBogus, 1); }},
      {"move more than the slack", "",
       [&] {
         const auto slack = pool.quota(ChunkOwner::kVirtualTensor) - pool.owned(ChunkOwner::kVirtualTensor);
         return !pool.move_quota(ChunkOwner::kVirtualTensor, ChunkOwner::kActivation, slack + 1);
       }},
      {"quota() of owner 7", "owner = 7", [&] { return pool.quota(kBogus) == 0; }},
      {"owned() of owner 7", "owner = 7", [&] { return pool.owned(kBogus) == 0; }},
      {"available() of owner 7", "owner = 7", [&] { return pool.available(kBogus) == 0; }},
      {"owner() past capacity", "chunk id = 24", [&] { return pool.owner(24) == ChunkOwner::kFree; }},
      {"address() past capacity", "chunk id = 99", [&] { return pool.address(99) == 0; }},
      {"free an unknown range", "not reserved through this pool",
       [&] {
         return pool.free_range({R.base + kChunk, kChunk}), true;
       }},
      {"free a foreign range", "not reserved through this pool", [&] { return pool.free_range(F), true; }},
      {"free a range in use", "still mapped", [&] { return pool.free_range(R), true; }},
  };
  struct Snap {
    std::uint32_t created, idle, mapped;
    std::array<std::uint32_t, 3> owned, quota;
    std::vector<std::uint64_t> addr;
    std::uint8_t anchor_byte;
    bool operator==(const Snap&) const = default;
  };
  std::function<Snap()> snapshot = [&] {
    const auto s = pool.stats();
    Snap r{s.created, s.idle, s.mapped, {}, {}, {}, std::uint8_t(ptr(R.base)[5])};
    for (int o = 0; o < 3; ++o) r.owned[o] = pool.owned(owners[o]), r.quota[o] = pool.quota(owners[o]);
    for (ChunkId id = 0; id < pool.capacity(); ++id) r.addr.push_back(pool.address(id));
    return r;
  };
  auto check = [&] {
    pool.check_invariants();
    host.check_invariants();
    REQUIRE(host.live_chunks() == pool.stats().created);
    REQUIRE(host.live_mappings() == pool.stats().mapped);
  };
  kvmm::test::run_bad_inputs<Snap>(1402, 3000, cases, snapshot, check, valid);
  // Serves end to end: a batch of three mapped, written, read and unmapped.
  for (std::uint32_t s = 1; s < 64; ++s)
    if (at[s] != kNoChunk) pool.unmap_batch(std::vector<ChunkId>{at[s]}), at[s] = kNoChunk;
  pool.set_quota(ChunkOwner::kVirtualTensor, 8);
  std::vector<ChunkId> ids(3);
  REQUIRE(pool.map_batch(ChunkOwner::kVirtualTensor,
                         std::vector<std::uint64_t>{R.base + kChunk, R.base + 2 * kChunk, R.base + 9 * kChunk}, ids));
  std::memset(ptr(R.base + kChunk), 0x3D, 2 * kChunk);
  CHECK(ptr(R.base + 2 * kChunk)[kChunk - 1] == std::byte{0x3D});
  CHECK(ptr(R.base)[0] == std::byte{0xA7});
  pool.unmap_batch(ids);
  pool.unmap_batch(anchor);
  pool.free_range(R);
  host.free_range(F);
  check();
}

TEST_CASE("bad input: KVArena and ArenaPagePool") {
  HostMemory host({.chunk_bytes = 8192});
  ChunkPool pool(host, {.max_chunks = 40});
  // 3 layers x K,V x 16 tokens x 64 dims x 2 bytes = 12288-byte large pages straddle 8 KiB chunks.
  const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("full", 3, 1, 64, 2, 16)});
  REQUIRE(layout.large_page_bytes() == 12288);
  CHECK_THROWS_WITH(KVArena(pool, layout, {.num_large_pages = 0}), Catch::Contains("num_large_pages = 0"));
  CHECK_THROWS_WITH(KVArena(pool, layout, {.num_large_pages = ~0u}), Catch::Contains("num_large_pages = 4294967295"));
  CHECK_THROWS_WITH(KVArena(pool, layout, {.num_large_pages = 3u << 30}), Catch::Contains("more than 2^32-2"));
  CHECK_THROWS_WITH(KVArena(pool, layout, {.num_large_pages = 40, .backing = ArenaBacking::kFull}),
                    Catch::Contains("cannot back"));
  CHECK_THROWS_WITH(KVArena(pool, layout, {.num_large_pages = 4, .backing = ArenaBacking(9)}),
                    Catch::Contains("backing = 9"));
  CHECK((pool.stats().created == 0 && host.live_ranges() == 0 && host.live_chunks() == 0));
  KVArena arena(pool, layout, {.num_large_pages = 20, .backing = ArenaBacking::kElastic});
  ArenaPagePool pages(arena);
  const LargePageId anchor = *pages.allocate(1);  // page 0, forever: chunks 0 and 1 have a live page
  std::memset(ptr(arena.large_page_address(anchor)), 0x6A, 12288);
  std::vector<LargePageId> used;
  std::vector<std::uint8_t> tag(20, 0);
  auto valid = [&](std::mt19937& rng) {
    if (used.size() < 14 && (used.empty() || rng() % 2)) {
      if (auto p = pages.allocate(GroupId(rng() % 3))) {
        tag[p->index] = std::uint8_t(rng());
        std::memset(ptr(arena.large_page_address(*p)), tag[p->index], 12288);
        used.push_back(*p);
      }
    } else if (!used.empty()) {
      const std::size_t k = rng() % used.size();
      REQUIRE(ptr(arena.large_page_address(used[k]))[12287] == std::byte{tag[used[k].index]});
      pages.free(used[k]);
      used[k] = used.back();
      used.pop_back();
    }
  };
  auto free_page = [&] {
    for (std::uint32_t j = 0; j < 20; ++j)
      if (pages.owner(LargePageId{j}) == kNoGroup) return LargePageId{j};
    return LargePageId{20};
  };
  auto unbacked_chunk = [&] {
    for (std::uint32_t c = 0; c < arena.num_chunks(); ++c)
      if (!arena.chunk_backed(c)) return c;
    return arena.num_chunks();
  };
  const std::vector<BadCase> cases = {
      {"large page address past the arena", "large page id = 20",
       [&] { return arena.large_page_address(LargePageId{20}) != 0; }},
      {"small page address past the arena", "small page id = 20", [&] { return arena.small_page_address(0, 20) != 0; }},
      {"back an empty chunk range", "chunks [3, 2]", [&] { return arena.back_chunks(3, 2); }},
      {"back past the arena", "chunks [0, 30]", [&] { return arena.back_chunks(0, 30); }},
      {"release past the arena", "chunk = 30", [&] { return arena.release_chunk(30), true; }},
      {"release an unbacked chunk", "not a backed chunk", [&] { return arena.release_chunk(unbacked_chunk()), true; }},
      {"release under a live page", "live large page",
       [&] { return arena.release_chunk(arena.first_chunk(anchor)), true; }},
      {"pin past the arena", "large page id = 21", [&] { return arena.pin(LargePageId{21}); }},
      {"unpin a free page", "large page id = ", [&] { return arena.unpin(free_page()), true; }},
      {"allocate for no group", "owner = 4294967295", [&] { return pages.allocate(kNoGroup).has_value(); }},
      {"free past the pool", "large page id = 20", [&] { return pages.free(LargePageId{20}), true; }},
      {"free a free page", "double free", [&] { return pages.free(free_page()), true; }},
      {"owner past the pool", "large page id = 25", [&] { return pages.owner(LargePageId{25}) == 0; }},
  };
  struct Snap {
    std::uint32_t free, backed, created, mapped;
    std::vector<GroupId> owner;
    std::vector<std::uint32_t> users;
    bool operator==(const Snap&) const = default;
  };
  std::function<Snap()> snapshot = [&] {
    Snap s{pages.num_free(), arena.num_backed_chunks(), pool.stats().created, pool.stats().mapped, {}, {}};
    for (std::uint32_t j = 0; j < 20; ++j) s.owner.push_back(pages.owner(LargePageId{j}));
    for (std::uint32_t c = 0; c < arena.num_chunks(); ++c)
      s.users.push_back(arena.chunk_users(c) * 2 + arena.chunk_backed(c));
    return s;
  };
  auto check = [&] {
    pages.check_invariants();
    pool.check_invariants();
    REQUIRE(host.live_mappings() == arena.num_backed_chunks());
  };
  kvmm::test::run_bad_inputs<Snap>(1403, 3000, cases, snapshot, check, valid);
  // Serves end to end: a page allocated, written through its small pages, freed.
  for (const LargePageId p : used) pages.free(p);
  const auto p = pages.allocate(0);
  REQUIRE(p);
  // One small page per large page here (12 KiB each): the large page's first small page.
  std::memset(ptr(arena.small_page_address(0, p->index * layout.small_pages_per_large_page(0))), 0x11, 12288);
  CHECK(ptr(arena.large_page_address(*p))[12287] == std::byte{0x11});
  CHECK(ptr(arena.large_page_address(anchor))[0] == std::byte{0x6A});
  pages.free(*p);
  pages.free(anchor);
  CHECK(arena.num_backed_chunks() == 0);
  check();
}
