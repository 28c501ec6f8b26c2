// The paging layer drawing its large pages from an elastic arena (ArenaPagePool as the
// pool's LargePageSource): chunks are backed as requests grow and released as they
// finish, and a growth that cannot be backed fails with nothing changed.
#include "kvmm/memory/arena_page_pool.hpp"
#include "kvmm/memory/host_memory.hpp"
#include "kvmm/memory/kv_arena.hpp"
#include "kvmm/paging/kv_allocator.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <random>

using namespace kvmm;

namespace {
// full: 2 layers x K,V x 16 tokens x 64 dims x 2 bytes = 8192 B; swa: 2048 B; LCM 8192.
KVLayout layout() {
  return KVLayout::plan(
      {LayerGroup::full_attention("full", 2, 1, 64, 2, 16), LayerGroup::sliding_window("swa", 1, 1, 32, 2, 16, 64)});
}
}  // namespace

TEST_CASE("PagedKVAllocator over an elastic arena backs and releases chunks") {
  HostMemory host({.chunk_bytes = 16384, .max_chunks = 4});  // 2 large pages per chunk
  ChunkPool chunks(host, {.max_chunks = 64});
  KVArena arena(chunks, layout(), {.num_large_pages = 16, .backing = ArenaBacking::kElastic});
  ArenaPagePool source(arena);
  PagedKVAllocator kv(layout(), {.max_requests = 4, .large_page_source = &source});
  REQUIRE(kv.large_pages().capacity() == 16);
  CHECK(arena.num_backed_chunks() == 0);

  const RequestId a = kv.add_request();
  REQUIRE(kv.append_tokens(a, 40));  // full: 3 large pages, swa: 3 small pages in 1
  CHECK(arena.num_backed_chunks() == 2);
  // The pages are real memory: write through the small page addresses.
  for (GroupId g = 0; g < 2; ++g)
    for (PageId p : kv.page_tables(g).pages(Row{a}))
      std::memset(reinterpret_cast<void*>(static_cast<std::uintptr_t>(arena.small_page_address(g, p))), 0x5a,
                  kv.layout().small_page_bytes(g));

  // Only 4 chunks exist: 8 large pages. b needs 5 more large pages for 80 tokens.
  const RequestId b = kv.add_request();
  const std::uint32_t free_before = kv.large_pages().num_free();
  CHECK_FALSE(kv.append_tokens(b, 16 * 8));
  CHECK(kv.page_tables(0).num_pages(Row{b}) == 0);
  CHECK(kv.page_tables(1).num_pages(Row{b}) == 0);
  CHECK(kv.large_pages().num_free() == free_before);
  kv.check_invariants();
  source.check_invariants();
  REQUIRE(kv.append_tokens(b, 16 * 3));
  kv.free_request(a);
  kv.free_request(b);
  CHECK(arena.num_backed_chunks() == 0);  // every chunk released with its last page
  source.check_invariants();
  kv.check_invariants();
}

TEST_CASE("PagedKVAllocator over an elastic arena: random growth and frees stay consistent") {
  HostMemory host({.chunk_bytes = 4096, .max_chunks = 40});
  ChunkPool chunks(host, {.max_chunks = 64});
  KVArena arena(chunks, layout(), {.num_large_pages = 32, .backing = ArenaBacking::kElastic});
  ArenaPagePool source(arena);
  PagedKVAllocator kv(layout(), {.max_requests = 8, .large_page_source = &source});
  std::mt19937 rng(5);
  std::map<RequestId, std::uint64_t> model;
  int refused = 0;
  for (int op = 0; op < 6000; ++op) {
    const int k = static_cast<int>(rng() % 10);
    if (k < 2 && model.size() < 8) {
      model[kv.add_request()] = 0;
    } else if (k < 3 && !model.empty()) {
      auto it = std::next(model.begin(), static_cast<long>(rng() % model.size()));
      kv.free_request(it->first);
      model.erase(it);
    } else if (!model.empty()) {
      auto it = std::next(model.begin(), static_cast<long>(rng() % model.size()));
      const auto n = static_cast<std::uint32_t>(1 + rng() % 40);
      if (kv.append_tokens(it->first, n))
        it->second += n;
      else
        ++refused;
    }
    kv.check_invariants();
    source.check_invariants();
    for (const auto& [r, t] : model) REQUIRE(kv.num_tokens(r) == t);
    // A backed chunk always serves a used large page (elastic: nothing idle is kept).
    REQUIRE(arena.num_backed_chunks() <= 2 * (32 - kv.large_pages().num_free()));
  }
  CHECK(refused > 50);  // 40 chunks of 4 KiB hold 20 of the 32 large pages
  for (const auto& [r, t] : model) kv.free_request(r);
  CHECK(arena.num_backed_chunks() == 0);
}
