// KVCacheManagerOptions::sparse_state_checkpoints: exact cases (which checkpoints a request
// leaves cached, a boundary's and a hit's kept) and a seeded random run on a layout with
// four state pages per large page, the recount checked after every call, against the
// same run with the option off (the option may only change what stays cached).
#include "kvmm/manager/kv_cache_manager.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

using namespace kvmm;

namespace {

constexpr GroupId kFull = 0, kState = 1;

std::vector<std::uint32_t> ids(std::uint32_t first, std::size_t n) {
  std::vector<std::uint32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// Full attention 4 tokens a page (128 B), a state page of 256 B checkpointed every 8 tokens.
KVLayout layout() {
  return KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 4), LayerGroup::mamba_state("m", 1, 256, 8)});
}

// Prefills `seq`'s first `prompt` tokens in one step, then decodes the rest one token a step.
RequestId run(KVCacheManager& kv, const std::vector<std::uint32_t>& seq, std::size_t prompt,
              const RequestExtras& extras = {}) {
  kv.begin_step();
  const RequestId r = kv.add_request(std::span(seq).first(prompt), extras);
  const std::uint64_t hit = kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, static_cast<std::uint32_t>(prompt - hit)));
  kv.commit(r, prompt);
  for (std::size_t c = prompt; c < seq.size(); ++c) {
    kv.begin_step();
    kv.append_token(r, seq[c]);
    REQUIRE(kv.allocate(r, 1));
    kv.commit(r, c + 1);
  }
  return r;
}

std::uint64_t hit_of(KVCacheManager& kv, const std::vector<std::uint32_t>& prompt) {
  kv.begin_step();
  const RequestId r = kv.add_request(prompt);
  const std::uint64_t hit = kv.lookup_prefix(r);
  kv.free(r);
  return hit;
}

}  // namespace

TEST_CASE("sparse state checkpoints keep the prompt's end and drop the others", "[manager][sparse_states]") {
  const std::vector<std::uint32_t> seq = ids(1, 38);  // a 20-token prompt, 18 tokens decoded
  for (const bool sparse : {false, true}) {
    INFO("sparse " << sparse);
    KVCacheManager kv(layout(), {.num_large_pages = 64, .sparse_state_checkpoints = sparse});
    kv.free(run(kv, seq, 20));
    kv.check_invariants();
    // Checkpoints at 8, 16, 24 and 32 tokens (the state at 38 is no checkpoint). Sparse:
    // only 16, the last within the prompt, stays; the others were evicted as passed.
    CHECK(kv.page_counts(kState).evictable == (sparse ? 1u : 4u));
    CHECK(kv.page_counts(kState).evicted == (sparse ? 3u : 0u));
    CHECK(kv.page_counts(kFull).evictable == 9);  // full attention unchanged: 36 tokens
    CHECK(hit_of(kv, ids(1, 20)) == 16);          // the prompt again: its end's checkpoint
    CHECK(hit_of(kv, ids(1, 37)) == (sparse ? 16u : 32u));
    kv.check_invariants();
  }
}

TEST_CASE("sparse state checkpoints: a boundary's checkpoint and a hit's stay cached", "[manager][sparse_states]") {
  KVCacheManager kv(layout(), {.num_large_pages = 64, .sparse_state_checkpoints = true});
  // A boundary at 9 tokens holds the checkpoint at 8 (the state a hit at 9 floors to).
  const std::vector<std::uint64_t> bounds = {9};
  kv.free(run(kv, ids(1, 30), 20, {.cache_boundaries = bounds}));
  CHECK(kv.page_counts(kState).evictable == 2);  // 8 (the boundary's) and 16 (the prompt's end)
  CHECK(hit_of(kv, ids(1, 12)) == 8);
  // B's prompt extends A's 20 tokens to 40: it hits A's checkpoint at 16 and computes
  // 24 and 32 (dropped as passed), 40 (its prompt's end, kept); A's 16 stays cached.
  std::vector<std::uint32_t> b = ids(1, 20);
  const std::vector<std::uint32_t> more = ids(500, 26);
  b.insert(b.end(), more.begin(), more.end());
  kv.free(run(kv, b, 40));
  kv.check_invariants();
  CHECK(kv.page_counts(kState).evictable == 4);  // 8, 16 (A's), 32 and 40 (B's prompt end: 39 and 40)
  CHECK(hit_of(kv, ids(1, 20)) == 16);
  CHECK(hit_of(kv, std::vector<std::uint32_t>(b.begin(), b.begin() + 40)) == 32);
  CHECK(hit_of(kv, std::vector<std::uint32_t>(b.begin(), b.begin() + 41)) == 40);
  CHECK(hit_of(kv, std::vector<std::uint32_t>(b.begin(), b.begin() + 30)) == 16);  // 24 was dropped
}

