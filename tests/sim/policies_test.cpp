// Hand-worked traces per policy: every number below is derived in the comments from the
// tiny layouts in sim_test_util.hpp (4 tokens per page, 32 B per token per layer).
// "Needed" after a step with T computed tokens covers positions 0..T: the next step
// reads 0..T-1 and writes T (window groups: the last min(T + 1, w) = w positions).
#include "sim_test_util.hpp"

#include "kvmm/error.hpp"
#include "sim/workload.hpp"

#include <catch2/catch.hpp>

using kvmm::sim::Workload;
using simtest::req;
using simtest::run;

namespace {
Workload one_request() { return Workload{"one", {req(10, 3)}}; }
}  // namespace

TEST_CASE("kvmm policy: one request on a full + sliding-window model, by hand", "[sim][kvmm]") {
  // 16 large pages of 256 B. full: 128 B pages, 2 per large page; sliding (2 layers,
  // window 8): 256 B pages, 1 per large page.
  for (const bool caching : {true, false}) {
    CAPTURE(caching);
    // Jenga's rule (--boundaries none): no prompt-tail retention in the accounting below.
    const auto r = run(one_request(), simtest::hybrid_layout(), "kvmm", 16 * 256, 8192, 64, 0, 1, caching,
                       kvmm::sim::BoundaryMode::kNone);
    REQUIRE(r.rows.size() == 3);
    const auto& s0 = r.rows[0];
    // Step 0: prefill 10 tokens. full: 3 pages (384 B) for 11 * 32 = 352 B -> 32 wasted;
    // its 2 large pages keep 1 free small page (128 B). sliding: 3 pages (768 B), the
    // window needs 8 * 64 = 512 B -> 256 wasted. Free: 16 - 2 - 3 = 11 large pages.
    CHECK(s0.at("prefill_tokens") == 10);
    CHECK(s0.at("full.used") == 352);
    CHECK(s0.at("full.wasted") == 32);
    CHECK(s0.at("full.group_free") == 128);
    CHECK(s0.at("sliding.used") == 512);
    CHECK(s0.at("sliding.wasted") == 256);
    CHECK(s0.at("sliding.cached") == 0);
    CHECK(s0.at("free") == 11 * 256);
    CHECK(s0.at("capacity") == 16 * 256);
    // Step 1: decode, 11 tokens. Position 11 reads from token 4 on, so sliding page 0
    // (tokens 0-3) is released at commit: 2 pages, 512 B, all needed. With caching page
    // 0 is full and hashed, so it stays as an evictable page (its large page is not
    // free); without, its large page goes back.
    const auto& s1 = r.rows[1];
    CHECK(s1.at("decode_tokens") == 1);
    CHECK(s1.at("full.used") == 384);
    CHECK(s1.at("full.wasted") == 0);
    CHECK(s1.at("sliding.used") == 512);
    CHECK(s1.at("sliding.wasted") == 0);
    CHECK(s1.at("sliding.cached") == (caching ? 256 : 0));
    CHECK(s1.at("free") == (caching ? 11 : 12) * 256);
    // Step 2: the third output token finishes the request (12 tokens computed). With
    // caching, the 3 full pages of each group stay cached: full 384 B in 2 large pages,
    // sliding 768 B in 3; without, everything is free.
    CHECK(r.rows[2].at("finished") == 1);
    CHECK(r.rows[2].at("full.used") == 0);
    CHECK(r.rows[2].at("full.cached") == (caching ? 384 : 0));
    CHECK(r.rows[2].at("sliding.cached") == (caching ? 768 : 0));
    CHECK(r.rows[2].at("free") == (caching ? 11 : 16) * 256);
    CHECK(r.summary.output_tokens == 3);
    CHECK(r.summary.prefill_tokens == 10);
    CHECK(r.summary.decode_tokens == 2);
    CHECK(r.summary.prefix_hit_rate == 0);
  }
}

