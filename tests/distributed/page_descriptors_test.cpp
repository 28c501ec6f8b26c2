// Page descriptors: a request's page table row as coalesced (address, bytes, device) runs
// over a KVArena, checked against an independent count of runs; KV moved between two
// KVArenas on HostMemory through paired runs (split to common lengths) with the bytes
// compared page by page; bad input; and the layout fingerprint (what changes it, what not).
#include "kvmm/distributed/page_descriptors.hpp"
#include "kvmm/error.hpp"
#include "kvmm/memory/chunk_pool.hpp"
#include "kvmm/memory/host_memory.hpp"
#include "kvmm/memory/kv_arena.hpp"
#include "kvmm/spec/presets.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

using namespace kvmm;

namespace {

KVLayout layout_a() {
  return KVLayout::plan(
      {LayerGroup::full_attention("full", 2, 1, 64, 2, 16), LayerGroup::sliding_window("swa", 1, 1, 32, 2, 16, 64)});
}

std::byte* ptr(std::uint64_t a) { return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(a)); }

// A row of `n` distinct page ids below `limit`, in runs of random length, with some null
// pages (at the same positions in every row built from the same `nulls`).
std::vector<PageId> random_row(std::mt19937_64& rng, std::uint32_t n, std::uint32_t limit,
                               const std::vector<bool>& nulls) {
  std::vector<PageId> ids(limit);
  for (std::uint32_t i = 0; i < limit; ++i) ids[i] = i;
  std::vector<PageId> row;
  // Pick run starts at random; take consecutive ids while unused.
  std::vector<bool> used(limit, false);
  while (row.size() < n) {
    PageId p = static_cast<PageId>(rng() % limit);
    const std::uint32_t len = 1 + static_cast<std::uint32_t>(rng() % 6);
    for (std::uint32_t k = 0; k < len && row.size() < n && p < limit && !used[p]; ++k, ++p) {
      used[p] = true;
      row.push_back(nulls[row.size()] ? kNullPage : p);
    }
  }
  return row;
}

std::size_t expected_runs(const std::vector<PageId>& row) {
  std::size_t runs = 0;
  PageId prev = kNullPage;
  for (const PageId p : row) {
    if (p == kNullPage) continue;
    if (prev == kNullPage || p != prev + 1) ++runs;
    prev = p;
  }
  return runs;
}

}  // namespace

TEST_CASE("page descriptors: consecutive page ids merge, null pages are skipped") {
  HostMemory host({.chunk_bytes = 8192});
  ChunkPool pool(host, {.max_chunks = 64});
  const KVLayout layout = layout_a();
  KVArena arena(pool, layout, {.num_large_pages = 8, .backing = ArenaBacking::kFull});
  const std::uint64_t size0 = layout.small_page_bytes(0);
  std::vector<PageRun> runs;
  const std::vector<PageId> row{3, 4, 5, kNullPage, 7, 1, 2};
  CHECK(page_runs(arena, 0, row, 0, runs) == 3);
  REQUIRE(runs.size() == 3);
  CHECK(runs[0] == PageRun{arena.small_page_address(0, 3), 3 * size0, 0});
  CHECK(runs[1] == PageRun{arena.small_page_address(0, 7), size0, 0});
  CHECK(runs[2] == PageRun{arena.small_page_address(0, 1), 2 * size0, 0});
  // Group 1's pages are smaller; the same ids give other addresses.
  runs.clear();
  CHECK(page_runs(arena, 1, std::vector<PageId>{0, 1, 2}, 5, runs) == 1);
  CHECK(runs[0] == PageRun{arena.small_page_address(1, 0), 3 * layout.small_page_bytes(1), 5});
  // A page outside the arena: an error naming it, nothing appended.
  runs.clear();
  const PageId limit = 8 * layout.small_pages_per_large_page(0);
  CHECK_THROWS_WITH(page_runs(arena, 0, std::vector<PageId>{1, limit}, 0, runs),
                    Catch::Contains("pages[1] = " + std::to_string(limit)));
  CHECK(runs.empty());
}

TEST_CASE("page descriptors: pair_runs splits to common lengths and rejects unequal sizes") {
  std::vector<TransferSpan> spans;
  const std::vector<PageRun> src{{1000, 300, 0}, {5000, 100, 0}};
  const std::vector<PageRun> dst{{0, 100, 1}, {200, 250, 1}, {900, 50, 1}};
  CHECK(pair_runs(src, dst, spans) == 4);
  const std::vector<TransferSpan> want{{1000, 0, 100}, {1100, 200, 200}, {5000, 400, 50}, {5050, 900, 50}};
  CHECK(spans == want);
  CHECK_THROWS_WITH(pair_runs(src, std::vector<PageRun>{{0, 10, 0}}, spans),
                    Catch::Contains("source runs cover 400 bytes, destination runs 10"));
}

