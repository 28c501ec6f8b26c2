#include "kvmm/memory/kv_arena.hpp"
#include "kvmm/error.hpp"
#include "kvmm/memory/arena_page_pool.hpp"
#include "kvmm/memory/host_memory.hpp"
#include "kvmm/testing/faulty_memory.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

using namespace kvmm;

namespace {
std::byte* ptr(std::uint64_t a) { return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(a)); }

// full: 2 layers x K,V x 16 tokens x 64 dims x 2 bytes = 8192; swa: 2048. LCM 8192.
KVLayout small_layout(std::uint32_t full_layers = 2) {
  return KVLayout::plan({LayerGroup::full_attention("full", full_layers, 1, 64, 2, 16),
                         LayerGroup::sliding_window("swa", 1, 1, 32, 2, 16, 64)});
}
}  // namespace

TEST_CASE("KVArena: full backing maps every chunk at once and exposes kernel addresses") {
  HostMemory host({.chunk_bytes = 4096});
  ChunkPool pool(host, {.max_chunks = 64});
  const KVLayout layout = small_layout();
  REQUIRE(layout.large_page_bytes() == 8192);
  KVArena arena(pool, layout, {.num_large_pages = 8, .backing = ArenaBacking::kFull});
  CHECK(arena.num_chunks() == 16);
  CHECK(arena.num_backed_chunks() == 16);
  CHECK(pool.stats().mapped == 16);
  CHECK(host.live_mappings() == 16);
  // Kernel view: page stride is the small page size; K/V offsets come from the layout.
  const PagedLayerView v = arena.layer_view(0, 1);
  CHECK(v.page_stride == 8192);
  CHECK(v.k_base == arena.base() + layout.k_offset(0, 1));
  CHECK(v.v_base == arena.base() + layout.v_offset(0, 1));
  const PagedLayerView w = arena.layer_view(1, 0);
  CHECK(w.page_stride == 2048);
  // Small page 13 of group 1 lives in large page 13 / 4 = 3.
  CHECK(arena.small_page_address(1, 13) == arena.base() + 13 * 2048);
  CHECK(arena.small_page_address(1, 13) >= arena.large_page_address(LargePageId{3}));
  CHECK(arena.small_page_address(1, 13) < arena.large_page_address(LargePageId{4}));
  std::memset(arena.data(), 0x77, arena.bytes());  // all of it is writable
  CHECK(ptr(w.k_base + 31 * w.page_stride)[5] == std::byte{0x77});
  CHECK_THROWS_WITH(arena.small_page_address(1, 32), Catch::Contains("small page id = 32"));
  CHECK_THROWS_WITH(arena.large_page_address(LargePageId{8}), Catch::Contains("large page id = 8"));

  ArenaPagePool pages(arena);
  auto a = pages.allocate(0);
  REQUIRE(a);
  CHECK(*a == LargePageId{0});
  pages.free(*a);
  CHECK(arena.num_backed_chunks() == 16);  // full arenas never unmap
  pages.check_invariants();
  CHECK_THROWS_WITH(KVArena(pool, layout, {.num_large_pages = 30, .backing = ArenaBacking::kFull}),
                    Catch::Contains("num_large_pages = 30"));
  CHECK(pool.stats().mapped == 16);  // the failed arena left nothing behind
  pool.check_invariants();
}

