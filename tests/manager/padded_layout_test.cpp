// A padded layout (issue 32): when the LCM of the small pages passes
// LayoutOptions::max_large_page_bytes and tokens_per_page fitting is off (or finds no
// size), the planner pads each small page at its tail to a divisor of a smaller large
// page. What kvmm does then, checked on Qwen3-Next-80B-A3B (LCM 75.4 MiB over the default
// 64 MiB): every byte a kernel reads lies in the natural page, pages are addressed at the
// padded size, and the manager counts the padding as waste. By default the planner fits
// 8-token attention pages instead: the manager serves that layout with no waste.
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/spec/presets.hpp"

#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

using namespace kvmm;

TEST_CASE("padded layout: Qwen3-Next's LCM over the large-page limit pads 1-2% at each page's tail",
          "[manager][padding][lineup]") {
  const KVLayout l = presets::qwen3_next_80b_a3b({.layout = {.fit_tokens_per_page = false}});
  const std::uint64_t natural_lcm = std::lcm(l.natural_page_bytes(0), l.natural_page_bytes(1));
  REQUIRE(l.natural_lcm_bytes() == natural_lcm);
  REQUIRE(natural_lcm > LayoutOptions{}.max_large_page_bytes);  // 79,036,416 B
  REQUIRE(l.padded());
  CHECK(l.large_page_bytes() <= LayoutOptions{}.max_large_page_bytes);
  for (GroupId g = 0; g < 2; ++g) {
    INFO(l.group(g).name);
    const std::uint64_t small = l.small_page_bytes(g), natural = l.natural_page_bytes(g);
    CHECK(small > natural);
    CHECK(small % LayoutOptions{}.padded_page_alignment == 0);
    CHECK(l.large_page_bytes() % small == 0);
    CHECK(l.small_pages_per_large_page(g) == l.large_page_bytes() / small);
    CHECK(l.padding_fraction(g) == Approx(static_cast<double>(small - natural) / static_cast<double>(small)));
    CHECK(l.padding_fraction(g) > 0.01);
    CHECK(l.padding_fraction(g) < 0.021);
  }
  // The padding is each page's tail: the last layer's K and V, and the last layer's last
  // state tensor, end inside the natural page (offsets do not move with the padding).
  const std::uint32_t last_attention = l.group(0).num_layers - 1, last_state = l.group(1).num_layers - 1;
  const auto v = l.part(0, last_attention, KvPart::kV);
  CHECK(v.offset + v.bytes == l.natural_page_bytes(0));
  CHECK(l.k_offset(0, last_attention) + l.group(0).head_bytes_per_token() * l.group(0).tokens_per_page <= v.offset);
  const auto& tensors = l.group(1).state_tensors;
  REQUIRE(tensors.size() == 2);
  CHECK(l.state_tensor_offset(1, last_state, 1) + tensors[1].bytes() == l.natural_page_bytes(1));

  // Raising the limit to the LCM plans it unpadded: the trade is a larger large page.
  const KVLayout raised =
      presets::qwen3_next_80b_a3b({.layout = {.max_large_page_bytes = natural_lcm, .fit_tokens_per_page = false}});
  CHECK_FALSE(raised.padded());
  CHECK(raised.large_page_bytes() == natural_lcm);
  CHECK(raised.small_page_bytes(0) == l.natural_page_bytes(0));
  CHECK(raised.small_page_bytes(1) == l.natural_page_bytes(1));

  // The manager serves the padded sizes and counts the padding as waste: one request of
  // 32 computed tokens holds two full attention pages and one state page.
  KVCacheManager kv(l, {.num_large_pages = 4, .max_requests = 2});
  std::vector<std::uint32_t> tokens(32);
  std::iota(tokens.begin(), tokens.end(), 7u);
  const RequestId r = kv.add_request(tokens);
  CHECK(kv.lookup_prefix(r) == 0);
  REQUIRE(kv.allocate(r, 32));
  kv.commit(r, 32);
  kv.check_invariants();
  REQUIRE(kv.page_table(r, 0).size() == 2);
  const std::uint64_t state_pages = kv.page_table(r, 1).size();
  REQUIRE(state_pages >= 1);
  const CacheStats s = kv.stats();
  const std::uint64_t pad0 = l.small_page_bytes(0) - l.natural_page_bytes(0);
  const std::uint64_t pad1 = l.small_page_bytes(1) - l.natural_page_bytes(1);
  CHECK(s.groups[0].allocated_bytes == 2 * l.small_page_bytes(0));
  CHECK(s.groups[0].needed_bytes == 32 * l.group(0).bytes_per_token());
  CHECK(s.groups[0].waste_bytes == 2 * pad0);
  CHECK(s.groups[1].allocated_bytes == state_pages * l.small_page_bytes(1));
  CHECK(s.groups[1].waste_bytes == state_pages * pad1);
  // Pages of one large page never overlap: page p of group g spans
  // [p x small_page_bytes(g), (p + 1) x small_page_bytes(g)) of the arena.
  const auto rows = kv.page_table(r, 0);
  CHECK(rows[0] != rows[1]);
  kv.free(r);
  kv.check_invariants();
}

