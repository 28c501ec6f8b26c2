// Worked examples of each rule of vllm-0.33 (bench/sim/block_engines.cpp, docs/sim.md):
// sparse retention at the replay boundary, the shared-prefix junction, the retention
// interval, hits at prefix_match_unit inside a grown block with the partial block copied,
// and Mamba "align" state checkpoints. Each case drives the policy call by call and checks
// hit lengths and cached bytes worked by hand; unified-block (vLLM v1 of 2025) is the
// contrast. The randomized invariant driver (randomized_test.cpp) runs these policies too.
#include "sim_test_util.hpp"

#include <catch2/catch.hpp>

#include "sim/block_policy.hpp"
#include "sim/policy.hpp"

using kvmm::sim::MemoryStats;
using kvmm::sim::Policy;
using kvmm::sim::SeqInfo;

namespace {

std::unique_ptr<Policy> make(const std::string& name, const kvmm::KVLayout& layout, std::uint32_t interval = 16) {
  kvmm::sim::PolicyOptions o;
  o.memory_bytes = 64 * 1024;  // room for everything: no eviction under pressure
  o.max_seqs = 8;
  o.retention_interval = interval;
  o.max_model_len = 64;  // static shares (trtllm-v2's typical step) of the small traces here
  return kvmm::sim::make_policy(name, layout, o);
}

// A request whose first `shared` tokens are stream 7 (an article) and whose prompt has
// `prompt` tokens.
SeqInfo article(std::uint32_t uid, std::uint32_t shared, std::uint32_t prompt) {
  SeqInfo s;
  s.uid = uid;
  s.prefix_id = 7;
  s.prefix_len = shared;
  s.prompt_tokens = prompt;
  return s;
}

// Runs request `id` through its prompt and `decode` decode steps, then frees it; returns
// its hit.
std::uint32_t serve(Policy& p, std::uint32_t id, const SeqInfo& info, std::uint32_t decode) {
  p.add_request(id, info);
  const std::uint32_t hit = p.lookup_prefix(id, info.prompt_tokens - 1);
  std::uint32_t t = hit;
  REQUIRE(p.allocate(id, t, info.prompt_tokens - t));
  t = info.prompt_tokens;
  p.commit(id, t);
  for (std::uint32_t k = 0; k < decode; ++k) {
    REQUIRE(p.allocate(id, t, 1));
    p.commit(id, ++t);
    p.check_invariants();
  }
  p.free(id);
  p.check_invariants();
  return hit;
}

std::uint64_t cached(const Policy& p, std::size_t group) {
  MemoryStats m;
  p.stats(m);
  return m.groups.at(group).cached;
}

}  // namespace

// hybrid_layout: full (1 layer) and sliding (2 layers, window 8), both 32 B per layer-token:
// 4-token blocks of 128 B per layer; a sliding block is 2 units (256 B).
TEST_CASE("vllm-0.33: sparse retention keeps the window of the replay boundary, drops the rest", "[sim][vllm033]") {
  const auto layout = simtest::hybrid_layout();
  auto v = make("vllm-0.33", layout);
  auto u = make("unified-block", layout);
  // Prompt 28 (article 16 + question 12), one decode: at the decode (position 28) blocks
  // 0-4 leave the window (first needed block (29 - 8) / 4 = 5). The replay boundary is
  // 27 aligned down to 24; a hit there needs blocks (25 - 8) / 4 = 4 and 5. So block 4 stays
  // cached, 0-3 are dropped. At free, block 5 stays, block 6 (no retained hit needs it) is
  // dropped too, block 7 holds 1 token (never cached).
  for (auto* p : {v.get(), u.get()}) CHECK(serve(*p, 0, article(0, 16, 28), 1) == 0);
  CHECK(cached(*v, 1) == 2 * 256);  // blocks 4, 5
  CHECK(cached(*u, 1) == 7 * 256);  // unified-block caches every full block: 0-6
  CHECK(cached(*v, 0) == 7 * 128);  // full attention: the same 7 blocks in both
  CHECK(cached(*u, 0) == 7 * 128);
  // A second question on the article: full attention hits 16, but a hit at 16 needs sliding
  // blocks 2 and 3 (first needed (17 - 8) / 4 = 2): gone under vllm-0.33, cached in
  // unified-block.
  CHECK(serve(*u, 1, article(1, 16, 28), 1) == 16);
  CHECK(serve(*v, 1, article(1, 16, 28), 1) == 0);
}

