// Hits finer than a page (KVCacheManagerOptions::hit_unit, issue 34 item 3): exact cases
// (where the hit ends, the copy of the partial page, its source held for one step, a
// refused admission giving everything back, the option's errors) and a seeded randomized
// engine over a content model: every page holds the token ids written into it, copies are
// run as the engine would, and every token a request reads after its hit must be its own
// (a chat's next turn hits into its previous turn's partial last page; a run that skips
// the copies reads other requests' tokens, and the test says so).
#include "kvmm/error.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/testing/manager_inspector.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

using namespace kvmm;

namespace {

KVLayout full16() { return KVLayout::plan({LayerGroup::full_attention("f", 1, 1, 8, 2, 16)}); }
KVLayout gemma16() {
  return KVLayout::plan(
      {LayerGroup::full_attention("global", 1, 1, 8, 2, 16), LayerGroup::sliding_window("local", 2, 1, 8, 2, 16, 40)});
}

std::vector<std::uint32_t> ids(std::uint32_t n, std::uint32_t base) {
  std::vector<std::uint32_t> t(n);
  for (std::uint32_t i = 0; i < n; ++i) t[i] = base + i;
  return t;
}

// Runs tokens through one request (lookup, one allocate, commit) and frees it.
void cache(KVCacheManager& kv, const std::vector<std::uint32_t>& t) {
  const RequestId r = kv.add_request(t);
  const std::uint64_t h = kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, static_cast<std::uint32_t>(t.size() - h)));
  kv.begin_step();
  kv.commit(r, t.size());
  kv.free(r);
}

}  // namespace

TEST_CASE("a hit ends at the last cached unit inside a page and copies that page", "[manager][partial]") {
  for (const std::uint32_t unit : {0u, 1u, 4u}) {
    INFO("hit_unit " << unit);
    KVCacheManager kv(full16(), {.num_large_pages = 32, .max_requests = 4, .hit_unit = unit});
    const auto a = ids(16 * 5 + 10, 1000);  // pages 0..4 cached at commit
    cache(kv, a);
    auto b = a;
    b.resize(16 * 3 + 9);  // agrees with a on 3 pages and 9 tokens of page 3
    const auto tail = ids(30, 50000);
    b.insert(b.end(), tail.begin(), tail.end());
    const RequestId r = kv.add_request(b);
    const std::uint64_t expect = unit == 0 ? 48 : unit == 1 ? 57 : 56;
    CHECK(kv.lookup_prefix(r) == expect);
    const RequestId probe = kv.add_request(std::vector<std::uint32_t>(a.begin(), a.begin() + 81));  // a's page 3
    REQUIRE(kv.lookup_prefix(probe) == 80);
    REQUIRE(kv.allocate(probe, 0));
    const PageId src = kv.page_table(probe, 0)[3];
    kv.free(probe);
    REQUIRE(kv.allocate(r, static_cast<std::uint32_t>(b.size() - expect)));
    const auto row = kv.page_table(r, 0);
    const kvmm::testing::ManagerInspector in(kv);
    if (unit == 0) {
      CHECK(kv.copies().empty());
      CHECK(in.ref_count(0, src) == 0);
    } else {
      REQUIRE(kv.copies().size() == 1);
      CHECK(kv.copies()[0] == PageCopy{0, src, row[3]});
      CHECK(row[3] != src);
      CHECK(in.ref_count(0, src) == 1);  // held until the copy has run
    }
    kv.check_invariants();
    kv.begin_step();
    CHECK(in.ref_count(0, src) == 0);  // cached again, evictable
    CHECK(in.page_hash(0, src).has_value());
    kv.commit(r, b.size());
    kv.check_invariants();
    kv.free(r);
    // a's prefix is intact: the same prompt hits its 5 cached pages again, and with
    // hit_unit its cached partial last page (10 tokens) up to the prompt's last token.
    const RequestId again = kv.add_request(a);
    CHECK(kv.lookup_prefix(again) == (unit == 0 ? 80 : unit == 1 ? 89 : 88));
    kv.free(again);
  }
}

TEST_CASE("a partial hit in full-attention and sliding-window groups copies each group's page", "[manager][partial]") {
  KVCacheManager kv(gemma16(), {.num_large_pages = 64, .max_requests = 4, .hit_unit = 2});
  const auto a = ids(16 * 8 + 3, 7);
  cache(kv, a);
  auto b = a;
  b.resize(16 * 6 + 7);
  b.push_back(999999);
  const RequestId r = kv.add_request(b);
  CHECK(kv.lookup_prefix(r) == 16 * 6 + 6);
  REQUIRE(kv.allocate(r, 2));
  REQUIRE(kv.copies().size() == 2);
  for (const PageCopy& c : kv.copies()) CHECK(kv.page_table(r, c.group)[6] == c.dst);
  CHECK(kv.page_table(r, 1)[0] == kNullPage);  // the window's pages before it are not pinned
  kv.check_invariants();
  kv.begin_step();
  kv.check_invariants();
}