TEST_CASE("kvmm policy: shared-prefix hit with a sliding-window group, by hand", "[sim][kvmm][prefix]") {
  Workload w{"window-hit", {req(20, 1), req(24, 2, 10)}};
  w.requests[0].prefix_id = w.requests[1].prefix_id = 3;
  w.requests[0].prefix_len = w.requests[1].prefix_len = 20;
  // A computes 20 tokens (step 0). Its commit releases sliding pages 0-2 (position 20
  // reads 13..19, first needed page (21 - 8) / 4 = 3): full pages, so they turn
  // evictable; at A's finish every page (5 per group, all full) is evictable.
  // Jenga's rule (--boundaries none): A's out-of-window pages are not held for its tail.
  const auto r = run(w, simtest::hybrid_layout(), "kvmm", 8192, 8192, 64, 0, 1, true, kvmm::sim::BoundaryMode::kNone);
  REQUIRE(r.rows.size() == 3);
  CHECK(r.rows[0].at("full.cached") == 5 * 128);
  CHECK(r.rows[0].at("sliding.cached") == 5 * 256);
  CHECK(r.rows[0].at("full.used") == 0);
  // B looks up at most 23 tokens -> 20 (page aligned, pages 0-4 of the shared stream).
  // full needs pages 0-4; sliding needs only the window of position 20: pages 3-4.
  CHECK(r.summary.hit_tokens == 20);
  CHECK(r.summary.lookup_tokens == 20 + 24);
  CHECK(r.summary.prefill_tokens == 20 + 4);
  // Step 10 (row 1): B computed 24 (tokens 20-23 into new page 5). full: pages 0-5 =
  // 768 B, all needed (24 tokens + position 24 has no page yet); nothing cached. sliding:
  // commit(24) releases page 3 (first needed (25 - 8) / 4 = 4): B holds pages 4-5 =
  // 512 B = the 8-token window; pages 0-2 (never pinned) and 3 are evictable: 1024 B.
  const auto& s1 = r.rows[1];
  CHECK(s1.at("full.used") == 768);
  CHECK(s1.at("full.wasted") == 0);
  CHECK(s1.at("full.cached") == 0);
  CHECK(s1.at("sliding.used") == 512);
  CHECK(s1.at("sliding.wasted") == 0);
  CHECK(s1.at("sliding.cached") == 4 * 256);
  CHECK(r.summary.evictions == 0);
  // Without caching B recomputes its 24 tokens.
  const auto n = run(w, simtest::hybrid_layout(), "kvmm", 8192, 8192, 64, 0, 1, false);
  CHECK(n.summary.hit_tokens == 0);
  CHECK(n.summary.prefill_tokens == 20 + 24);
  CHECK(n.rows[0].at("sliding.cached") == 0);
}

TEST_CASE("kvmm policy: a cross-attention image inside the shared prefix is reused", "[sim][kvmm][prefix]") {
  // self: 1 layer over text; cross: 1 layer over 8 image tokens; 128 B pages (4 tokens).
  const auto layout = kvmm::KVLayout::plan({kvmm::LayerGroup::full_attention("self", 1, 1, 8, 2, 4),
                                            kvmm::LayerGroup::cross_attention("cross", 1, 1, 8, 2, 4)});
  Workload w{"image-hit", {req(5, 1), req(5, 2, 5), req(5, 1, 10)}};
  for (auto& r : w.requests) r.images.push_back({0, 8});
  w.requests[0].prefix_id = w.requests[1].prefix_id = 9;  // A and B: same text and image
  w.requests[0].prefix_len = w.requests[1].prefix_len = 5;
  // A computes 5 text tokens: self page 0 (tokens 0-3) is full and cached; its image's 2
  // cross pages are cached by image hash. At A's finish: self 128 B, cross 256 B cached.
  const auto r = run(w, layout, "kvmm", 4096, 8192, 64, 0, 8);
  REQUIRE(r.rows.size() == 4);
  CHECK(r.rows[0].at("self.cached") == 128);
  CHECK(r.rows[0].at("cross.cached") == 256);
  // B looks up at most 4 tokens: self page 0 hits, and the image starting at 0 needs
  // both its cross pages, cached: hit 4. While B runs (row 1) it holds A's pages: no
  // cross page is left evictable (fresh pages would have left A's 256 B cached).
  CHECK(r.rows[1].at("cross.used") == 256);
  CHECK(r.rows[1].at("cross.cached") == 0);
  CHECK(r.rows[1].at("self.cached") == 0);
  CHECK(r.rows[2].at("cross.cached") == 256);
  // C (no shared prefix, its own image) misses both: 5 tokens and 2 new cross pages,
  // cached next to the first image's at its finish.
  CHECK(r.rows[3].at("cross.cached") == 512);
  CHECK(r.summary.hit_tokens == 4);
  CHECK(r.summary.prefill_tokens == 5 + 1 + 5);
}

