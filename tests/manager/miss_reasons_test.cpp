// Miss reasons (issue 34): lookup_report names, per group, where and why the hit stopped
// (content never cached, a page floor, a salt or LoRA mismatch, an image's key, an eviction,
// a window page released early, a checkpoint grid), counters and Prometheus lines count
// them, and cache_usage keeps each request's tokens read from and written to the cache.
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/manager/metrics.hpp"
#include "support/error_of.hpp"

#include <catch2/catch.hpp>

#include <numeric>
#include <string>
#include <vector>

using namespace kvmm;
using kvmm::test::error_of;

namespace {

std::vector<std::uint32_t> ids(std::uint32_t first, std::size_t n) {
  std::vector<std::uint32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

KVLayout full_layout() { return KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 4)}); }

// Adds, computes and frees a request: its full pages stay cached.
RequestId run(KVCacheManager& kv, const std::vector<std::uint32_t>& prompt, const RequestExtras& extras = {}) {
  kv.begin_step();
  const RequestId r = kv.add_request(prompt, extras);
  const std::uint64_t hit = kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, static_cast<std::uint32_t>(prompt.size() - hit)));
  kv.commit(r, prompt.size());
  return r;
}

}  // namespace

TEST_CASE("miss reasons are off by default and cost no report", "[manager][miss_reasons]") {
  KVCacheManager kv(full_layout(), {.num_large_pages = 16});
  const RequestId r = kv.add_request(ids(1, 9));
  kv.lookup_prefix(r);
  CHECK(error_of([&] { kv.lookup_report(r); }).find("miss_reasons is 0") != std::string::npos);
  const ManagerCounters c = kv.counters();
  for (std::size_t k = 0; k < kNumMissReasons; ++k) CHECK(c.misses.lookups[k] == 0);
  CHECK(error_of([] {
          KVCacheManager(full_layout(), {.num_large_pages = 4, .miss_reasons = (1u << 24) + 1});
        }).find("miss_reasons = 16777217") != std::string::npos);
}

TEST_CASE("a hit stops at the first differing page, at the page floor, or at a salt or LoRA",
          "[manager][miss_reasons]") {
  KVCacheManager kv(full_layout(), {.num_large_pages = 64, .miss_reasons = 256});
  const RequestId a = run(kv, ids(1, 16));
  CHECK(kv.cache_usage(a).read_tokens == 0);
  CHECK(kv.cache_usage(a).written_tokens == 16);
  kv.free(a);

  SECTION("first differing token in page 2") {
    std::vector<std::uint32_t> p = ids(1, 16);
    p[9] = 999;  // page 2 (tokens 8..11) differs
    kv.begin_step();
    const RequestId b = kv.add_request(p);
    CHECK(error_of([&] { kv.lookup_report(b); }).find("before its lookup_prefix") != std::string::npos);
    CHECK(kv.lookup_prefix(b) == 8);
    const LookupReport& rep = kv.lookup_report(b);
    CHECK(rep.limit == 15);
    CHECK(rep.hit_tokens == 8);
    CHECK(rep.reason == MissReason::kNotCached);
    REQUIRE(rep.groups.size() == 1);
    CHECK(rep.groups[0].page == 2);
    CHECK(rep.groups[0].hit_tokens == 8);
    const ManagerCounters c = kv.counters();
    // a's lookup found nothing (15 tokens missed at page 0), b's missed 7.
    CHECK(c.misses.lookups[static_cast<std::size_t>(MissReason::kNotCached)] == 2);
    CHECK(c.misses.tokens[static_cast<std::size_t>(MissReason::kNotCached)] == 22);
    CHECK(c.misses.lookups[static_cast<std::size_t>(MissReason::kNone)] == 0);
    const std::string text = prometheus_text(kv);
    CHECK(text.find("kvmm_lookup_stops_total{reason=\"not_cached\"} 2\n") != std::string::npos);
    CHECK(text.find("kvmm_missed_tokens_total{reason=\"not_cached\"} 22\n") != std::string::npos);
    CHECK(text.find("kvmm_lookup_stops_total{reason=\"evicted\"} 0\n") != std::string::npos);
    // Accounting: 8 tokens read; pages 2 and 3 (8 tokens) newly cached by b's commit.
    REQUIRE(kv.allocate(b, 8));
    kv.commit(b, 16);
    CHECK(kv.cache_usage(b).read_tokens == 8);
    CHECK(kv.cache_usage(b).written_tokens == 8);
  }
  SECTION("the same prompt: every whole page below the limit hit") {
    kv.begin_step();
    const RequestId b = kv.add_request(ids(1, 16));
    CHECK(kv.lookup_prefix(b) == 12);  // limit 15: page 3 would need token 15
    CHECK(kv.lookup_report(b).reason == MissReason::kPageFloor);
    CHECK(kv.lookup_report(b).groups[0].page == 3);
    kv.begin_step();
    const RequestId c = kv.add_request(ids(1, 17));
    CHECK(kv.lookup_prefix(c) == 16);
    CHECK(kv.lookup_report(c).reason == MissReason::kNone);  // limit 16 reached
  }
  SECTION("a cache salt or a LoRA id the cached pages lack") {
    kv.begin_step();
    const RequestId b = kv.add_request(ids(1, 16), {.cache_salt = "tenant-b"});
    CHECK(kv.lookup_prefix(b) == 0);
    CHECK(kv.lookup_report(b).reason == MissReason::kKeyMismatch);
    CHECK(kv.lookup_report(b).groups[0].page == 0);
    const RequestId c = kv.add_request(ids(1, 16), {.lora_id = 3});
    CHECK(kv.lookup_prefix(c) == 0);
    CHECK(kv.lookup_report(c).reason == MissReason::kKeyMismatch);
    // Other tokens under the same salt: never seen.
    const RequestId d = kv.add_request(ids(500, 16), {.cache_salt = "tenant-b"});
    CHECK(kv.lookup_prefix(d) == 0);
    CHECK(kv.lookup_report(d).reason == MissReason::kNotCached);
  }
  SECTION("an image inside page 1 that no cached page carries") {
    const MultimodalItem img{.hash = {7, 8}, .offset = 5, .length = 2};
    kv.begin_step();
    const RequestId b = kv.add_request(ids(1, 16), {.items = std::span(&img, 1)});
    CHECK(kv.lookup_prefix(b) == 4);
    CHECK(kv.lookup_report(b).reason == MissReason::kImageKey);
    CHECK(kv.lookup_report(b).groups[0].page == 1);
  }
  SECTION("evicted under memory pressure") {
    // Other prompts take every page: a's pages are evicted.
    for (std::uint32_t k = 0; k < 4; ++k) kv.free(run(kv, ids(1000 + 100 * k, 64)));
    kv.begin_step();
    const RequestId b = kv.add_request(ids(1, 16));
    CHECK(kv.lookup_prefix(b) == 0);
    CHECK(kv.lookup_report(b).reason == MissReason::kEvicted);
    CHECK(kv.lookup_report(b).groups[0].page == 0);
  }
  SECTION("a reset request has no report until it looks up again") {
    kv.begin_step();
    const RequestId b = kv.add_request(ids(1, 16));
    kv.lookup_prefix(b);
    kv.reset(b);
    CHECK(error_of([&] { kv.lookup_report(b); }).find("before its lookup_prefix") != std::string::npos);
    CHECK(kv.lookup_prefix(b) == 12);
    CHECK(kv.lookup_report(b).reason == MissReason::kPageFloor);
  }
}