TEST_CASE("page descriptors: a request's KV moves between two arenas through the descriptors") {
  HostMemory host({.chunk_bytes = 8192});
  ChunkPool pool(host, {.max_chunks = 256});
  const KVLayout layout = layout_a();
  KVArena src(pool, layout, {.num_large_pages = 32, .backing = ArenaBacking::kFull});
  KVArena dst(pool, layout, {.num_large_pages = 32, .backing = ArenaBacking::kFull});
  std::mt19937_64 rng(42);
  std::vector<PageRun> src_runs, dst_runs;
  std::vector<TransferSpan> spans;
  for (int round = 0; round < 200; ++round) {
    const GroupId g = static_cast<GroupId>(round % 2);
    const std::uint32_t limit = 32 * layout.small_pages_per_large_page(g);
    const std::uint64_t size = layout.small_page_bytes(g);
    const std::uint32_t n = 1 + static_cast<std::uint32_t>(rng() % (limit / 2));
    std::vector<bool> nulls(n);
    for (std::uint32_t i = 0; i < n; ++i) nulls[i] = g == 1 && rng() % 5 == 0;
    const auto src_row = random_row(rng, n, limit, nulls);
    const auto dst_row = random_row(rng, n, limit, nulls);
    for (const PageId p : src_row) {
      if (p == kNullPage) continue;
      std::byte* page = ptr(src.small_page_address(g, p));
      for (std::uint64_t b = 0; b < size; ++b) page[b] = static_cast<std::byte>(rng());
    }
    std::memset(dst.data(), 0, dst.bytes());
    src_runs.clear();
    dst_runs.clear();
    spans.clear();
    CHECK(page_runs(src, g, src_row, 0, src_runs) == expected_runs(src_row));
    CHECK(page_runs(dst, g, dst_row, 0, dst_runs) == expected_runs(dst_row));
    pair_runs(src_runs, dst_runs, spans);
    for (const TransferSpan& s : spans) std::memcpy(ptr(s.dst), ptr(s.src), s.bytes);
    for (std::uint32_t i = 0; i < n; ++i) {
      if (src_row[i] == kNullPage) continue;
      REQUIRE(std::memcmp(ptr(dst.small_page_address(g, dst_row[i])), ptr(src.small_page_address(g, src_row[i])),
                          size) == 0);
    }
  }
}

TEST_CASE("page descriptors: the layout fingerprint changes with everything that changes bytes") {
  const std::uint64_t base = layout_fingerprint(layout_a());
  CHECK(layout_fingerprint(layout_a()) == base);
  // Names do not change bytes.
  CHECK(layout_fingerprint(KVLayout::plan({LayerGroup::full_attention("f", 2, 1, 64, 2, 16),
                                           LayerGroup::sliding_window("s", 1, 1, 32, 2, 16, 64)})) == base);
  const std::vector<KVLayout> others{
      KVLayout::plan({LayerGroup::full_attention("full", 3, 1, 64, 2, 16),
                      LayerGroup::sliding_window("swa", 1, 1, 32, 2, 16, 64)}),
      KVLayout::plan({LayerGroup::full_attention("full", 2, 2, 64, 2, 16),
                      LayerGroup::sliding_window("swa", 1, 1, 32, 2, 16, 64)}),
      KVLayout::plan({LayerGroup::full_attention("full", 2, 1, 128, 2, 16),
                      LayerGroup::sliding_window("swa", 1, 1, 32, 2, 16, 64)}),
      KVLayout::plan({LayerGroup::full_attention("full", 2, 1, 64, 1, 16),
                      LayerGroup::sliding_window("swa", 1, 1, 32, 2, 16, 64)}),
      KVLayout::plan({LayerGroup::full_attention("full", 2, 1, 64, 2, 32),
                      LayerGroup::sliding_window("swa", 1, 1, 32, 2, 16, 64)}),
      KVLayout::plan({LayerGroup::full_attention("full", 2, 1, 64, 2, 16),
                      LayerGroup::sliding_window("swa", 1, 1, 32, 2, 16, 128)}),
      KVLayout::plan(
          {LayerGroup::full_attention("full", 2, 1, 64, 2, 16), LayerGroup::full_attention("swa", 1, 1, 32, 2, 16)}),
      KVLayout::plan({LayerGroup::sliding_window("swa", 1, 1, 32, 2, 16, 64),
                      LayerGroup::full_attention("full", 2, 1, 64, 2, 16)}),
      KVLayout::plan({LayerGroup::full_attention("full", 2, 1, 64, 2, 16)}),
      // The same pages holding other model layers (LayerGroup::layers: the layer map).
      [] {
        LayerGroup full = LayerGroup::full_attention("full", 2, 1, 64, 2, 16);
        LayerGroup swa = LayerGroup::sliding_window("swa", 1, 1, 32, 2, 16, 64);
        full.layers = {0, 2};
        swa.layers = {1};
        return KVLayout::plan({full, swa});
      }(),
  };
  for (std::size_t i = 0; i < others.size(); ++i) {
    INFO("variant " << i);
    CHECK(layout_fingerprint(others[i]) != base);
  }
}