TEST_CASE("ArenaPagePool: elastic chunks are mapped on first use, filled busy-first and released when empty") {
  HostMemory host({.chunk_bytes = 32768});  // 4 large pages per chunk
  ChunkPool pool(host, {.max_chunks = 8});
  KVArena arena(pool, small_layout(), {.num_large_pages = 16, .backing = ArenaBacking::kElastic});
  ArenaPagePool pages(arena);
  CHECK(arena.num_backed_chunks() == 0);
  CHECK(pages.capacity() == 16);
  std::vector<std::uint32_t> got;
  for (int i = 0; i < 3; ++i) got.push_back(pages.allocate(0)->index);
  CHECK(got == std::vector<std::uint32_t>{0, 1, 2});
  CHECK(arena.num_backed_chunks() == 1);  // all three share chunk 0
  for (int i = 0; i < 6; ++i) got.push_back(pages.allocate(1)->index);
  CHECK(arena.num_backed_chunks() == 3);  // 9 pages -> chunks 0, 1, 2
  pages.check_invariants();
  // Chunk 1 (pages 4..7) drains except page 5; chunk 2 (page 8) keeps one page.
  for (const std::uint32_t p : {4u, 6u, 7u}) pages.free(LargePageId{p});
  CHECK(arena.num_backed_chunks() == 3);
  // The next allocations prefer the busy chunks' six free pages (4, 6, 7, 9, 10, 11),
  // never an unbacked chunk.
  for (int i = 0; i < 6; ++i) {
    auto p = pages.allocate(0);
    REQUIRE(p);
    CHECK(p->index < 12);
  }
  CHECK(arena.num_backed_chunks() == 3);
  // Free everything in chunk 2: its chunk is unmapped right away.
  for (const std::uint32_t p : {8u, 9u, 10u, 11u}) pages.free(LargePageId{p});
  CHECK(arena.num_backed_chunks() == 2);
  CHECK_FALSE(arena.chunk_backed(2));
  CHECK(pool.stats().mapped == 2);
  CHECK(pool.stats().idle == 1);  // handle kept for reuse
  pages.check_invariants();
  CHECK_THROWS_WITH(pages.free(LargePageId{9}), Catch::Contains("large page id = 9: double free"));
  CHECK_THROWS_WITH(pages.free(LargePageId{16}), Catch::Contains("large page id = 16"));
  CHECK(pages.num_used() == 8);
  pages.check_invariants();
}

TEST_CASE("ArenaPagePool: an allocation that cannot back its chunk returns nullopt and changes nothing") {
  HostMemory host({.chunk_bytes = 4096});
  FaultyMemory faulty(host);
  ChunkPool pool(faulty, {.max_chunks = 64});
  // 3 full layers: large page 12288 = 3 chunks of 4096.
  KVArena arena(pool, small_layout(3), {.num_large_pages = 6, .backing = ArenaBacking::kElastic});
  ArenaPagePool pages(arena);
  REQUIRE(pages.allocate(0));
  for (std::uint64_t n = 1; n <= 7; ++n) {  // 3 creates + 3 maps + 1 set_access
    faulty.fail_at(n);
    CHECK_FALSE(pages.allocate(0));
    CHECK(faulty.fired());
    CHECK(pages.num_used() == 1);
    CHECK(arena.num_backed_chunks() == 3);
    CHECK(host.live_chunks() == pool.stats().created);
    pages.check_invariants();
    pool.check_invariants();
  }
  faulty.fail_at(0);
  REQUIRE(pages.allocate(0));
  CHECK(arena.num_backed_chunks() == 6);
}

TEST_CASE("ArenaPagePool: seeded random allocate/free over straddling pages keeps data and invariants") {
  for (std::uint64_t chunk : {4096u, 8192u, 65536u}) {
    DYNAMIC_SECTION("chunk " << chunk) {
      HostMemory host({.chunk_bytes = chunk});
      FaultyMemory faulty(host);
      ChunkPool pool(faulty, {.max_chunks = 200});
      const KVLayout layout = small_layout(3);  // 12288-byte large pages straddle chunks
      KVArena arena(pool, layout, {.num_large_pages = 40, .backing = ArenaBacking::kElastic});
      ArenaPagePool pages(arena);
      std::mt19937 rng{static_cast<std::uint32_t>(chunk)};
      std::vector<LargePageId> used;
      std::vector<std::uint8_t> tag(40, 0);
      for (int op = 0; op < 4000; ++op) {
        if (used.empty() || rng() % 100 < 55) {
          if (rng() % 16 == 0) faulty.fail_at(1 + rng() % 4);
          const std::uint32_t before = pages.num_free();
          auto p = pages.allocate(GroupId(rng() % 2));
          faulty.fail_at(0);
          if (!p) {
            REQUIRE(pages.num_free() == before);
          } else {
            tag[p->index] = std::uint8_t(rng());
            std::memset(ptr(arena.large_page_address(*p)), tag[p->index], layout.large_page_bytes());
            used.push_back(*p);
          }
        } else {
          const std::size_t k = rng() % used.size();
          const LargePageId p = used[k];
          const std::byte* b = ptr(arena.large_page_address(p));
          REQUIRE(b[0] == std::byte{tag[p.index]});
          REQUIRE(b[layout.large_page_bytes() - 1] == std::byte{tag[p.index]});
          pages.free(p);
          used[k] = used.back();
          used.pop_back();
        }
        pages.check_invariants();
        pool.check_invariants();
        REQUIRE(host.live_mappings() == arena.num_backed_chunks());
      }
    }
  }
}