TEST_CASE("paged-uniform: every layer keeps every token, blocks cached after finish", "[sim][uniform]") {
  // One block = 4 tokens x 3 layers x 32 B = 384 B; 4096 B hold 10 blocks (3840 B).
  const auto r = run(one_request(), simtest::hybrid_layout(), "paged-uniform", 4096);
  REQUIRE(r.rows.size() == 3);
  // Step 0: 3 blocks = 1152 B; needed: full 11 * 32 + sliding 8 * 64 = 864.
  CHECK(r.rows[0].at("uniform.used") == 864);
  CHECK(r.rows[0].at("uniform.wasted") == 288);
  CHECK(r.rows[0].at("free") == 7 * 384);
  CHECK(r.rows[0].at("capacity") == 3840);
  // Step 1: 11 tokens: needed 12 * 32 + 512.
  CHECK(r.rows[1].at("uniform.used") == 896);
  CHECK(r.rows[1].at("uniform.wasted") == 256);
  // Step 2: finished; 12 computed tokens = 3 full blocks stay cached (evictable).
  CHECK(r.rows[2].at("uniform.used") == 0);
  CHECK(r.rows[2].at("uniform.cached") == 1152);
  CHECK(r.rows[2].at("free") == 7 * 384);
}

TEST_CASE("paged-uniform: a later request hits the shared prefix", "[sim][uniform][prefix]") {
  Workload w{"prefix", {req(10, 1), req(12, 1, 5)}};
  w.requests[0].prefix_id = w.requests[1].prefix_id = 7;
  w.requests[0].prefix_len = w.requests[1].prefix_len = 8;
  // A computes 10 tokens: blocks 0 and 1 are full and inside the prefix. B (arrives at
  // step 5, when nothing runs) looks up at most 11 tokens and finds those 2 blocks: 8.
  const auto r = run(w, simtest::hybrid_layout(), "paged-uniform", 4096);
  CHECK(r.summary.steps == 2);
  CHECK(r.summary.hit_tokens == 8);
  CHECK(r.summary.lookup_tokens == 22);
  CHECK(r.summary.prefill_tokens == 10 + 4);
  // kvmm hits the same 8 tokens (full pages 0-1; sliding: position 8's window 1..8
  // needs pages 0-1 too); with caching off it recomputes everything.
  const auto k = run(w, simtest::hybrid_layout(), "kvmm", 4096);
  CHECK(k.summary.hit_tokens == 8);
  CHECK(k.summary.prefill_tokens == 10 + 4);
  const auto n = run(w, simtest::hybrid_layout(), "kvmm", 4096, 8192, 64, 0, 1, false);
  CHECK(n.summary.hit_tokens == 0);
  CHECK(n.summary.prefill_tokens == 22);
}

TEST_CASE("token-id traces: blocks hit by content, chained from the start", "[sim][uniform][prefix]") {
  // A: tokens 1..12. B shares A's first 8 tokens, then differs. C has A's tokens 5..8
  // at positions 0..3: the same block content but another prefix, so no hit.
  const auto w = kvmm::sim::parse_trace(
      "{\"prompt_tokens\": [1,2,3,4,5,6,7,8,9,10,11,12], \"output_len\": 1}\n"
      "{\"arrival\": 5, \"prompt_tokens\": [1,2,3,4,5,6,7,8,20,21,22,23,24], \"output_len\": 1}\n"
      "{\"arrival\": 9, \"prompt_tokens\": [5,6,7,8,1,2,3,4,9], \"output_len\": 1}\n",
      "t.jsonl");
  const auto r = run(w, simtest::hybrid_layout(), "paged-uniform", 8192);
  CHECK(r.summary.hit_tokens == 8);
  CHECK(r.summary.lookup_tokens == 12 + 13 + 9);
  CHECK(r.summary.finished == 3);
}