// LayerGroup::kv_order: the values below (but DeepSeek-V3's) were computed at commit 84b7dce,
// before kv_order existed (XXH3-64 over a fixed little-endian serialization: the same on every machine), so
// a token-major layout must still give them; a head-major group changes the fingerprint.
TEST_CASE("page descriptors: token-major fingerprints are those from before kv_order; head-major differs") {
  CHECK(layout_fingerprint(layout_a()) == 0x20465400d4f0f4e1ULL);
  CHECK(layout_fingerprint(presets::llama3_1_8b()) == 0x269612abf61610e5ULL);
  CHECK(layout_fingerprint(presets::jamba1_5_mini()) == 0xbcdb6cddb2592f84ULL);
  // DeepSeek-V3's MLA latent and indexer groups set their storage and element formats, which
  // the fingerprint has covered since (the test below): 0x30d008f60793de36 before.
  CHECK(layout_fingerprint(presets::deepseek_v3()) == 0xc1d344e35b0d54a8ULL);
  std::vector<LayerGroup> groups{LayerGroup::full_attention("full", 2, 1, 64, 2, 16),
                                 LayerGroup::sliding_window("swa", 1, 1, 32, 2, 16, 64)};
  std::vector<std::uint64_t> seen{layout_fingerprint(KVLayout::plan(groups))};
  for (std::size_t g = 0; g < groups.size(); ++g) {
    groups[g].kv_order = KVOrder::kHeadMajor;
    const KVLayout hnd = KVLayout::plan(groups);
    CHECK(layout_fingerprint(hnd) == layout_fingerprint(KVLayout::plan(groups)));  // deterministic
    for (const std::uint64_t s : seen) CHECK(layout_fingerprint(hnd) != s);
    seen.push_back(layout_fingerprint(hnd));
  }
}

// Pages of equal size whose bytes mean other things: fp8 e4m3 against e5m2 (1 byte each),
// scales inline against apart, an MLA latent's rope part in another format, a state tensor's
// element type. Each pair would share every size and offset, so only the formats tell them
// apart; a tier must never serve one for the other. Plain groups keep their pinned values
// (the test above).
TEST_CASE("page descriptors: element formats, storage and state tensors change the fingerprint") {
  auto quantized = [](const char* dtype) {
    LayerGroup g = LayerGroup::full_attention("full", 2, 2, 128, 1, 16);
    g.k_format = parse_kv_cache_dtype(dtype);
    g.v_format = g.k_format;
    return KVLayout::plan({g});
  };
  const KVLayout e4m3 = quantized("fp8_e4m3"), e5m2 = quantized("fp8_e5m2");
  REQUIRE(e4m3.small_page_bytes(0) == e5m2.small_page_bytes(0));
  CHECK(layout_fingerprint(e4m3) != layout_fingerprint(e5m2));
  CHECK(layout_fingerprint(e4m3) == layout_fingerprint(quantized("fp8_e4m3")));
  const KVLayout inline_scales = quantized("fp8_e4m3_per_token_head"),
                 apart = quantized("fp8_e4m3_per_token_head:separate");
  REQUIRE(inline_scales.small_page_bytes(0) == apart.small_page_bytes(0));
  CHECK(layout_fingerprint(inline_scales) != layout_fingerprint(apart));
  // A plain 1-byte group against the same sizes in e4m3: the format alone differs.
  CHECK(layout_fingerprint(KVLayout::plan({LayerGroup::full_attention("full", 2, 2, 128, 1, 16)})) !=
        layout_fingerprint(e4m3));
  auto mla = [](std::optional<ElementFormat> rope) {
    return KVLayout::plan({LayerGroup::mla("mla", 2, 512, 64, parse_kv_cache_dtype("fp8_e4m3"), rope, 16)});
  };
  const KVLayout rope_e4m3 = mla(parse_kv_cache_dtype("fp8_e4m3")), rope_e5m2 = mla(parse_kv_cache_dtype("fp8_e5m2"));
  REQUIRE(rope_e4m3.small_page_bytes(0) == rope_e5m2.small_page_bytes(0));
  CHECK(layout_fingerprint(rope_e4m3) != layout_fingerprint(rope_e5m2));
  auto state = [](ElementType type) {
    return KVLayout::plan(
        {LayerGroup::full_attention("full", 2, 2, 128, 2, 16),
         LayerGroup::recurrent_state("ssm", 2, {StateTensor{"ssm", {64, 32}, ElementFormat::of(type)}})});
  };
  const KVLayout bf16 = state(ElementType::kBf16), fp16 = state(ElementType::kFp16);
  REQUIRE(bf16.small_page_bytes(1) == fp16.small_page_bytes(1));
  CHECK(layout_fingerprint(bf16) != layout_fingerprint(fp16));
}