// Jenga Fig. 10's setting (full attention + a window of 2, one-token pages) with one more
// eviction: the window's pages of the shared prefix left its window early and go first.
TEST_CASE("a window page evicted while full attention kept the prefix: retention not held", "[manager][miss_reasons]") {
  const KVLayout layout = KVLayout::plan(
      {LayerGroup::full_attention("full", 1, 1, 8, 2, 1), LayerGroup::sliding_window("sw", 1, 1, 8, 2, 1, 2)});
  KVCacheManager kv(
      layout,
      {.num_large_pages = 12, .max_requests = 4, .learned_boundaries = 0, .prompt_tail_tokens = 0, .miss_reasons = 64});
  kv.begin_step();
  const RequestId r1 = kv.add_request(std::vector<std::uint32_t>{101, 102, 103, 104});
  REQUIRE(kv.lookup_prefix(r1) == 0);
  REQUIRE(kv.allocate(r1, 4));
  kv.commit(r1, 4);
  for (std::uint32_t t : {105u, 106u}) {
    kv.append_token(r1, t);
    kv.begin_step();
    REQUIRE(kv.allocate(r1, 1));
    kv.commit(r1, kv.num_computed(r1) + 1);
  }
  CHECK(kv.cache_usage(r1).written_tokens == 6);  // 6 computed tokens: 6 one-token pages of full attention
  kv.free(r1);
  kv.begin_step();
  const RequestId other = kv.add_request(std::vector<std::uint32_t>{200, 201, 202});
  REQUIRE(kv.lookup_prefix(other) == 0);
  REQUIRE(kv.allocate(other, 2));
  const RequestId r2 = kv.add_request(std::vector<std::uint32_t>{101, 102, 103, 104, 107});
  CHECK(kv.lookup_prefix(r2) == 0);
  const LookupReport& rep = kv.lookup_report(r2);
  CHECK(rep.reason == MissReason::kRetentionNotHeld);
  CHECK(rep.group == 1);
  CHECK(rep.groups[0].hit_tokens == 4);  // full attention alone: all 4 (the limit)
  CHECK(rep.groups[0].reason == MissReason::kNone);
  CHECK(rep.groups[1].reason == MissReason::kRetentionNotHeld);
  CHECK(rep.groups[1].hit_tokens == 0);
}

TEST_CASE("a Mamba group's hit floors to its checkpoint grid", "[manager][miss_reasons]") {
  const KVLayout layout =
      KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 4), LayerGroup::mamba_state("mamba", 1, 256, 8)});
  KVCacheManager kv(layout, {.num_large_pages = 64, .miss_reasons = 64});
  kv.free(run(kv, ids(1, 24)));
  kv.begin_step();
  const RequestId b = kv.add_request(ids(1, 16));  // limit 15: checkpoint 8 is the grid floor
  CHECK(kv.lookup_prefix(b) == 8);
  const LookupReport& rep = kv.lookup_report(b);
  CHECK(rep.groups[0].hit_tokens == 12);
  CHECK(rep.groups[0].reason == MissReason::kPageFloor);
  CHECK(rep.groups[1].hit_tokens == 8);
  CHECK(rep.reason == MissReason::kCheckpointGrid);
  CHECK(rep.group == 1);
}

TEST_CASE("to_string names every miss reason", "[manager][miss_reasons]") {
  CHECK(to_string(MissReason::kNone) == "none");
  CHECK(to_string(MissReason::kRetentionNotHeld) == "retention_not_held");
  CHECK(to_string(MissReason::kImageEvicted) == "image_evicted");
}
