// Issue 17 item 3, exact cases: the first-admission hit rate does not count a preempted
// request re-hitting its own pages, and unified-block (vLLM v1) returns out-of-window
// blocks highest index first, so the block that just left the window is evicted first.
#include "sim_test_util.hpp"

#include "sim/block_policy.hpp"

#include <catch2/catch.hpp>

using kvmm::sim::SeqInfo;
using kvmm::sim::Workload;
using simtest::req;
using simtest::run;

TEST_CASE("first-admission hit rate: a preempted request's re-hit is not counted", "[sim][scheduler][metrics]") {
  // The trace of "preemption by recompute, by hand" (5 pages of 128 B, 4 tokens each) plus
  // C, which arrives at step 20 and shares A's first 8 tokens. B is preempted at step 1
  // with 8 computed tokens (2 full pages, cached) and re-admitted at step 5, hitting its
  // own 8 tokens. A finished at step 4; B's re-admission evicts A's tail page (its last
  // access is the oldest of the unpinned ones: freed tail first), so C still hits 8.
  Workload w{"preempt-rehit", {req(8, 5), req(8, 5), req(12, 1, 20)}};
  w.requests[0].prefix_id = w.requests[2].prefix_id = 5;
  w.requests[0].prefix_len = w.requests[2].prefix_len = 8;
  for (const std::string policy : {"kvmm", "paged-uniform", "static-split", "unified-block"}) {
    CAPTURE(policy);
    const auto r = run(w, simtest::full_layout(), policy, 5 * 128, 100);
    REQUIRE(r.summary.finished == 3);
    CHECK(r.summary.preemptions == 1);
    // Every admission: A 0/8, B 0/8, B again 8/9 (8 prompt + 1 output), C 8/12.
    CHECK(r.summary.hit_tokens == 16);
    CHECK(r.summary.lookup_tokens == 8 + 8 + 9 + 12);
    // First admissions only: A 0/8, B 0/8, C 8/12.
    CHECK(r.summary.first_hit_tokens == 8);
    CHECK(r.summary.first_lookup_tokens == 8 + 8 + 12);
    CHECK(r.summary.first_hit_rate == Approx(8.0 / 28.0));
    // Prefill computed: A 8, B 8, C 12 - 8; B's one recomputed token after its 8-token
    // re-hit is its decode.
    CHECK(r.summary.prefill_tokens == 8 + 8 + 4);
  }
  // Without caching nothing hits and the recomputation shows in the prefill count: B
  // computes 8 + 1 tokens again.
  const auto n = run(w, simtest::full_layout(), "kvmm", 5 * 128, 100, 64, 0, 1, false);
  CHECK(n.summary.first_hit_tokens == 0);
  CHECK(n.summary.hit_tokens == 0);
  CHECK(n.summary.prefill_tokens == 8 + 8 + 9 + 12);
}

TEST_CASE("first-admission hit rate: a request refused at admission counts once", "[sim][scheduler][metrics]") {
  // 3 pages: A (8 + 4, at most 11 tokens: 3 pages) runs; B (9 tokens, A's first 8) arrives
  // at step 1 and hits A's 2 pages, but its 1-token allocation needs a page and A holds
  // the third; the scheduler retries B each step until A finishes (step 3) and counts
  // only the admission that succeeds.
  Workload w{"refused", {req(8, 4), req(9, 1, 1)}};
  w.requests[0].prefix_id = w.requests[1].prefix_id = 9;
  w.requests[0].prefix_len = w.requests[1].prefix_len = 8;
  for (const std::string policy : {"kvmm", "paged-uniform", "unified-block"}) {
    CAPTURE(policy);
    const auto r = run(w, simtest::full_layout(), policy, 3 * 128, 100);
    REQUIRE(r.summary.finished == 2);
    CHECK(r.summary.steps == 5);  // B admitted at step 4
    CHECK(r.summary.first_lookup_tokens == 8 + 9);
    CHECK(r.summary.first_hit_tokens == 8);
    CHECK(r.summary.first_hit_tokens == r.summary.hit_tokens);
    CHECK(r.summary.first_lookup_tokens == r.summary.lookup_tokens);
  }
}