TEST_CASE("a refused admission with a partial hit gives its pins and held sources back", "[manager][partial]") {
  KVCacheManager kv(full16(), {.num_large_pages = 8, .max_requests = 4, .hit_unit = 4});
  const auto a = ids(16 * 4 + 5, 3);
  cache(kv, a);
  auto b = a;
  b.resize(16 * 2 + 8);
  const auto more = ids(16 * 20, 70000);  // far more than the pool holds
  b.insert(b.end(), more.begin(), more.end());
  const RequestId r = kv.add_request(b);
  REQUIRE(kv.lookup_prefix(r) == 40);
  const auto res = kv.allocate(r, static_cast<std::uint32_t>(b.size() - 40));
  CHECK(res.kind == AllocateStatus::kNoMemory);
  CHECK(kv.copies().empty());
  kv.check_invariants();
  CHECK(kv.stats().groups[0].evictable_pages == 5);  // every page of a (its partial last one too) cached, evictable
  // A smaller allocate admits it.
  REQUIRE(kv.allocate(r, 8));
  CHECK(kv.copies().size() == 1);
  kv.check_invariants();
}

TEST_CASE("hit_unit's errors name the option and the group", "[manager][partial]") {
  CHECK_THROWS_WITH(KVCacheManager(full16(), {.num_large_pages = 8, .hit_unit = 3}),
                    Catch::Contains("hit_unit = 3") && Catch::Contains("16-token pages"));
  CHECK_THROWS_WITH(KVCacheManager(KVLayout::plan({LayerGroup::full_attention("f", 1, 1, 8, 2, 16),
                                                   LayerGroup::mamba_state("m", 1, 4096, 16)}),
                                   {.num_large_pages = 8, .hit_unit = 4}),
                    Catch::Contains("hit_unit = 4") && Catch::Contains("'m'"));
  CHECK_THROWS_WITH(KVCacheManager(KVLayout::plan({LayerGroup::full_attention("f", 1, 1, 8, 2, 16),
                                                   LayerGroup::full_attention("g", 1, 1, 8, 2, 8)}),
                                   {.num_large_pages = 8, .hit_unit = 4}),
                    Catch::Contains("'g'") && Catch::Contains("one page size"));
}

namespace {

// An engine over a content model: content_[g][page][slot] is the token id its KV holds.
class ContentEngine {
 public:
  ContentEngine(std::uint64_t seed, const KVLayout& layout, std::uint32_t unit, std::uint32_t large_pages,
                bool skip_copies = false)
      : rng_(seed),
        skip_copies_(skip_copies),
        kv_(layout, {.num_large_pages = large_pages, .max_requests = 8, .hit_unit = unit}) {
    ng_ = static_cast<GroupId>(layout.num_groups());
    P_ = layout.group(0).tokens_per_page;
    for (auto& b : bases_) b = ids(200, static_cast<std::uint32_t>(rng_() % 1000) * 1000);
  }

  void run(int ops) {
    for (int i = 0; i < ops; ++i) {
      step();
      kv_.check_invariants();
    }
  }

  std::uint64_t partial_hits = 0, copies = 0, hits = 0, refusals = 0, lost = 0;
  std::uint64_t follower_partial = 0;  // partial hits past a finished request's last full page
  std::uint64_t bad_reads = 0;         // positions read holding another request's token

 private:
  struct Req {
    std::vector<std::uint32_t> t;
    std::uint64_t computed = 0;
    bool admitted = false;
    std::uint64_t after = 0;  // a follower: the finished prompt's last full page's end
  };

  // A base's prefix of random length, then random ids: prefixes diverge anywhere. Or, a
  // third of the time, a finished request's computed tokens and more (its next turn).
  std::vector<std::uint32_t> prompt(std::uint64_t& after) {
    after = 0;
    if (!finished_.empty() && rng_() % 3 == 0) {
      std::vector<std::uint32_t> t = finished_[rng_() % finished_.size()];
      after = t.size() / P_ * P_;
      const std::uint64_t extra = 1 + rng_() % 20;
      for (std::uint64_t i = 0; i < extra; ++i) t.push_back(static_cast<std::uint32_t>(rng_() % 7));
      return t;
    }
    const auto& b = bases_[rng_() % bases_.size()];
    std::vector<std::uint32_t> t(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(rng_() % 120));
    const std::uint64_t extra = 1 + rng_() % 40;
    for (std::uint64_t i = 0; i < extra; ++i) t.push_back(static_cast<std::uint32_t>(rng_() % 7));
    return t;
  }

  // Every position the next token reads holds the request's own id.
  void check_reads(RequestId r, const Req& q) {
    for (GroupId g = 0; g < ng_; ++g) {
      const auto row = kv_.page_table(r, g);
      const KVLayout& l = kv_.layout();
      const std::uint64_t w = l.group(g).kind == LayerKind::kSlidingWindow ? l.group(g).window : 0;
      const std::uint64_t from = w > 0 && q.computed > w ? q.computed - w + 1 : 0;
      for (std::uint64_t t = from; t < q.computed; ++t) {
        INFO("request " << r << " group " << g << " position " << t << " computed " << q.computed);
        REQUIRE(t / P_ < row.size());
        const PageId p = row[t / P_];
        REQUIRE(p != kNullPage);
        const auto& c = content_[{g, p}];
        bad_reads += c.size() != P_ || c[t % P_] != q.t[t];
      }
    }
  }