TEST_CASE("vllm-0.33: a lagging window makes the full-attention hit a junction, retained for the next request",
          "[sim][vllm033]") {
  const auto layout = simtest::hybrid_layout();
  auto v = make("vllm-0.33", layout);
  CHECK(serve(*v, 0, article(0, 16, 28), 1) == 0);
  // Request 1 misses (as above) but its full-attention hit, 16, becomes its junction: when
  // blocks 0-4 leave its window, 2 and 3 (a hit at 16) and 4 (its replay boundary 24) stay.
  CHECK(serve(*v, 1, article(1, 16, 28), 1) == 0);
  // Cached sliding blocks: request 0's 4, 5 and request 1's 2, 3, 4, 5 (its 0, 1 and 6
  // dropped; blocks past the article are its own stream).
  CHECK(cached(*v, 1) == 6 * 256);
  // The third question hits at the junction; the blocks it took from the cache are not its
  // to drop (request 1's rule cached them), so the fourth hits too.
  CHECK(serve(*v, 2, article(2, 16, 28), 1) == 16);
  CHECK(serve(*v, 3, article(3, 16, 28), 1) == 16);
}

TEST_CASE("vllm-0.33-tuned: the retention interval keeps the window at its multiples", "[sim][vllm033]") {
  const auto layout = simtest::hybrid_layout();
  // Interval 16: positions 16 (blocks 2, 3) and 24 (blocks 4, 5; also the replay boundary)
  // are retained: of blocks 0-4 leaving the window only 0 and 1 are dropped; block 6 is
  // the tail of the segment ending at 32 (vLLM keeps every segment's tail): kept at free.
  auto t = make("vllm-0.33-tuned", layout, 16);
  CHECK(serve(*t, 0, article(0, 16, 28), 1) == 0);
  CHECK(cached(*t, 1) == 5 * 256);  // blocks 2-6
  CHECK(serve(*t, 1, article(1, 16, 28), 1) == 16);
  // Interval 12 is rounded up to the 4-token block: 12 -> 12 (blocks 1, 2), 24 (4, 5):
  // blocks 0 and 3 dropped, so a hit at 16 (blocks 2, 3) misses; at 12 it needs blocks
  // (13 - 8) / 4 = 1 and 2: retained, so the hit falls back to 12. Block 6 (tokens 24-27)
  // ends no segment of 12 (36 needs blocks 7, 8): dropped at free.
  auto t12 = make("vllm-0.33-tuned", layout, 12);
  CHECK(serve(*t12, 0, article(0, 16, 28), 1) == 0);
  CHECK(cached(*t12, 1) == 4 * 256);  // blocks 1, 2, 4, 5
  CHECK(serve(*t12, 1, article(1, 16, 28), 1) == 12);
}

// Attention 32 B per layer-token (4-token pages of 128 B) next to a Mamba state of 200 B:
// vLLM grows the attention block to hold one state, 256 B = 8 tokens; prefix_match_unit
// stays the configured 4 tokens, so hits may end in the middle of a block.
TEST_CASE("vllm-0.33: hits at the match unit inside a grown block copy the partial block", "[sim][vllm033]") {
  const auto layout = kvmm::KVLayout::plan({kvmm::LayerGroup::full_attention("attention", 1, 1, 8, 2, 4),
                                            kvmm::LayerGroup::mamba_state("mamba", 1, 200, 4)});
  auto v = make("vllm-0.33", layout);
  // Request 0: prompt 13 (shared prefix 12), 3 decodes. Its attention blocks: 0 (tokens
  // 0-7, full, cached) and 1 (8-15, full after the decodes). Unit keys at 4 and 12 lie
  // inside blocks: registered. State checkpoint at the replay boundary 12 (13 - 1 aligned to
  // 4), taken when the prompt is computed.
  CHECK(serve(*v, 0, article(0, 12, 13), 3) == 0);
  // Cached: attention blocks 0 and 1 (2 x 256), one state checkpoint (256).
  CHECK(cached(*v, 0) == 2 * 256);
  CHECK(cached(*v, 1) == 256);
  // Request 1 shares the first 12 tokens and asks something else (prompt 20): attention
  // hits 12 (block 0 whole, block 1's first 4 tokens by its unit key, copied), the state at
  // 12 is cached: the hit is 12, where vLLM v1 of 2025 (block-aligned, no state caching)
  // has none.
  CHECK(serve(*v, 1, article(1, 12, 20), 1) == 12);
  auto u = make("unified-block", layout);
  CHECK(serve(*u, 0, article(0, 12, 13), 3) == 0);
  CHECK(serve(*u, 1, article(1, 12, 20), 1) == 0);
}