namespace {

// One full-attention and one sliding-window vgroup (window 8, 4 tokens per block) in one
// pool of 16 units; a sliding block is 2 units (two layers), as in unified-block.
std::unique_ptr<kvmm::sim::Policy> window_engine(kvmm::sim::block::SkipOrder order) {
  using namespace kvmm::sim::block;
  const kvmm::KVLayout layout = simtest::hybrid_layout();
  VGroup full, win;
  full.name = "full";
  full.kind = VKind::kFull;
  full.tpb = 4;
  full.units = 1;
  full.covers = {0};
  win.name = "sliding";
  win.kind = VKind::kWindow;
  win.tpb = 4;
  win.window = 8;
  win.units = 2;
  win.covers = {1};
  Pool pool;
  pool.name = "unified";
  pool.unit_bytes = 128;
  pool.capacity = pool.free = 16;
  return make_engine("window", layout, {full, win}, {pool}, true, "test engine", order);
}

// Runs A (20-token prompt of stream 3, one decode step), then B (own stream, 4 tokens),
// whose allocation evicts exactly one sliding block; returns the hit of a request whose
// 13-token prompt is stream 3's.
std::uint32_t hit_after_one_eviction(kvmm::sim::block::SkipOrder order) {
  auto e = window_engine(order);
  SeqInfo a{0, 0, 3, 20, nullptr, nullptr};
  e->add_request(0, a);
  REQUIRE(e->lookup_prefix(0, 19) == 0);
  REQUIRE(e->allocate(0, 0, 20));  // full blocks 0-4 (5 units), sliding 0-4 (10 units)
  e->commit(0, 20);
  // Position 20 reads tokens 13..20: sliding blocks 0-2 leave the window before the
  // allocation of block 5 in each group (1 + 2 units; 16 - 15 + 6 free after the release).
  REQUIRE(e->allocate(0, 20, 1));
  e->commit(0, 21);
  e->free(0);  // LRU: sliding 0-2 (in skip order), then full 4..0, sliding 4..3
  e->check_invariants();
  SeqInfo b{1, 0, 0, 0, nullptr, nullptr};
  e->add_request(1, b);
  REQUIRE(e->lookup_prefix(1, 3) == 0);
  // 1 unit free: the full block fits, the sliding block evicts the LRU head (2 units).
  REQUIRE(e->allocate(1, 0, 4));
  e->check_invariants();
  kvmm::sim::MemoryStats st;
  e->stats(st);
  CHECK(st.evictions == 1);
  SeqInfo d{2, 0, 3, 20, nullptr, nullptr};
  e->add_request(2, d);
  return e->lookup_prefix(2, 12);
}

}  // namespace

TEST_CASE("unified-block: out-of-window blocks go back highest index first", "[sim][unified][prefix]") {
  using kvmm::sim::block::SkipOrder;
  // A hit at 12 needs full blocks 0-2 and sliding blocks 1-2 (position 12 reads 5..12);
  // a hit at 8 needs sliding blocks 0-1. vLLM v1's order puts sliding block 2 at the LRU
  // head, so the eviction takes it and the hit falls to 8; the ascending order loses
  // block 0 and keeps the hit at 12.
  CHECK(hit_after_one_eviction(SkipOrder::kHighFirst) == 8);
  CHECK(hit_after_one_eviction(SkipOrder::kLowFirst) == 12);
  // The unified-block preset uses vLLM v1's order: the same trace through the scheduler.
  // A (20 + 2) then B (4 + 1, own stream) then D (13 + 1, stream 3), one at a time; the
  // pool of 16 x 128 B holds what the engine above holds.
  Workload w{"skip-order", {req(20, 2), req(4, 1, 10), req(13, 1, 20)}};
  w.requests[0].prefix_id = w.requests[2].prefix_id = 3;
  w.requests[0].prefix_len = w.requests[2].prefix_len = 20;
  const auto r = run(w, simtest::hybrid_layout(), "unified-block", 16 * 128);
  REQUIRE(r.summary.finished == 3);
  CHECK(r.summary.evictions >= 1);
  CHECK(r.summary.first_hit_tokens == 8);
}

TEST_CASE("multi-turn: the next turn hits the previous turn's answer too", "[sim][kvmm][prefix]") {
  // Turn 0: 10 prompt + 9 answer tokens of stream 1 (18 computed: pages 0-3 full).
  // Turn 1 (its history and 3 new tokens) looks up at most 21 tokens -> 16.
  // Two turns of one session: the first (prompt p0, answer a0), the second (p1, a1).
  auto two_turns = [](std::uint32_t p0, std::uint32_t a0, std::uint32_t p1, std::uint32_t a1, std::uint64_t memory,
                      std::uint64_t hit) {
    Workload w{"two-turns", {req(p0, a0), req(p1, a1)}};
    w.requests[0].prefix_id = w.requests[1].prefix_id = 1;
    w.requests[0].prefix_len = p0 + a0;
    w.requests[1].prefix_len = p1 + a1;
    w.requests[1].parent = 0;
    w.requests[1].delay = 1;
    for (const std::string policy : {"kvmm", "paged-uniform", "unified-block"}) {
      CAPTURE(policy, p0);
      const auto r = run(w, simtest::full_layout(), policy, memory);
      CHECK(r.summary.first_hit_tokens == hit);
    }
  };
  two_turns(10, 9, 22, 1, 64 * 128, 16);
  two_turns(100, 100, 250, 10, 1024 * 128, 196);
}
