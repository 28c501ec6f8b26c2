// Hits from a shared tier (tier_candidates, extend_prefix, tier loads, finish_loads) on a
// hybrid layout (full attention, sliding window, Mamba; two page sizes), against a model
// written from the policies' rule alone: a hit of p tokens needs pages [first_required_page(p),
// p / P) of every decoder group. The model says what the local hit, the extended hit, the
// pages to load and the hit after failed loads must be; seeded random traffic checks all
// four and the manager's invariants after every call (tiers that hold some pages, loads
// that fail at random, requests freed while loading, eviction under a small pool). Exact
// cases: a worked example, bad input, and the calls a loading request refuses.
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/manager/tier_admission.hpp"
#include "support/cached_blocks.hpp"
#include "support/error_of.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

using namespace kvmm;
using namespace kvmm::test;

namespace {

KVLayout tier_layout() {
  return KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 8, 2, 4),
                         LayerGroup::sliding_window("sw", 1, 1, 8, 2, 4, 12),
                         LayerGroup::mamba_state("mamba", 1, 256, 8)});
}

CachedBlock block_of(GroupId g, const BlockHash& h) { return {g, {h.lo, h.hi}}; }

// The hit rule written out: the longest p <= limit, a multiple of every group's page size,
// such that every page [first_required_page(p), p / P) of every group is available.
template <class Avail>
std::uint64_t model_hit(const KVCacheManager& kv, std::uint64_t limit, Avail avail) {
  for (std::uint64_t p = limit; p > 0; --p) {
    bool ok = true;
    for (GroupId g = 0; g < kv.layout().num_groups() && ok; ++g) {
      const std::uint32_t P = kv.layout().group(g).tokens_per_page;
      if (p % P != 0) {
        ok = false;
        break;
      }
      const std::uint64_t pages = p / P;
      for (std::uint64_t i = std::min(kv.policy(g).first_required_page(p), pages); i < pages && ok; ++i)
        ok = avail(g, i);
    }
    if (ok) return p;
  }
  return 0;
}

struct TierModel {
  std::map<CachedBlock, bool> present;  // per key: does the tier hold it (decided once)
  std::mt19937_64 rng;
  double hold = 0.8;
  bool holds(const CachedBlock& b) {
    auto [it, fresh] = present.try_emplace(b, false);
    if (fresh) it->second = std::uniform_real_distribution<>(0, 1)(rng) < hold;
    return it->second;
  }
};