  void step() {
    kv_.begin_step();
    const std::uint64_t op = rng_() % 10;
    if (reqs_.size() < 6 && (op < 4 || reqs_.empty())) {
      std::uint64_t after = 0;
      const auto t = prompt(after);
      const RequestId r = kv_.add_request(t);
      Req& q = reqs_[r];
      q.t = t;
      q.after = after;
      q.computed = kv_.lookup_prefix(r);
      hits += q.computed > 0;
      partial_hits += q.computed % P_ != 0;
      follower_partial += q.computed % P_ != 0 && q.computed > after && after > 0;
      return;
    }
    auto it = reqs_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng_() % reqs_.size()));
    const RequestId r = it->first;
    Req& q = it->second;
    if (op == 9 || q.computed == q.t.size()) {  // done (or dropped)
      if (q.computed > P_) {
        if (finished_.size() == 8) finished_.erase(finished_.begin() + static_cast<std::ptrdiff_t>(rng_() % 8));
        finished_.emplace_back(q.t.begin(), q.t.begin() + static_cast<std::ptrdiff_t>(q.computed));
      }
      kv_.free(r);
      reqs_.erase(it);
      return;
    }
    const auto n = static_cast<std::uint32_t>(1 + rng_() % std::min<std::uint64_t>(q.t.size() - q.computed, 24));
    const AllocateResult res = kv_.allocate(r, n);
    if (res.kind == AllocateStatus::kHitLost) {
      ++lost;
      kv_.reset(r);
      q.computed = kv_.lookup_prefix(r);
      return;
    }
    if (!res) {
      ++refusals;
      if (!q.admitted && rng_() % 2 == 0) {  // preempt by recompute sometimes
        kv_.reset(r);
        q.computed = kv_.lookup_prefix(r);
      }
      return;
    }
    q.admitted = true;
    for (const PageCopy& c : kv_.copies()) {  // run before the step's kernels
      ++copies;
      if (!skip_copies_) content_[{c.group, c.dst}] = content_[{c.group, c.src}];
    }
    check_reads(r, q);  // the hit (and everything computed) reads the request's own ids
    for (GroupId g = 0; g < ng_; ++g) {
      const auto row = kv_.page_table(r, g);
      for (std::uint64_t t = q.computed; t < q.computed + n; ++t) {
        const PageId p = row[t / P_];
        const kvmm::testing::ManagerInspector in(kv_);
        INFO("group " << g << " page " << p << " position " << t);
        REQUIRE(in.ref_count(g, p) == 1);               // written pages are the request's alone
        REQUIRE_FALSE(in.page_hash(g, p).has_value());  // and no cached content is overwritten
        auto& c = content_[{g, p}];
        if (t % P_ == 0 || c.size() != P_) c.assign(P_, ~0u);
        c[t % P_] = q.t[t];
      }
    }
    q.computed += n;
    kv_.commit(r, q.computed);
  }

  std::mt19937_64 rng_;
  bool skip_copies_;
  KVCacheManager kv_;
  GroupId ng_ = 0;
  std::uint32_t P_ = 0;
  std::array<std::vector<std::uint32_t>, 3> bases_;
  std::map<RequestId, Req> reqs_;
  std::vector<std::vector<std::uint32_t>> finished_;  // finished requests' computed tokens
  std::map<std::pair<GroupId, PageId>, std::vector<std::uint32_t>> content_;
};

}  // namespace

TEST_CASE("randomized engine over a content model: partial hits read only their own tokens", "[manager][partial]") {
  for (const std::uint64_t seed : {1u, 2u, 3u, 4u}) {
    const bool windows = seed % 2 == 0;
    const std::uint32_t unit = seed <= 2 ? 1 : 4;
    INFO("seed " << seed);
    ContentEngine e(seed, windows ? gemma16() : full16(), unit, windows ? 32 : 16);
    e.run(20000);
    CHECK(e.bad_reads == 0);
    CHECK(e.partial_hits > 300);
    CHECK(e.follower_partial > 100);
    CHECK(e.copies > 300);
    CHECK(e.refusals > 100);
    CHECK(e.lost > 10);
    WARN("seed " << seed << ": hits " << e.hits << " partial " << e.partial_hits << " (past a finished request's "
                 << "last full page " << e.follower_partial << ") copies " << e.copies << " refusals " << e.refusals
                 << " lost " << e.lost);
  }
}

TEST_CASE("the content model catches an engine that skips the partial pages' copies", "[manager][partial]") {
  for (const std::uint64_t seed : {1u, 2u}) {
    INFO("seed " << seed);
    ContentEngine e(seed, seed == 2 ? gemma16() : full16(), 4, seed == 2 ? 32 : 16, true);
    e.run(3000);
    CHECK(e.follower_partial > 10);
    CHECK(e.bad_reads > 0);
  }
}