TEST_CASE("sparse state checkpoints: seeded random runs keep every invariant", "[manager][sparse_states]") {
  // Full attention 512 B pages (one per large page), state pages 128 B (four per large
  // page): cached checkpoints share large pages with running requests' states. The state
  // bound (LayoutOptions::max_state_pages_per_large_page, 2 by default) off, or it would
  // fit 8-token attention pages and two states per large page.
  const KVLayout lay =
      KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 16), LayerGroup::mamba_state("m", 1, 128, 16)},
                     {.max_state_pages_per_large_page = 0});
  REQUIRE(lay.small_pages_per_large_page(kState) == 4);
  for (const std::uint32_t seed : {1u, 2u, 3u}) {
    for (const bool sparse : {false, true}) {
      INFO("seed " << seed << " sparse " << sparse);
      KVCacheManager kv(lay, {.num_large_pages = 48, .max_requests = 16, .sparse_state_checkpoints = sparse});
      std::mt19937 rng(seed);
      struct Live {
        RequestId r;
        std::vector<std::uint32_t> seq;
        std::uint64_t computed;
      };
      std::vector<Live> live;
      std::uint64_t finished = 0, refused = 0;
      for (int step = 0; step < 600; ++step) {
        kv.begin_step();
        if (live.size() < 12 && rng() % 2 == 0) {
          // A prompt of 1-3 shared prefixes' tokens plus its own, 8-120 tokens of answer.
          const std::uint32_t base = 1 + rng() % 3;
          std::vector<std::uint32_t> seq = ids(base * 1000, 16 * (rng() % 5));
          const std::vector<std::uint32_t> own = ids(100000 + step * 200, 1 + rng() % 60);
          seq.insert(seq.end(), own.begin(), own.end());
          const std::size_t prompt = seq.size();
          const std::vector<std::uint32_t> answer = ids(7000000 + step * 200, 8 + rng() % 113);
          seq.insert(seq.end(), answer.begin(), answer.end());
          std::vector<std::uint64_t> bounds;
          if (prompt > 20 && rng() % 3 == 0) bounds.push_back(16);
          const RequestId r = kv.add_request(std::span(seq).first(prompt), {.cache_boundaries = bounds});
          const std::uint64_t hit = kv.lookup_prefix(r);
          if (kv.allocate(r, static_cast<std::uint32_t>(prompt - hit))) {
            kv.commit(r, prompt);
            live.push_back({r, std::move(seq), prompt});
          } else {
            kv.free(r);
            ++refused;
          }
        }
        for (std::size_t k = 0; k < live.size();) {
          Live& q = live[k];
          if (q.computed == q.seq.size() || rng() % 50 == 0) {  // finished, or aborted
            kv.free(q.r);
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
            ++finished;
            continue;
          }
          kv.append_token(q.r, q.seq[q.computed]);
          if (!kv.allocate(q.r, 1)) {  // preempted: starts over from its cached prefix
            kv.reset(q.r);
            const std::uint64_t hit = kv.lookup_prefix(q.r, q.computed);
            if (kv.allocate(q.r, static_cast<std::uint32_t>(q.computed + 1 - hit))) {
              kv.commit(q.r, ++q.computed);
              ++k;
            } else {
              kv.free(q.r);
              live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
              ++refused;
            }
            continue;
          }
          kv.commit(q.r, ++q.computed);
          ++k;
        }
        kv.check_invariants();
      }
      CHECK(finished > 100);
      CHECK(refused > 0);  // memory ran out: evictions and preemptions were exercised
      for (const Live& q : live) kv.free(q.r);
      kv.check_invariants();
      CHECK(kv.page_counts(kState).used == 0);
      CHECK(kv.page_counts(kFull).used == 0);
    }
  }
}