// One admission through a tier, checked against the model at every call. Returns the
// request's computed tokens after its loads (or after admission when nothing loads);
// ~0 when the admission was refused (the request was reset).
std::uint64_t admit_through_tier(KVCacheManager& kv, RequestId r, TierModel& tier, std::mt19937_64& rng,
                                 std::uint64_t* loads_failed = nullptr) {
  TierAdmission adm(kv);
  const std::uint64_t limit = kv.num_tokens(r) > 0 ? kv.num_tokens(r) - 1 : 0;
  const std::set<CachedBlock> cached = cached_blocks(kv);
  auto hash = [&](GroupId g, std::uint64_t i) { return adm.block_hashes(r, g)[i]; };
  auto local = [&](GroupId g, std::uint64_t i) { return cached.count(block_of(g, hash(g, i))) > 0; };
  const std::uint64_t first = kv.lookup_prefix(r);
  REQUIRE(first == model_hit(kv, limit, local));
  std::vector<TierKey> keys;
  const std::size_t n = adm.tier_candidates(r, keys);
  REQUIRE(n == keys.size());
  // The candidates: every decoder group's pages [hit / P, limit / P), in order.
  std::size_t k = 0;
  for (GroupId g = 0; g < kv.layout().num_groups(); ++g) {
    const std::uint32_t P = kv.layout().group(g).tokens_per_page;
    for (std::uint64_t i = first / P; i < limit / P; ++i, ++k) {
      REQUIRE(k < keys.size());
      REQUIRE(keys[k].group == g);
      REQUIRE(keys[k].hash == hash(g, i));
    }
  }
  REQUIRE(k == keys.size());
  std::vector<TierStatus> st(n);
  for (std::size_t j = 0; j < n; ++j) {
    const bool has = tier.holds(block_of(keys[j].group, keys[j].hash));
    const TierStatus other[] = {TierStatus::kMiss, TierStatus::kTimeout, TierStatus::kUnavailable};
    st[j] = has ? TierStatus::kOk : other[rng() % 3];
  }
  if (rng() % 4 == 0) {  // another request's lookup in between: extend_prefix must look r up again
    const RequestId o = kv.add_request(std::vector<std::uint32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9});
    kv.lookup_prefix(o);
    kv.free(o);
  }
  auto in_tier = [&](GroupId g, std::uint64_t i) {
    const std::uint32_t P = kv.layout().group(g).tokens_per_page;
    if (i < first / P) return false;
    std::uint64_t off = 0;
    for (GroupId h = 0; h < g; ++h) {
      const std::uint32_t Ph = kv.layout().group(h).tokens_per_page;
      off += limit / Ph > first / Ph ? limit / Ph - first / Ph : 0;
    }
    return st[off + i - first / P] == TierStatus::kOk;
  };
  const std::uint64_t e = adm.extend_prefix(r, st);
  REQUIRE(e == model_hit(kv, limit, [&](GroupId g, std::uint64_t i) { return local(g, i) || in_tier(g, i); }));
  REQUIRE(e >= first);
  const auto extra = static_cast<std::uint32_t>(rng() % 3 == 0 ? rng() % 9 : 0);
  if (!kv.allocate(r, std::min<std::uint64_t>(extra, kv.num_tokens(r) - e))) {
    REQUIRE_FALSE(adm.is_loading(r));
    kv.check_invariants();
    kv.reset(r);
    kv.check_invariants();
    return ~std::uint64_t{0};
  }
  kv.check_invariants();
  // The loads: each page the hit needs past the local part that is not cached here.
  std::set<std::pair<GroupId, std::uint64_t>> want;
  for (GroupId g = 0; g < kv.layout().num_groups(); ++g) {
    const std::uint32_t P = kv.layout().group(g).tokens_per_page;
    for (std::uint64_t i = std::max(first / P, kv.policy(g).first_required_page(e)); i < e / P; ++i)
      if (!local(g, i)) want.insert({g, i});
  }
  if (want.empty()) {
    REQUIRE_FALSE(adm.is_loading(r));
    REQUIRE(kv.num_computed(r) == e);
    return e;
  }
  REQUIRE(adm.is_loading(r));
  REQUIRE(kv.num_computed(r) < e);
  const std::span<const TierLoad> loads = adm.tier_loads(r);
  REQUIRE(loads.size() == want.size());
  std::set<std::pair<GroupId, std::uint64_t>> got, failed;
  std::vector<TierStatus> out(loads.size(), TierStatus::kOk);
  for (std::size_t j = 0; j < loads.size(); ++j) {
    const GroupId g = loads[j].key.group;
    const auto& chain = adm.block_hashes(r, g);
    const auto idx =
        static_cast<std::uint64_t>(std::find(chain.begin(), chain.end(), loads[j].key.hash) - chain.begin());
    REQUIRE(idx < chain.size());
    got.insert({g, idx});
    REQUIRE(kv.page_table(r, g)[idx] == loads[j].page);
    if (rng() % 6 == 0) {
      const TierStatus bad[] = {TierStatus::kMiss, TierStatus::kCorrupt, TierStatus::kTimeout,
                                TierStatus::kUnavailable};
      out[j] = bad[rng() % 4];
      failed.insert({g, idx});
    }
  }
  REQUIRE(got == want);
  // Calls a loading request refuses, state unchanged.
  REQUIRE_THROWS_AS(kv.commit(r, kv.num_computed(r)), Error);
  REQUIRE_THROWS_AS(kv.allocate(r, 1), Error);
  REQUIRE_THROWS_AS(kv.fork(r), Error);
  REQUIRE_THROWS_AS(adm.finish_loads(r, std::span<const TierStatus>(out).first(out.size() - 1)), Error);
  REQUIRE(adm.is_loading(r));
  if (rng() % 20 == 0) {  // given up while loading (its copies are done)
    kv.free(r);
    kv.check_invariants();
    return ~std::uint64_t{0} - 1;
  }
  const std::uint64_t before = kv.num_allocated(r);
  const std::uint64_t h = adm.finish_loads(r, out);
  const std::uint64_t expect = model_hit(kv, e, [&](GroupId g, std::uint64_t i) {
    const std::uint32_t P = kv.layout().group(g).tokens_per_page;
    if (i < first / P) return local(g, i);
    if (i < kv.policy(g).first_required_page(e)) return false;
    return local(g, i) || failed.count({g, i}) == 0;
  });
  REQUIRE(h == expect);
  REQUIRE(kv.num_computed(r) == h);
  REQUIRE(kv.num_allocated(r) == (h < e ? h : before));
  REQUIRE_FALSE(adm.is_loading(r));
  kv.check_invariants();
  // No failed page is cached; every loaded page the hit kept is.
  const std::set<CachedBlock> after = cached_blocks(kv);
  for (const auto& [g, i] : failed) REQUIRE(after.count(block_of(g, hash(g, i))) == 0);
  for (const auto& [g, i] : got) {
    const std::uint32_t P = kv.layout().group(g).tokens_per_page;
    if (failed.count({g, i}) == 0 && i < h / P) REQUIRE(after.count(block_of(g, hash(g, i))) == 1);
  }
  if (loads_failed) *loads_failed += failed.size();
  return h;
}