TEST_CASE("vllm-0.33: no state checkpoint where the prefix diverges before it", "[sim][vllm033]") {
  const auto layout = kvmm::KVLayout::plan({kvmm::LayerGroup::full_attention("attention", 1, 1, 8, 2, 4),
                                            kvmm::LayerGroup::mamba_state("mamba", 1, 200, 4)});
  auto v = make("vllm-0.33", layout);
  // Request 0 shares only 6 tokens: its checkpoint at 12 is its own stream. Request 1's
  // attention can hit 4 (unit inside block 0), but no state is cached at 4 or below: no hit.
  // Request 1's junction is 4 (attention hit, state lagging): it checkpoints there, and
  // request 2 hits 4.
  CHECK(serve(*v, 0, article(0, 6, 13), 1) == 0);
  CHECK(serve(*v, 1, article(1, 6, 13), 1) == 0);
  CHECK(serve(*v, 2, article(2, 6, 13), 1) == 4);
}

namespace {

std::uint64_t group_free(const Policy& p, std::size_t group) {
  MemoryStats m;
  p.stats(m);
  return m.groups.at(group).group_free;
}

std::uint64_t capacity(const Policy& p) {
  MemoryStats m;
  p.stats(m);
  return m.capacity;
}

// A session's turn: its first `shared` tokens (prompt and answer) are stream 9.
SeqInfo turn(std::uint32_t uid, std::uint32_t shared, std::uint32_t prompt) {
  SeqInfo s = article(uid, shared, prompt);
  s.prefix_id = 9;
  return s;
}

}  // namespace

TEST_CASE("trtllm-v2: groups with equal pages share one pool", "[sim][trtllm]") {
  // full and sliding, 1 layer each at 32 B per token: 128 B pages, one pool of 64 KiB / 128
  // = 512 pages; its free memory is reported once (by the first group).
  const auto equal = kvmm::KVLayout::plan({kvmm::LayerGroup::full_attention("full", 1, 1, 8, 2, 4),
                                           kvmm::LayerGroup::sliding_window("sliding", 1, 1, 8, 2, 4, 8)});
  auto t = make("trtllm-v2", equal);
  t->add_request(0, article(0, 0, 8));
  REQUIRE(t->lookup_prefix(0, 7) == 0);
  REQUIRE(t->allocate(0, 0, 8));  // 2 pages in each group
  CHECK(group_free(*t, 0) == (512 - 4) * 128);
  CHECK(group_free(*t, 1) == 0);
  CHECK(capacity(*t) == 512 * 128);
  // hybrid_layout's sliding pages are 256 B (2 layers): two pools, each reporting its own.
  auto h = make("trtllm-v2", simtest::hybrid_layout());
  CHECK(group_free(*h, 0) > 0);
  CHECK(group_free(*h, 1) > 0);
}

TEST_CASE("trtllm-v2: partial reuse hits inside a block, copied", "[sim][trtllm]") {
  const auto layout = simtest::full_layout();  // 4-token blocks
  auto t = make("trtllm-v2", layout);
  auto u = make("unified-block", layout);
  // Request 0 shares 6 tokens (of a 10-token prompt): block 0 whole, block 1 holds the
  // stream's tokens 4-5, registered with length 6.
  for (auto* p : {t.get(), u.get()}) CHECK(serve(*p, 0, article(0, 6, 10), 1) == 0);
  // Request 1 shares the same 6 tokens: 4 from block 0, 2 more copied out of block 1;
  // block-aligned reuse stops at 4.
  CHECK(serve(*t, 1, article(1, 6, 10), 1) == 6);
  CHECK(serve(*u, 1, article(1, 6, 10), 1) == 4);
  // A request sharing only 5 of those tokens takes 5 (any token inside the block).
  CHECK(serve(*t, 2, article(2, 5, 10), 1) == 5);
}

