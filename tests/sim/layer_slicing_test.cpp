// Layer slicing (bench/sim/layer_slicing.hpp, kvmm-sim --slice-layers): the sliced layout's
// groups and page sizes by hand, its errors, and runs of the kvmm policy on a multi-turn
// trace: with memory to spare slicing changes nothing but the paging (same steps, hits and
// prefill), and under pressure no memory is ever free to one group only.
#include "sim_test_util.hpp"

#include "kvmm/error.hpp"
#include "sim/layer_slicing.hpp"
#include "sim/workload.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <sstream>

using kvmm::KVLayout;
using kvmm::LayerGroup;
using kvmm::sim::kSliceAuto;

namespace {

// Gemma-3's shape in small: 2 full-attention and 6 sliding-window layers, 32 B per token
// and layer (1 head of 8, K and V, 2 B), 4 tokens per page: full pages 256 B, window
// pages 768 B, large page 768 B (3 full pages or 1 window page).
KVLayout gemma_like() {
  return KVLayout::plan(
      {LayerGroup::full_attention("global", 2, 1, 8, 2, 4), LayerGroup::sliding_window("local", 6, 1, 8, 2, 4, 8)});
}

struct Result {
  kvmm::sim::Summary summary;
  std::vector<simtest::Row> rows;
};

Result run(const kvmm::sim::Workload& w, const KVLayout& layout, std::uint64_t memory, std::uint32_t slice,
           std::optional<bool> pack = std::nullopt, bool check = true) {
  kvmm::sim::PolicyOptions po;
  po.pack_small_pages = pack;
  po.memory_bytes = memory;
  po.max_seqs = 32;
  po.slice_layers = slice;
  auto p = kvmm::sim::make_policy("kvmm", layout, po);
  kvmm::sim::SchedulerOptions so;
  so.token_budget = 512;
  so.max_seqs = 32;
  so.check_invariants = check;  // the policy's and the manager's invariants after every step
  std::ostringstream csv;
  Result r;
  r.summary = kvmm::sim::simulate(w, layout, *p, so, &csv);
  r.rows = simtest::parse_csv(csv.str());
  return r;
}

// Bytes free to one group only, summed over the groups (every *.group_free column).
std::uint64_t group_free(const simtest::Row& row) {
  std::uint64_t n = 0;
  for (const auto& [k, v] : row)
    if (k.size() > 11 && k.compare(k.size() - 11, 11, ".group_free") == 0) n += v;
  return n;
}

kvmm::sim::Workload multi_turn(std::uint32_t n) {
  kvmm::sim::WorkloadOptions o;
  o.num_requests = n;
  o.rate = 2;
  return kvmm::sim::make_workload("multi-turn", o);
}

}  // namespace

TEST_CASE("slice_layers: equal layer counts give every group one page size", "[sim][slicing]") {
  const KVLayout plain = gemma_like();
  REQUIRE(plain.large_page_bytes() == 768);
  CHECK(kvmm::sim::auto_slice_layers(plain) == 2);  // gcd(2, 6), both 64 B per token-page layer
  const KVLayout s = kvmm::sim::slice_layers(plain, kSliceAuto);
  REQUIRE(s.num_groups() == 4);
  CHECK(s.group(0).name == "global");  // 2 layers already: left whole
  CHECK(s.group(1).name == "local.0");
  CHECK(s.group(3).name == "local.2");
  for (kvmm::GroupId g = 0; g < s.num_groups(); ++g) {
    CAPTURE(g);
    CHECK(s.group(g).num_layers == 2);
    CHECK(s.group(g).tokens_per_page == 4);
    CHECK(s.small_page_bytes(g) == 256);
    CHECK(s.small_pages_per_large_page(g) == 1);
  }
  CHECK(s.group(2).kind == kvmm::LayerKind::kSlidingWindow);
  CHECK(s.group(2).window == 8);
  CHECK(s.large_page_bytes() == 256);
  // n = 0: the layout as it is; n = 1: every layer its own group.
  CHECK(kvmm::sim::slice_layers(plain, 0).num_groups() == 2);
  CHECK(kvmm::sim::slice_layers(plain, 1).num_groups() == 8);
  CHECK(kvmm::sim::slice_layers(plain, 1).large_page_bytes() == 128);
}

TEST_CASE("slice_layers: what it leaves alone and what it refuses", "[sim][slicing][errors]") {
  // Per-layer pages of different bytes (8 and 4 B per token and layer): no equal pages, auto off.
  const KVLayout unequal = KVLayout::plan(
      {LayerGroup::full_attention("global", 2, 1, 8, 2, 4), LayerGroup::sliding_window("local", 6, 1, 4, 2, 4, 8)});
  CHECK(kvmm::sim::auto_slice_layers(unequal) == 0);
  CHECK(kvmm::sim::slice_layers(unequal, kSliceAuto).num_groups() == 2);
  // A Mamba group is never cut, nor counted for auto.
  const KVLayout hybrid =
      KVLayout::plan({LayerGroup::full_attention("attn", 4, 1, 8, 2, 4), LayerGroup::mamba_state("mamba", 6, 512, 16)});
  CHECK(!kvmm::sim::sliceable(hybrid, 1));
  CHECK(kvmm::sim::auto_slice_layers(hybrid) == 4);
  const KVLayout h2 = kvmm::sim::slice_layers(hybrid, 2);
  REQUIRE(h2.num_groups() == 3);
  CHECK(h2.group(2).name == "mamba");
  CHECK(h2.group(2).num_layers == 6);
}