// Runs r's prompt to its end (chunks of up to 16 tokens) and a few decode tokens.
bool run_request(KVCacheManager& kv, RequestId r, std::uint32_t decode, std::uint32_t next_id) {
  while (kv.num_computed(r) < kv.num_tokens(r)) {
    const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(16, kv.num_tokens(r) - kv.num_computed(r)));
    if (!kv.allocate(r, n)) return false;
    kv.commit(r, kv.num_computed(r) + n);
    kv.check_invariants();
  }
  for (std::uint32_t k = 0; k < decode; ++k) {
    kv.append_token(r, next_id + k);
    if (!kv.allocate(r, 1)) return false;
    kv.commit(r, kv.num_computed(r) + 1);
  }
  kv.check_invariants();
  return true;
}

}  // namespace

TEST_CASE("tier hits: worked example on full + sliding window + Mamba", "[manager][tier]") {
  KVCacheManager kv(tier_layout(), {.num_large_pages = 64, .max_requests = 8});
  TierAdmission adm(kv);
  // 41 tokens: limit 40; pages of 4 (full, sw), checkpoints every 8 (Mamba).
  std::vector<std::uint32_t> prompt(41);
  for (std::uint32_t i = 0; i < prompt.size(); ++i) prompt[i] = 1000 + i;
  const RequestId r = kv.add_request(prompt);
  REQUIRE(kv.lookup_prefix(r) == 0);
  std::vector<TierKey> keys;
  REQUIRE(adm.tier_candidates(r, keys) == 10 + 10 + 5);
  // The tier holds everything: the hit is 40 tokens; the loads are what 40 needs: all 10
  // full pages, the sliding window's pages covering tokens [28, 40) (7..9: first_required
  // 40 - 12 = 28 -> page 7), Mamba's checkpoint after token 39 (page 4).
  std::vector<TierStatus> all(keys.size(), TierStatus::kOk);
  REQUIRE(adm.extend_prefix(r, all) == 40);
  REQUIRE(kv.num_computed(r) == 40);
  REQUIRE(kv.allocate(r, 0));
  REQUIRE(adm.is_loading(r));
  REQUIRE(kv.num_computed(r) == 0);
  const auto loads = adm.tier_loads(r);
  std::vector<std::uint32_t> per_group(3, 0);
  for (const TierLoad& l : loads) ++per_group[l.key.group];
  REQUIRE(per_group == std::vector<std::uint32_t>{10, 3, 1});
  REQUIRE(kv.page_table(r, 1)[6] == kNullPage);  // below the window: never allocated
  kv.check_invariants();
  // Full page 6 fails: the full group serves 24 tokens; the sliding window would need
  // pages 3..5 for 24, which it never loaded (below what 40 needs): the hit falls to the
  // longest prefix every group has: 0. Mamba's only checkpoint is at 40 as well.
  std::vector<TierStatus> st(loads.size(), TierStatus::kOk);
  st[6] = TierStatus::kCorrupt;
  REQUIRE(adm.finish_loads(r, st) == 0);
  REQUIRE(kv.num_allocated(r) == 0);
  REQUIRE(kv.counters().tier_failed_pages == 1);
  REQUIRE(kv.counters().tier_loaded_pages == 13);
  REQUIRE(kv.counters().tier_cut_tokens == 40);
  REQUIRE(cached_blocks(kv).empty());
  kv.check_invariants();
  REQUIRE(run_request(kv, r, 0, 0));

  // A second request with the same prompt and a longer one: everything local now.
  const RequestId r2 = kv.add_request(prompt);
  REQUIRE(kv.lookup_prefix(r2) == 40);
  keys.clear();
  REQUIRE(adm.tier_candidates(r2, keys) == 0);
  REQUIRE(adm.extend_prefix(r2, {}) == 40);
  REQUIRE(kv.allocate(r2, 1));
  REQUIRE_FALSE(adm.is_loading(r2));
  REQUIRE(kv.num_computed(r2) == 40);
  kv.check_invariants();
}