TEST_CASE("kvmm --hit-unit: hits inside a page as trtllm-v2's partial reuse, the default on pages", "[sim][kvmm]") {
  const auto layout = simtest::full_layout();  // 4-token pages
  kvmm::sim::PolicyOptions o;
  o.memory_bytes = 64 * 1024;
  o.max_seqs = 8;
  auto pages = kvmm::sim::make_policy("kvmm", layout, o);
  o.hit_unit = 1;
  auto units = kvmm::sim::make_policy("kvmm", layout, o);
  auto t = make("trtllm-v2", layout);
  for (auto* p : {pages.get(), units.get(), t.get()}) CHECK(serve(*p, 0, article(0, 6, 10), 1) == 0);
  CHECK(serve(*units, 1, article(1, 6, 10), 1) == 6);  // page 0 and 2 tokens of page 1
  CHECK(serve(*t, 1, article(1, 6, 10), 1) == 6);
  CHECK(serve(*pages, 1, article(1, 6, 10), 1) == 4);
  CHECK(serve(*units, 2, article(2, 5, 10), 1) == 5);
  // A session's turn computes 15 tokens (prompt 13, 2 decodes): 3 pages and 3 tokens of
  // page 3, which free caches under hit_unit. The next turn hits into it.
  for (auto* p : {pages.get(), units.get()}) CHECK(serve(*p, 3, turn(3, 20, 13), 2) == 0);
  CHECK(serve(*units, 4, turn(4, 20, 18), 1) == 15);
  CHECK(serve(*pages, 4, turn(4, 20, 18), 1) == 12);
  o.hit_unit = 3;  // does not divide the 4-token page
  CHECK_THROWS_WITH(kvmm::sim::make_policy("kvmm", layout, o), Catch::Contains("hit_unit = 3"));
}

TEST_CASE("trtllm-v2: the Mamba state is snapshotted at the prompt's end", "[sim][trtllm]") {
  const auto layout = kvmm::KVLayout::plan({kvmm::LayerGroup::full_attention("attention", 1, 1, 8, 2, 4),
                                            kvmm::LayerGroup::mamba_state("mamba", 1, 200, 4)});
  auto t = make("trtllm-v2", layout);
  // Turn 1: prompt 13, its session stream covers 20 tokens; 3 decodes compute 16 tokens.
  // Snapshot at 13 (the prompt's end); attention caches blocks 0-3.
  CHECK(serve(*t, 0, turn(0, 20, 13), 3) == 0);
  // Turn 2 (prompt 18): attention could take 16 tokens, the state exists only at 13.
  CHECK(serve(*t, 1, turn(1, 20, 18), 1) == 13);
}

TEST_CASE("sglang: pools in the engine's ratios", "[sim][sglang]") {
  // hybrid_layout: full 32 B per token, sliding 64 B per token (2 layers). The sliding pool
  // holds 0.8 of the full pool's tokens: full tokens = 65536 / (32 + 0.8 * 64) = 787.7, so
  // the full pool has 25,206 B = 196 pages of 128 B and the sliding pool 40,329 B = 157
  // pages of 256 B.
  auto g = make("sglang", simtest::hybrid_layout());
  CHECK(capacity(*g) == 196 * 128 + 157 * 256);
  CHECK(group_free(*g, 0) == 196 * 128);
  CHECK(group_free(*g, 1) == 157 * 256);
}

TEST_CASE("sglang: the window at the sequence's end and at the branching point", "[sim][sglang]") {
  const auto layout = simtest::hybrid_layout();
  auto g = make("sglang", layout);
  auto v = make("vllm-0.33", layout);
  // A chat turn: prompt 28, all of it and the answer in the session's stream; 3 decodes
  // compute 31 tokens. SGLang keeps the window at the end (31 aligned to 28: blocks 5, 6);
  // vLLM the window at its prompt's end (27 aligned to 24: blocks 4, 5), block 6 dropped.
  CHECK(serve(*g, 0, turn(0, 40, 28), 3) == 0);
  CHECK(serve(*v, 0, turn(0, 40, 28), 3) == 0);
  CHECK(cached(*g, 1) == 2 * 256);
  CHECK(cached(*v, 1) == 2 * 256);
  // The next turn (prompt 36) hits at the previous turn's end under SGLang (28: full blocks
  // 0-6, window blocks 5-6), at its prompt end under vLLM (24: block 6 is gone).
  CHECK(serve(*g, 1, turn(1, 40, 36), 1) == 28);
  CHECK(serve(*v, 1, turn(1, 40, 36), 1) == 24);
  // arXiv-style: the branching point (the full-attention hit a missing window stopped)
  // is kept by the second question, so the third hits.
  auto a = make("sglang", layout);
  CHECK(serve(*a, 0, article(0, 16, 28), 1) == 0);
  CHECK(serve(*a, 1, article(1, 16, 28), 1) == 0);
  CHECK(serve(*a, 2, article(2, 16, 28), 1) == 16);
}

