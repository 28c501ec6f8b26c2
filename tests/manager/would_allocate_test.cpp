// KVCacheManager::would_allocate: it answers what the allocate after it does, and is pure:
// a twin manager that never asks ends every seeded run with the same results, page tables,
// evictions and stats. Full attention + sliding window (one small page per large page)
// and an LCM layout (several small pages per large page), prefix caching on, a pool small
// enough that admissions are refused and running requests are reset.
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/spec/kv_layout.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <vector>

using namespace kvmm;

namespace {

struct Seq {
  RequestId id = 0;
  std::vector<std::uint32_t> tokens;
  std::uint64_t computed = 0;
  bool admitted = false;
};

void same_state(KVCacheManager& a, KVCacheManager& b, const std::vector<Seq>& seqs, GroupId groups) {
  for (GroupId g = 0; g < groups; ++g) {
    REQUIRE(a.page_counts(g).used == b.page_counts(g).used);
    REQUIRE(a.page_counts(g).evictable == b.page_counts(g).evictable);
    REQUIRE(a.page_counts(g).evicted == b.page_counts(g).evicted);
    for (const Seq& s : seqs) {
      const auto ta = a.page_table(s.id, g);
      const auto tb = b.page_table(s.id, g);
      REQUIRE(std::vector<PageId>(ta.begin(), ta.end()) == std::vector<PageId>(tb.begin(), tb.end()));
    }
  }
}

void run(const KVLayout& layout, std::uint32_t large_pages, std::uint32_t seed) {
  const KVCacheManagerOptions o{.num_large_pages = large_pages, .max_requests = 64};
  KVCacheManager asked(layout, o);
  KVCacheManager twin(layout, o);
  std::mt19937 rng(seed);
  const std::vector<std::uint32_t> shared = [&] {
    std::vector<std::uint32_t> v(48);
    for (auto& t : v) t = rng() % 50;
    return v;
  }();
  std::vector<Seq> seqs;
  std::uint64_t refused = 0;
  std::uint64_t granted = 0;
  std::uint64_t freed = 0;
  for (int step = 0; step < 300; ++step) {
    asked.begin_step();
    twin.begin_step();
    if (seqs.size() < 12 && rng() % 2 == 0) {  // a new request, often sharing a prefix
      Seq s;
      if (rng() % 3 != 0) s.tokens.assign(shared.begin(), shared.begin() + 8 + rng() % 40);
      const std::size_t extra = 1 + rng() % 60;
      for (std::size_t i = 0; i < extra; ++i) s.tokens.push_back(rng() % 50);
      s.id = asked.add_request(s.tokens);
      REQUIRE(twin.add_request(s.tokens) == s.id);
      seqs.push_back(std::move(s));
    }
    for (std::size_t k = 0; k < seqs.size();) {
      Seq& s = seqs[k];
      if (!s.admitted) {
        const std::uint64_t hit = asked.lookup_prefix(s.id);
        REQUIRE(twin.lookup_prefix(s.id) == hit);
        s.computed = hit;
      }
      const auto left = static_cast<std::uint32_t>(s.tokens.size() - s.computed);
      const std::uint32_t n = left > 0 ? std::min<std::uint32_t>(left, 1 + rng() % 24) : 1;
      const std::uint32_t lookahead = rng() % 4 == 0 ? rng() % 6 : 0;
      const bool answer = asked.would_allocate(s.id, n, lookahead);
      asked.check_invariants();
      const bool ok = static_cast<bool>(asked.allocate(s.id, n, lookahead));
      REQUIRE(answer == ok);
      REQUIRE(static_cast<bool>(twin.allocate(s.id, n, lookahead)) == ok);
      if (!ok) {
        ++refused;
        asked.reset(s.id);
        twin.reset(s.id);
        s.admitted = false;
        s.computed = 0;
        ++k;
        continue;
      }
      ++granted;
      s.admitted = true;
      s.computed += n;
      if (s.computed >= s.tokens.size()) {  // decoding: the sampled token joins
        const std::uint32_t t = rng() % 50;
        s.tokens.push_back(t);
        asked.commit(s.id, s.computed);
        twin.commit(s.id, s.computed);
        asked.append_token(s.id, t);
        twin.append_token(s.id, t);
      } else {
        asked.commit(s.id, s.computed);
        twin.commit(s.id, s.computed);
      }
      if (s.tokens.size() > 120 || rng() % 40 == 0) {
        asked.free(s.id);
        twin.free(s.id);
        seqs.erase(seqs.begin() + static_cast<std::ptrdiff_t>(k));
        ++freed;
        continue;
      }
      ++k;
    }
    same_state(asked, twin, seqs, layout.num_groups());
  }
  asked.check_invariants();
  twin.check_invariants();
  CHECK(refused > 0);  // the pool was small enough for refusals: both answers were asked
  CHECK(granted > 0);
  CHECK(freed > 0);
}

}  // namespace

TEST_CASE("would_allocate answers what allocate does and changes nothing", "[manager][would_allocate]") {
  const std::uint32_t seed = GENERATE(1u, 2u, 3u);
  SECTION("full attention + sliding window, one small page per large page") {
    run(KVLayout::plan({LayerGroup::full_attention("full", 2, 1, 64, 2, 4),
                        LayerGroup::sliding_window("local", 2, 1, 64, 2, 4, 8)}),
        60, seed);
  }
  SECTION("several small pages per large page") {
    run(KVLayout::plan({LayerGroup::full_attention("full", 4, 1, 64, 2, 4),
                        LayerGroup::sliding_window("local", 1, 1, 64, 2, 4, 8)}),
        36, seed);
  }
}

TEST_CASE("would_allocate: bad handles raise and change nothing", "[manager][would_allocate]") {
  KVCacheManager kv(KVLayout::plan({LayerGroup::full_attention("full", 2, 1, 64, 2, 4)}), {.num_large_pages = 4});
  const RequestId r = kv.add_request(std::vector<std::uint32_t>{1, 2, 3, 4, 5});
  kv.lookup_prefix(r);
  CHECK(kv.would_allocate(r, 5));
  CHECK_FALSE(kv.would_allocate(r, 17));  // 5 pages of 4 tokens > 4 large pages
  CHECK_THROWS_AS(kv.would_allocate(r + 1000, 1), Error);
  REQUIRE(kv.allocate(r, 5));
  kv.free(r);
  CHECK_THROWS_AS(kv.would_allocate(r, 1), Error);
  kv.check_invariants();
}