TEST_CASE("tier hits: all loads verified, then the pages are cached", "[manager][tier]") {
  KVCacheManager kv(tier_layout(), {.num_large_pages = 64, .max_requests = 8, .record_kv_events = true});
  TierAdmission adm(kv);
  std::vector<std::uint32_t> prompt(41);
  for (std::uint32_t i = 0; i < prompt.size(); ++i) prompt[i] = 7 + i;
  const RequestId r = kv.add_request(prompt);
  kv.lookup_prefix(r);
  std::vector<TierKey> keys;
  adm.tier_candidates(r, keys);
  REQUIRE(adm.extend_prefix(r, std::vector<TierStatus>(keys.size(), TierStatus::kOk)) == 40);
  REQUIRE(kv.allocate(r, 1));
  std::vector<TierStatus> ok(adm.tier_loads(r).size(), TierStatus::kOk);
  REQUIRE(adm.finish_loads(r, ok) == 40);
  REQUIRE(kv.num_allocated(r) == 41);  // the token allocate scheduled past the hit stays
  REQUIRE(kv.counters().tier_hit_tokens == 40);
  kv.check_invariants();
  // The router hears of the loaded pages as of computed ones.
  KvEventBatch b;
  kv.take_events(b);
  std::uint64_t stored = 0;
  for (const KvEvent& ev : b.events) stored += ev.kind == KvEventKind::kStored ? ev.num_pages : 0;
  REQUIRE(stored == 14);
  kv.commit(r, 41);
  kv.free(r);
  const RequestId r2 = kv.add_request(prompt);
  REQUIRE(kv.lookup_prefix(r2) == 40);
  kv.check_invariants();
}