TEST_CASE("sglang: the Mamba state at the sequence's end serves the next turn", "[sim][sglang]") {
  const auto layout = kvmm::KVLayout::plan({kvmm::LayerGroup::full_attention("attention", 1, 1, 8, 2, 4),
                                            kvmm::LayerGroup::mamba_state("mamba", 1, 200, 4)});
  auto g = make("sglang", layout);
  // Turn 1 (prompt 13, 2 decodes) computes 15 tokens: its state is cached at 12 (the end,
  // page-aligned); attention caches blocks 0-2 (block 3 holds 3 tokens).
  CHECK(serve(*g, 0, turn(0, 20, 13), 2) == 0);
  CHECK(cached(*g, 1) == 200);
  CHECK(serve(*g, 1, turn(1, 20, 18), 1) == 12);
}

TEST_CASE("trtllm-v2 rule: pool shares rebalanced to finished requests' lengths", "[sim][trtllm]") {
  // Two pools of 10 pages of 128 B: full attention (4-token pages) and a window of 8. The
  // engine's defaults wait for 2,000 finished requests; here 2, recomputed after each, no
  // cooldown. Two 40-token requests finish: a 40-token request needs 10 full pages and 3
  // window pages (the window's 7 tokens before the next position span 2 pages, plus the
  // one being written), so the target shares are 10/13 and 3/13 against 1/2 and 1/2: off
  // by more than 1.25x. At the next step the window pool shrinks to floor(2560 x 3/13 /
  // 128) = 4 pages (its 6 free pages go), and the full pool takes floor(2560 x 10/13 /
  // 128) - 10 = 5 of them; 128 B stay spare (free, counted in capacity).
  using namespace kvmm::sim::block;
  const auto layout = kvmm::KVLayout::plan({kvmm::LayerGroup::full_attention("full", 1, 1, 8, 2, 4),
                                            kvmm::LayerGroup::sliding_window("sliding", 1, 1, 8, 2, 4, 8)});
  VGroup full{"full", VKind::kFull, 4, 0, 0, 1, 0, {0}};
  VGroup window{"sliding", VKind::kWindow, 4, 8, 0, 1, 1, {1}};
  Pool a{"full", 128, 10, 10, 0, kNull, kNull, false};
  Pool b{"sliding", 128, 10, 10, 0, kNull, kNull, false};
  Rebalance rb;
  rb.enabled = true;
  rb.min_closed = 2;
  rb.update_interval = 1;
  rb.cooldown_steps = 0;
  auto p = make_engine("rebalanced", layout, {full, window}, {a, b}, false, "test", SkipOrder::kLowFirst, {}, rb);
  for (std::uint32_t id = 0; id < 2; ++id) {
    p->begin_step();
    p->add_request(id, article(id, 0, 40));
    REQUIRE(p->allocate(id, 0, 40));  // every page of both pools
    p->commit(id, 40);
    p->free(id);
  }
  CHECK(group_free(*p, 0) == 10 * 128);  // not yet: pools change at the start of a step
  p->begin_step();
  p->check_invariants();
  CHECK(group_free(*p, 0) == 15 * 128);
  CHECK(group_free(*p, 1) == 4 * 128);
  CHECK(capacity(*p) == 2560);
  p->add_request(2, article(2, 0, 60));
  CHECK_FALSE(p->allocate(2, 0, 20));  // 5 window pages: the window pool has 4 now (10 before)
  CHECK(p->allocate(2, 0, 16));        // 4 and 4
  p->check_invariants();
}