TEST_CASE("max-page: every page padded to the largest group's page", "[sim][max-page]") {
  // Page 256 B (the sliding group's); 16 pages.
  const auto r = run(one_request(), simtest::hybrid_layout(), "max-page", 4096);
  REQUIRE(r.rows.size() == 3);
  // Step 0: full 3 pages x 256 = 768 for 352 -> 416 wasted; sliding 768 for 512.
  CHECK(r.rows[0].at("full.used") == 352);
  CHECK(r.rows[0].at("full.wasted") == 416);
  CHECK(r.rows[0].at("sliding.used") == 512);
  CHECK(r.rows[0].at("sliding.wasted") == 256);
  CHECK(r.rows[0].at("free") == 10 * 256);
  // Step 1: out-of-window pages are freed only when the next allocation runs (before
  // position 10: none), so sliding still holds 3 pages.
  CHECK(r.rows[1].at("full.wasted") == 384);
  CHECK(r.rows[1].at("sliding.wasted") == 256);
  CHECK(r.rows[2].at("free") == 16 * 256);
  CHECK(r.rows[2].at("full.cached") == 0);  // no prefix caching
}

TEST_CASE("static-split: fixed pools sized for a max-length request", "[sim][static-split]") {
  // max_model_len 13: demand full 32 * 13 = 416, sliding 64 * min(13, 8) = 512, of 928.
  // 9280 B -> full 4160 B = 32 pages of 128 B, sliding 5120 B = 20 pages of 256 B.
  const auto r = run(one_request(), simtest::hybrid_layout(), "static-split", 9280);
  REQUIRE(r.rows.size() == 3);
  CHECK(r.rows[0].at("capacity") == 32 * 128 + 20 * 256);
  CHECK(r.rows[0].at("free") == 0);
  CHECK(r.rows[0].at("full.used") == 352);
  CHECK(r.rows[0].at("full.group_free") == 29 * 128);
  CHECK(r.rows[0].at("sliding.group_free") == 17 * 256);
  // Step 2: the allocation for position 11 frees sliding block 0 (cached, so it turns
  // evictable); after the finish all 3 blocks of each group are evictable.
  CHECK(r.rows[2].at("full.cached") == 3 * 128);
  CHECK(r.rows[2].at("sliding.cached") == 3 * 256);
  CHECK(r.rows[2].at("full.group_free") == 29 * 128);
}

TEST_CASE("unified-block: same block bytes per layer, lazy window freeing", "[sim][unified]") {
  // Per-layer block 4 x 32 = 128 B; full blocks 1 unit, sliding blocks 2 units (layers).
  const auto r = run(one_request(), simtest::hybrid_layout(), "unified-block", 4096);
  REQUIRE(r.rows.size() == 3);
  CHECK(r.rows[0].at("full.wasted") == 32);
  CHECK(r.rows[0].at("sliding.wasted") == 256);
  CHECK(r.rows[0].at("free") == (32 - 3 - 6) * 128);
  // Step 1: unlike kvmm the window's first block is still held (freed at the next
  // allocation), so 256 B stay wasted.
  CHECK(r.rows[1].at("sliding.used") == 512);
  CHECK(r.rows[1].at("sliding.wasted") == 256);
  CHECK(r.rows[2].at("full.cached") == 3 * 128);
  CHECK(r.rows[2].at("sliding.cached") == 3 * 256);
}