TEST_CASE("padded layout: DeepSeek-V3.2 in fp8_ds_mla at 64 tokens per page", "[manager][padding][lineup]") {
  // Latent pages of 64 x 61 x 656 B and indexer pages of 64 x 61 x 132 B: their LCM (81 MiB)
  // passes 64 MiB; the planner pads the latent page by 0.61% (one per 2.46 MiB large page,
  // five indexer pages beside it), and the manager serves the layout.
  const KVLayout l = presets::deepseek_v3_2(
      {.tokens_per_page = 64, .layout = {.fit_tokens_per_page = false}, .kv_cache_dtype = "fp8_ds_mla"});
  REQUIRE(l.natural_page_bytes(0) == std::uint64_t{64} * 61 * 656);
  REQUIRE(l.natural_page_bytes(1) == std::uint64_t{64} * 61 * 132);
  CHECK(l.natural_lcm_bytes() > LayoutOptions{}.max_large_page_bytes);
  CHECK(l.padded());
  CHECK(l.padding_fraction() < 0.02);
  KVCacheManager kv(l, {.num_large_pages = 5, .max_requests = 2});  // 3 latent + 1 indexer needed
  const RequestId r = kv.add_request(std::vector<std::uint32_t>(130, 5u));
  REQUIRE(kv.allocate(r, 130));
  kv.commit(r, 130);
  kv.check_invariants();
  const CacheStats s = kv.stats();
  for (GroupId g = 0; g < 2; ++g) {
    INFO(l.group(g).name);
    CHECK(kv.page_table(r, g).size() == 3);
    // Waste: the padding of 3 pages and the 62 empty token slots of the last one.
    CHECK(s.groups[g].waste_bytes ==
          3 * (l.small_page_bytes(g) - l.natural_page_bytes(g)) + (3 * 64 - 130) * l.group(g).bytes_per_token());
  }
}

TEST_CASE("fitted layout: Qwen3-Next at the default limit serves 8-token pages with no padding waste",
          "[manager][padding][lineup]") {
  // The default plan (fit_tokens_per_page): 201 attention pages of 8 tokens or one state
  // page per 37.7 MiB large page. 37 computed tokens take 5 attention pages (3 slots of the
  // last empty) and one state page; the only waste is those 3 slots.
  const KVLayout l = presets::qwen3_next_80b_a3b();
  REQUIRE(l.group(0).tokens_per_page == 8);
  REQUIRE_FALSE(l.padded());
  KVCacheManager kv(l, {.num_large_pages = 3, .max_requests = 2});
  std::vector<std::uint32_t> tokens(37);
  std::iota(tokens.begin(), tokens.end(), 3u);
  const RequestId r = kv.add_request(tokens);
  REQUIRE(kv.allocate(r, 37));
  kv.commit(r, 37);
  kv.check_invariants();
  CHECK(kv.page_table(r, 0).size() == 5);
  const std::uint64_t state_pages = kv.page_table(r, 1).size();
  REQUIRE(state_pages >= 1);
  const CacheStats s = kv.stats();
  CHECK(s.groups[0].allocated_bytes == 5 * std::uint64_t{196608});
  CHECK(s.groups[0].waste_bytes == 3 * l.group(0).bytes_per_token());
  CHECK(s.groups[1].allocated_bytes == state_pages * std::uint64_t{39518208});
  CHECK(s.groups[1].waste_bytes == 0);
  // The five attention pages share one large page; the state page has its own.
  const auto rows = kv.page_table(r, 0);
  for (std::size_t i = 1; i < rows.size(); ++i)
    CHECK(kv.small_pages(0).large_page_of(rows[i]) == kv.small_pages(0).large_page_of(rows[0]));
  kv.free(r);
  kv.check_invariants();
}