TEST_CASE("tier hits: bad input and misuse raise, state unchanged", "[manager][tier]") {
  KVCacheManager kv(tier_layout(), {.num_large_pages = 64, .max_requests = 8});
  TierAdmission adm(kv);
  std::vector<std::uint32_t> prompt(41, 5);
  const RequestId r = kv.add_request(prompt);
  std::vector<TierKey> keys;
  REQUIRE_THAT(error_of([&] { adm.tier_candidates(r, keys); }), Catch::Contains("after lookup_prefix"));
  REQUIRE_THAT(error_of([&] { adm.extend_prefix(r, {}); }), Catch::Contains("must follow its tier_candidates"));
  kv.lookup_prefix(r);
  adm.tier_candidates(r, keys);
  const std::vector<TierStatus> few(keys.size() - 1, TierStatus::kOk);
  REQUIRE_THAT(error_of([&] { adm.extend_prefix(r, few); }), Catch::Contains("present.size() = 24"));
  REQUIRE_THAT(error_of([&] { adm.finish_loads(r, {}); }), Catch::Contains("not loading"));
  REQUIRE_THAT(error_of([&] { (void)adm.block_hashes(r, 7); }), Catch::Contains("group = 7"));
  REQUIRE(adm.extend_prefix(r, std::vector<TierStatus>(keys.size(), TierStatus::kMiss)) == 0);
  REQUIRE(kv.allocate(r, 8));
  REQUIRE_FALSE(adm.is_loading(r));
  REQUIRE(adm.tier_loads(r).empty());
  kv.check_invariants();
}

TEST_CASE("tier hits: random traffic against the model", "[manager][tier][random]") {
  const std::uint64_t seed = GENERATE(1, 2, 3, 4);
  std::mt19937_64 rng(seed);
  TierModel tier{{}, std::mt19937_64(seed * 7 + 1), seed % 2 ? 0.9 : 0.6};
  KVCacheManager kv(tier_layout(), {.num_large_pages = 24, .max_requests = 16});
  std::vector<std::vector<std::uint32_t>> docs(6);
  for (std::size_t d = 0; d < docs.size(); ++d)
    for (std::uint32_t i = 0, n = 16 + static_cast<std::uint32_t>(rng() % 48); i < n; ++i)
      docs[d].push_back(static_cast<std::uint32_t>(d * 1000 + i));
  std::vector<RequestId> live;
  std::uint64_t admitted = 0, loaded_hits = 0, cut = 0, failed = 0, ops = 0;
  for (int it = 0; it < 1500; ++it) {
    // Some documents leave the local cache as if another replica computed them: a new
    // manager would be cleaner, but a reset of the prefix cache keeps the traffic going.
    if (rng() % 100 == 0) kv.reset_prefix_cache();
    if (live.size() >= 4 || (!live.empty() && rng() % 3 == 0)) {
      const std::size_t k = rng() % live.size();
      kv.free(live[k]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      kv.check_invariants();
      continue;
    }
    std::vector<std::uint32_t> prompt = docs[rng() % docs.size()];
    prompt.resize(std::max<std::size_t>(2, prompt.size() - rng() % 8));
    for (std::uint32_t j = 0, n = static_cast<std::uint32_t>(rng() % 12); j < n; ++j)
      prompt.push_back(static_cast<std::uint32_t>(900000 + rng() % 50));
    const RequestId r = kv.add_request(prompt);
    kv.begin_step();
    const std::uint64_t h = admit_through_tier(kv, r, tier, rng, &failed);
    ++ops;
    if (h == ~std::uint64_t{0} - 1) continue;  // freed while loading
    if (h == ~std::uint64_t{0} || !run_request(kv, r, static_cast<std::uint32_t>(rng() % 6), 77)) {
      kv.free(r);  // refused (reset) or out of memory mid-way: give it up
      kv.check_invariants();
      continue;
    }
    ++admitted;
    loaded_hits += h > 0;
    cut += kv.counters().tier_cut_tokens > 0;
    live.push_back(r);
  }
  INFO("seed " << seed << " admitted " << admitted << " with hits " << loaded_hits << " failed loads " << failed);
  REQUIRE(admitted > 300);
  REQUIRE(loaded_hits > 100);
  REQUIRE(failed > 20);
  REQUIRE(kv.counters().tier_loaded_pages > 100);
  REQUIRE(kv.counters().tier_cut_tokens > 0);
  (void)cut;
  (void)ops;
}
