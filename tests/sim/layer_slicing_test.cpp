// Layer slicing in kvmm-sim (--slice-layers, the library's kvmm/spec/layer_slicing.hpp,
// whose layouts tests/spec/layer_slicing_test.cpp checks): runs of the kvmm policy on a
// multi-turn trace: with memory to spare slicing changes nothing but the paging (same steps, hits and
// prefill), and under pressure no memory is ever free to one group only.
#include "sim_test_util.hpp"

#include "kvmm/error.hpp"
#include "kvmm/spec/layer_slicing.hpp"
#include "sim/model_config.hpp"
#include "sim/workload.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <sstream>

using kvmm::kSliceAuto;
using kvmm::KVLayout;
using kvmm::LayerGroup;

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

TEST_CASE("kvmm policy: the library's slicing rule by default, --slice-layers overrides it", "[sim][slicing][kvmm]") {
  // kvmm-sim plans its models unsliced (the engines' models page the model's own groups).
  const KVLayout g3 = kvmm::sim::load_model("gemma-3-27b");
  REQUIRE(g3.num_groups() == 2);
  auto groups_of = [&](const KVLayout& l, std::uint32_t slice) {
    kvmm::sim::PolicyOptions po;
    po.memory_bytes = std::uint64_t{2} << 30;
    po.max_seqs = 8;
    if (slice != kvmm::sim::kSliceLibraryDefault) po.slice_layers = slice;
    return kvmm::sim::make_policy("kvmm", l, po)->describe();
  };
  const std::string dflt = groups_of(g3, kvmm::sim::kSliceLibraryDefault);
  CHECK(dflt == groups_of(g3, kvmm::kSliceSmallest));
  CHECK(dflt.find("local.5") != std::string::npos);
  CHECK(groups_of(g3, 0).find("local.0") == std::string::npos);
  // Ministral-8B (3 full pages per large page) stays whole by default.
  const KVLayout mi = kvmm::sim::load_model("ministral-8b");
  CHECK(groups_of(mi, kvmm::sim::kSliceLibraryDefault) == groups_of(mi, 0));
  CHECK(groups_of(mi, kvmm::kSliceSmallest) != groups_of(mi, 0));
}