TEST_CASE("slice_layers: a remainder group, and the smallest group's width", "[sim][slicing]") {
  // n = 4 of 6 local layers: local.0 of 4 layers (512 B pages), local.1 of the 2 left (256 B).
  const KVLayout plain = gemma_like();
  const KVLayout s4 = kvmm::sim::slice_layers(plain, 4);
  REQUIRE(s4.num_groups() == 3);
  CHECK(s4.group(1).name == "local.0");
  CHECK(s4.group(1).num_layers == 4);
  CHECK(s4.group(2).name == "local.1");
  CHECK(s4.group(2).num_layers == 2);
  CHECK(s4.small_page_bytes(1) == 512);
  CHECK(s4.small_page_bytes(2) == 256);
  CHECK(s4.large_page_bytes() == 512);
  // Smallest: 3 full and 8 sliding layers (gcd 1) cut at 3: local 3 + 3 + 2, every page
  // but the remainder's one full page's size.
  const KVLayout odd = KVLayout::plan(
      {LayerGroup::full_attention("global", 3, 1, 8, 2, 4), LayerGroup::sliding_window("local", 8, 1, 8, 2, 4, 8)});
  CHECK(kvmm::sim::auto_slice_layers(odd) == 1);
  CHECK(kvmm::sim::smallest_slice_layers(odd) == 3);
  const KVLayout s = kvmm::sim::slice_layers(odd, kvmm::sim::kSliceSmallest);
  REQUIRE(s.num_groups() == 4);
  CHECK(s.group(0).num_layers == 3);
  CHECK(s.group(1).num_layers == 3);
  CHECK(s.group(2).num_layers == 3);
  CHECK(s.group(3).name == "local.2");
  CHECK(s.group(3).num_layers == 2);
  CHECK(s.group(3).kind == kvmm::LayerKind::kSlidingWindow);
  CHECK(s.large_page_bytes() == 3 * 128 * 2);  // lcm of 384 and 256 B
  CHECK(s.small_pages_per_large_page(0) == 2);
  CHECK(s.small_pages_per_large_page(3) == 3);
  // Per-layer pages of different bytes: nothing to cut.
  const KVLayout unequal = KVLayout::plan(
      {LayerGroup::full_attention("global", 2, 1, 8, 2, 4), LayerGroup::sliding_window("local", 6, 1, 4, 2, 4, 8)});
  CHECK(kvmm::sim::smallest_slice_layers(unequal) == 0);
  CHECK(kvmm::sim::slice_layers(unequal, kvmm::sim::kSliceSmallest).num_groups() == 2);
}

TEST_CASE("kvmm policy with sliced layers: same hits with room, no one-group free memory under pressure",
          "[sim][slicing][kvmm]") {
  const kvmm::sim::Workload w = multi_turn(20);
  SECTION("memory to spare: only the paging differs") {
    // 10 requests: the manager's debug checks (KVMM_DEBUG_CHECKS=3) walk all memory.
    const kvmm::sim::Workload few = multi_turn(10);
    std::uint64_t prompts = 0;
    for (const auto& r : few.requests) prompts += r.prompt_len + r.output_len;
    // 64 + 192 B per token of every turn (its history counted again): room for all,
    // nothing evicted (checked). Jenga's step order: packing would evict a cached page in
    // a live large page even here.
    const std::uint64_t memory = prompts * 256 + 768 * 64;
    // No per-step invariant checks here (O(capacity) each, and the capacity is large):
    // the tight section below checks them.
    const Result plain = run(few, gemma_like(), memory, 0, false, false),
                 sliced = run(few, gemma_like(), memory, kSliceAuto, std::nullopt, false);
    CHECK(plain.summary.finished == few.requests.size());
    CHECK(plain.summary.evictions == 0);
    CHECK(sliced.summary.evictions == 0);
    CHECK(sliced.summary.steps == plain.summary.steps);
    CHECK(sliced.summary.prefill_tokens == plain.summary.prefill_tokens);
    CHECK(sliced.summary.first_hit_tokens == plain.summary.first_hit_tokens);
    CHECK(sliced.summary.hit_tokens == plain.summary.hit_tokens);
    CHECK(sliced.summary.first_hit_tokens > 0);  // the turns do share their history
  }
  SECTION("tight memory: a freed page serves any group") {
    // The longest turn needs 64 B per token in the global group and a window of 8 tokens
    // (two or three 768 B pages) in the local one: room for about three of them.
    std::uint64_t longest = 0;
    for (const auto& r : w.requests) longest = std::max<std::uint64_t>(longest, r.prompt_len + r.output_len);
    const std::uint64_t memory = (longest * 64 * 3 / 768 + 12) * 768;
    const Result plain = run(w, gemma_like(), memory, 0), sliced = run(w, gemma_like(), memory, kSliceAuto);
    CHECK(plain.summary.finished == w.requests.size());
    CHECK(sliced.summary.finished == w.requests.size());
    std::uint64_t plain_free = 0;
    for (const auto& row : plain.rows) plain_free += group_free(row);
    for (const auto& row : sliced.rows) REQUIRE(group_free(row) == 0);
    CHECK(plain_free > 0);  // the plain layout does strand memory in one group's large pages
    CHECK(sliced.summary.preemptions <= plain.summary.preemptions);
  }
}