TEST_CASE("unified-block: sliding-window hit pins only the window's blocks", "[sim][unified][prefix]") {
  Workload w{"window-hit", {req(20, 1), req(24, 2, 10)}};
  w.requests[0].prefix_id = w.requests[1].prefix_id = 3;
  w.requests[0].prefix_len = w.requests[1].prefix_len = 20;
  // A caches blocks 0-4 of both groups. B may hit at most 23 -> 20 tokens: full needs
  // blocks 0-4; position 20 reads tokens 13.. so sliding needs blocks 3-4 only.
  const auto r = run(w, simtest::hybrid_layout(), "unified-block", 8192);
  CHECK(r.summary.hit_tokens == 20);
  REQUIRE(r.rows.size() == 3);
  // While B runs (after its first step), sliding blocks 0-2 stay evictable, unpinned.
  CHECK(r.rows[1].at("sliding.cached") == 3 * 256);
  CHECK(r.rows[1].at("full.cached") == 0);
}

TEST_CASE("unified-block: Mamba state pages padded to an enlarged attention block", "[sim][unified]") {
  // Attention: 32 B per token-layer, 128 B per 4-token block; state: 300 B per layer.
  // Block = ceil(300 / 128) * 128 = 384 B -> attention blocks hold 12 tokens.
  const auto layout = kvmm::KVLayout::plan({kvmm::LayerGroup::full_attention("attention", 1, 1, 8, 2, 4),
                                            kvmm::LayerGroup::mamba_state("mamba", 1, 300, 4)});
  const auto r = run(one_request(), layout, "unified-block", 3840);
  REQUIRE(r.rows.size() == 3);
  CHECK(r.rows[0].at("attention.used") == 352);
  CHECK(r.rows[0].at("attention.wasted") == 32);
  CHECK(r.rows[0].at("mamba.used") == 300);
  CHECK(r.rows[0].at("mamba.wasted") == 84);
  CHECK(r.rows[0].at("free") == 8 * 384);
  CHECK(r.rows[1].at("attention.wasted") == 0);
  CHECK(r.rows[2].at("free") == 3840);
  CHECK(r.rows[2].at("attention.cached") == 0);  // no prefix caching with Mamba
}

TEST_CASE("cross-attention: paged-uniform keeps (T + I) tokens in every layer", "[sim][uniform][kvmm]") {
  // self: 1 layer over text; cross: 1 layer over 8 image tokens (Jenga 3.2 in small).
  const auto layout = kvmm::KVLayout::plan({kvmm::LayerGroup::full_attention("self", 1, 1, 8, 2, 4),
                                            kvmm::LayerGroup::cross_attention("cross", 1, 1, 8, 2, 4)});
  Workload w{"vision", {req(5, 2)}};
  w.requests[0].images.push_back({0, 8});
  // paged-uniform: block 4 x 2 layers x 32 = 256 B. Decoder table: 5 tokens, 2 blocks
  // (512 B) of which self needs 6 * 32; cross table: 8 tokens, 2 blocks, cross needs 256.
  const auto u = run(w, layout, "paged-uniform", 4096, 8192, 64, 0, 8);
  CHECK(u.rows[0].at("uniform.used") == 192);
  CHECK(u.rows[0].at("uniform.wasted") == 320);
  CHECK(u.rows[0].at("uniform-cross.used") == 256);
  CHECK(u.rows[0].at("uniform-cross.wasted") == 256);
  // kvmm: self 2 pages (256 B) for 192; cross 2 pages, all needed.
  const auto k = run(w, layout, "kvmm", 4096, 8192, 64, 0, 8);
  CHECK(k.rows[0].at("self.used") == 192);
  CHECK(k.rows[0].at("self.wasted") == 64);
  CHECK(k.rows[0].at("cross.used") == 256);
  CHECK(k.rows[0].at("cross.wasted") == 0);
}

TEST_CASE("preemption by recompute, by hand", "[sim][scheduler]") {
  // 5 pages of 128 B; two requests of 8 prompt + 5 output tokens need 3 pages each at
  // the end. Step 1: A grows to 3 pages, B cannot and (being newest) is preempted; it
  // waits until A finishes at step 4, then recomputes 9 tokens (8 + its first output).
  Workload w{"preempt", {req(8, 5), req(8, 5)}};
  const auto k = run(w, simtest::full_layout(), "kvmm", 5 * 128, 100, 64, 0, 1, false);
  CHECK(k.summary.steps == 9);
  CHECK(k.summary.preemptions == 1);
  CHECK(k.summary.finished == 2);
  CHECK(k.summary.output_tokens == 10);
  CHECK(k.summary.prefill_tokens == 8 + 8 + 9);
  CHECK(k.summary.decode_tokens == 4 + 3);
  // paged-uniform caches B's two full blocks when it is preempted: at step 5 B hits 8
  // tokens, evicts one of A's cached blocks (LRU head) and computes 1 token.
  const auto u = run(w, simtest::full_layout(), "paged-uniform", 5 * 128, 100);
  CHECK(u.summary.steps == 9);
  CHECK(u.summary.preemptions == 1);
  CHECK(u.summary.hit_tokens == 8);
  CHECK(u.summary.evictions == 1);
  CHECK(u.summary.prefill_tokens == 16);
  CHECK(u.summary.decode_tokens == 8);
  // kvmm with caching: the same. B's pages 0-1 turn evictable at the preemption; at steps
  // 2-4 B's lookup pins them but its 1-token allocation finds no page (A holds 3, B's 2
  // pinned) and B waits; at step 5 it hits 8 and evicts one of A's cached pages.
  const auto c = run(w, simtest::full_layout(), "kvmm", 5 * 128, 100);
  CHECK(c.summary.steps == 9);
  CHECK(c.summary.preemptions == 1);
  CHECK(c.summary.hit_tokens == 8);
  CHECK(c.summary.evictions == 1);
  CHECK(c.summary.prefill_tokens == 16);
  CHECK(c.summary.decode_tokens == 8);
}

TEST_CASE("a request that cannot fit even alone is aborted, others still finish", "[sim][scheduler]") {
  Workload w{"too-long", {req(40, 1), req(4, 2)}};
  for (const auto& p : kvmm::sim::policy_names()) {
    const auto r = run(w, simtest::full_layout(), p, 8 * 128, 100, 64, 41);
    INFO(p);
    CHECK(r.summary.aborted == 1);
    CHECK(r.summary.finished == 1);
  }
}

TEST_CASE("follow-ups of an aborted request are aborted too", "[sim][scheduler]") {
  // Request 0 cannot fit; 1 follows 0, 2 follows 1; 3 is independent and finishes.
  Workload w{"chain", {req(40, 1), req(4, 1), req(4, 1), req(4, 2)}};
  w.requests[1].parent = 0;
  w.requests[2].parent = 1;
  for (const auto& p : kvmm::sim::policy_names()) {
    INFO(p);
    const auto r = run(w, simtest::full_layout(), p, 8 * 128, 100, 64, 41);
    CHECK(r.summary.aborted == 3);
    CHECK(r.summary.finished == 1);
  }
}

TEST_CASE("policy factory and scheduler reject bad arguments", "[sim][errors]") {
  kvmm::sim::PolicyOptions po;
  po.memory_bytes = 100;
  try {
    kvmm::sim::make_policy("vllm", simtest::full_layout(), po);
    FAIL("no error");
  } catch (const kvmm::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("policy = 'vllm'"));
  }
  CHECK_THROWS_WITH(kvmm::sim::make_policy("kvmm", simtest::full_layout(), po), Catch::Contains("memory_bytes = 100"));
  CHECK_THROWS_WITH(kvmm::sim::make_policy("max-page", simtest::full_layout(), po), Catch::Contains("memory_bytes"));
  po.memory_bytes = 4096;
  auto p = kvmm::sim::make_policy("kvmm", simtest::full_layout(), po);
  CHECK_THROWS_WITH(p->allocate(3, 0, 1), Catch::Contains("request = 3"));
  kvmm::sim::SchedulerOptions so;
  so.token_budget = 0;
  CHECK_THROWS_WITH(kvmm::sim::simulate(Workload{"x", {req(4, 1)}}, simtest::full_layout(), *p, so, nullptr),
                    Catch::Contains("token_budget = 0"));
}
