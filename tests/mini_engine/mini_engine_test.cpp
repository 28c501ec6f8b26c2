// The mini engine end to end: whatever kvmm does with memory (prefix hits, evictions,
// preemption by recompute or swap, forks with copy-on-write, virtual tensors), the
// generated tokens are bit-identical to a run with caching off and memory to spare.
#include "mini_engine.hpp"

#include "kvmm/distributed/page_descriptors.hpp"
#include "kvmm/error.hpp"
#include "support/cached_blocks.hpp"

#include <catch2/catch.hpp>

#include <set>
#include <string>

namespace {

using mini::Output;
using mini::Request;

mini::Model& model() {
  static mini::Model m{mini::ModelConfig{}};
  return m;
}

std::vector<Request> workload(std::uint64_t seed, std::uint32_t count = 18) {
  return mini::shared_prefix_workload(count, model().config().vocab, seed);
}

std::uint32_t samples(const std::vector<Request>& w) {
  std::uint32_t n = 0;
  for (const Request& r : w) n += r.n;
  return n;
}

// Wraps the CPU kernels and counts the calls, to see that the engine goes through the seam.
struct CountingOps final : mini::DeviceOps {
  mini::CpuOps cpu;
  std::uint32_t writes = 0, attentions = 0, copies = 0, swaps = 0;
  void write_kv(const kvmm::kernels::PagedWriteParams& p) override { ++writes, cpu.write_kv(p); }
  void attention(const kvmm::kernels::PagedAttentionParams& p, bool prefill) override {
    ++attentions, cpu.attention(p, prefill);
  }
  void copy_pages(const kvmm::kernels::PageCopyParams& p) override { ++copies, cpu.copy_pages(p); }
  void swap_pages(const kvmm::kernels::PageCopyParams& p) override { ++swaps, cpu.swap_pages(p); }
};

// Runs every step with the manager's invariant check after each; at the end nothing is
// active and no page is used.
std::vector<Output> run_checked(mini::Engine& e) {
  while (e.step()) e.manager().check_invariants();
  std::vector<Output> out = e.run();  // collects the outputs (no step left)
  const kvmm::CacheStats s = e.manager().stats();
  CHECK(e.manager().num_active() == 0);
  CHECK(e.num_unfinished() == 0);
  for (const kvmm::GroupStats& g : s.groups) {
    CHECK(g.used_pages == 0);
    CHECK(g.allocated_bytes == 0);
  }
  return out;
}

std::vector<Output> serve(const std::vector<Request>& w, const mini::EngineOptions& o,
                          mini::EngineStats* stats = nullptr) {
  mini::Engine e(model(), o);
  for (const Request& r : w) e.submit(r);
  std::vector<Output> out = run_checked(e);
  if (stats) *stats = e.stats();
  return out;
}

// The baseline: no prefix caching, memory for everything, one request at a time.
std::vector<Output> baseline(const std::vector<Request>& w) {
  return serve(w, {.num_large_pages = 512, .prefix_caching = false, .max_running = 1, .token_budget = 64});
}

void check_complete(const std::vector<Request>& w, const std::vector<Output>& out) {
  REQUIRE(out.size() == samples(w));
  for (const Output& o : out) CHECK(o.tokens.size() == w[o.request].max_new_tokens);
}

}  // namespace

TEST_CASE("baseline outputs are complete and depend on the prompt", "[mini_engine]") {
  const std::vector<Request> w = workload(1);
  const std::vector<Output> a = baseline(w);
  check_complete(w, a);
  // Not a constant model: many distinct tokens, and distinct continuations.
  std::set<std::uint32_t> distinct;
  std::set<std::vector<std::uint32_t>> continuations;
  for (const Output& o : a) {
    distinct.insert(o.tokens.begin(), o.tokens.end());
    continuations.insert(o.tokens);
  }
  CHECK(distinct.size() > 20);
  CHECK(continuations.size() > a.size() / 2);
  // The same run again is bit-identical (seeded weights, no hidden state).
  CHECK(baseline(w) == a);
}

TEST_CASE("prefix caching on: hits in every group, same tokens", "[mini_engine]") {
  const std::vector<Request> w = workload(2);
  const std::vector<Output> a = baseline(w);
  mini::EngineStats off, on;
  const std::vector<Output> b = serve(w, {.num_large_pages = 512, .prefix_caching = false}, &off);
  const std::vector<Output> c = serve(w, {.num_large_pages = 512, .prefix_caching = true}, &on);
  CHECK(off.hit_tokens == 0);
  CHECK(on.hit_tokens > 0);
  for (const mini::GroupReport& g : on.groups) CHECK(g.hit_pages > 0);
  CHECK(on.prefill_tokens < off.prefill_tokens);  // the hits were not recomputed
  CHECK(b == a);
  CHECK(c == a);
}

TEST_CASE("memory pressure: evictions, recompute and swap preemptions, same tokens, nothing lost or leaked",
          "[mini_engine]") {
  const std::vector<Request> w = workload(3, 24);
  const std::vector<Output> a = baseline(w);
  auto ops = std::make_unique<CountingOps>();
  CountingOps& count = *ops;
  mini::Engine e(model(), {.num_large_pages = 40, .num_host_large_pages = 8}, std::move(ops));
  for (const Request& r : w) e.submit(r);
  const std::vector<Output> c = run_checked(e);
  const mini::EngineStats& s = e.stats();
  CHECK(s.preempt_recompute > 0);
  CHECK(s.preempt_swap > 0);
  CHECK(s.swap_ins == s.preempt_swap);
  CHECK(s.cow_copies > 0);
  CHECK(s.hit_tokens > 0);
  for (const mini::GroupReport& g : s.groups) CHECK(g.evicted_pages > 0);
  CHECK(s.requests_finished == samples(w));
  CHECK(count.swaps > 0);
  CHECK(count.copies > 0);
  CHECK(count.writes > 0);
  CHECK(count.attentions == count.writes);
  check_complete(w, c);
  CHECK(c == a);
}

// Records the order of every cache the engine hands the kernels, then runs the CPU kernels.
struct OrderOps final : mini::DeviceOps {
  mini::CpuOps cpu;
  std::set<kvmm::KVOrder> writes, attentions;
  std::uint32_t swaps = 0;
  void write_kv(const kvmm::kernels::PagedWriteParams& p) override { writes.insert(p.cache.order), cpu.write_kv(p); }
  void attention(const kvmm::kernels::PagedAttentionParams& p, bool prefill) override {
    attentions.insert(p.cache.order), cpu.attention(p, prefill);
  }
  void copy_pages(const kvmm::kernels::PageCopyParams& p) override { cpu.copy_pages(p); }
  void swap_pages(const kvmm::kernels::PageCopyParams& p) override { ++swaps, cpu.swap_pages(p); }
};

TEST_CASE("head-major attention pages (ModelConfig::kv_order) give the same tokens, under pressure too",
          "[mini_engine]") {
  mini::ModelConfig cfg;
  cfg.kv_heads = 2;  // with one kv head both orders are the same bytes
  mini::Model nhd(cfg);
  cfg.kv_order = kvmm::KVOrder::kHeadMajor;
  mini::Model hnd(cfg);
  const kvmm::KVLayout ln = nhd.layout(), lh = hnd.layout();
  REQUIRE(lh.num_groups() == ln.num_groups());
  for (kvmm::GroupId g = 0; g < lh.num_groups(); ++g) {
    CHECK(lh.group(g).kv_order == (lh.group(g).is_state() ? kvmm::KVOrder::kTokenMajor : kvmm::KVOrder::kHeadMajor));
    CHECK(lh.small_page_bytes(g) == ln.small_page_bytes(g));
  }
  CHECK(kvmm::layout_fingerprint(lh) != kvmm::layout_fingerprint(ln));
  const std::vector<Request> w = mini::shared_prefix_workload(24, cfg.vocab, 3);
  for (const std::uint32_t pages : {512u, 40u}) {
    INFO(pages << " large pages");
    std::vector<Output> out[2];
    std::uint32_t swaps[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      const kvmm::KVOrder order = i == 0 ? kvmm::KVOrder::kTokenMajor : kvmm::KVOrder::kHeadMajor;
      auto ops = std::make_unique<OrderOps>();
      OrderOps& seen = *ops;
      mini::Engine e(i == 0 ? nhd : hnd, {.num_large_pages = pages, .num_host_large_pages = 8}, std::move(ops));
      for (const Request& r : w) e.submit(r);
      out[i] = run_checked(e);
      CHECK(seen.writes == std::set<kvmm::KVOrder>{order});
      CHECK(seen.attentions == std::set<kvmm::KVOrder>{order});
      swaps[i] = seen.swaps;
    }
    check_complete(w, out[1]);
    CHECK(out[1] == out[0]);
    if (pages == 40) CHECK(swaps[1] > 0);  // swapped pages came back in the same order
  }
}

TEST_CASE("KV events: after every step the engine's batches describe its cached set; same tokens",
          "[mini_engine][events]") {
  const std::vector<Request> w = workload(3, 24);
  std::set<kvmm::test::CachedBlock> router;
  std::uint64_t batches = 0, stored = 0, removed = 0;
  mini::EngineOptions o{.num_large_pages = 40, .num_host_large_pages = 8};
  o.kv_events = [&](const kvmm::KvEventBatch& b) {
    ++batches;
    for (const kvmm::KvEvent& e : b.events) {
      if (e.kind == kvmm::KvEventKind::kCleared) router.clear();
      for (const kvmm::BlockHash& h : b.hashes_of(e)) {
        if (e.kind == kvmm::KvEventKind::kStored)
          stored += router.insert({e.group, {h.lo, h.hi}}).second;
        else
          removed += router.erase({e.group, {h.lo, h.hi}});
      }
    }
  };
  mini::Engine e(model(), o);
  for (const Request& r : w) e.submit(r);
  while (e.step()) REQUIRE(router == kvmm::test::cached_blocks(e.manager()));
  CHECK(e.run() == baseline(w));
  CHECK(batches > 10);
  CHECK(stored > 100);
  CHECK(removed > 100);  // under pressure: evictions were reported
}

TEST_CASE("an elastically backed arena (the manager over ArenaPagePool) gives the same tokens", "[mini_engine]") {
  const std::vector<Request> w = workload(3, 24);
  const std::vector<Output> a = baseline(w);
  // 40 large pages of the arena; only some of its chunks may be backed at once, so
  // allocations meet backing failures and fall back on eviction and preemption.
  for (const std::uint32_t max_chunks : {0u, 14u}) {
    mini::Engine e(
        model(),
        {.num_large_pages = 40, .num_host_large_pages = 8, .elastic_arena = true, .max_backed_chunks = max_chunks});
    for (const Request& r : w) e.submit(r);
    std::uint32_t peak_chunks = 0;
    while (e.step()) {
      e.manager().check_invariants();
      peak_chunks = std::max(peak_chunks, e.arena().num_backed_chunks());
    }
    const std::vector<Output> c = e.run();
    INFO("max_backed_chunks " << max_chunks);
    check_complete(w, c);
    CHECK(c == a);
    CHECK(peak_chunks > 0);
    WARN("peak backed chunks " << peak_chunks << " of " << e.arena().num_chunks());
    if (max_chunks != 0) CHECK(peak_chunks <= max_chunks);
  }
}

TEST_CASE("batching and chunking do not change tokens (seeded random configurations)", "[mini_engine]") {
  const std::vector<Request> w = workload(4, 12);
  const std::vector<Output> a = baseline(w);
  std::uint64_t rng = 99;
  auto below = [&](std::uint32_t n) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::uint32_t>((rng >> 33) % n);
  };
  for (int trial = 0; trial < 6; ++trial) {
    const mini::EngineOptions o{.num_large_pages = 36 + below(60),
                                .num_host_large_pages = below(3) * 8,
                                .prefix_caching = below(4) != 0,
                                .max_running = 1 + below(8),
                                .token_budget = 1 + below(24)};
    INFO("trial " << trial << ": large pages " << o.num_large_pages << ", host " << o.num_host_large_pages
                  << ", caching " << o.prefix_caching << ", running " << o.max_running << ", budget "
                  << o.token_budget);
    CHECK(serve(w, o) == a);
  }
}

TEST_CASE("the vAttention path (virtual tensors, contiguous kernels) gives the same tokens", "[mini_engine]") {
  const std::vector<Request> w = workload(5);
  const std::vector<Output> a = baseline(w);
  mini::VAttentionEngine v(model(), {.max_batch = 4, .max_context = 64, .token_budget = 12});
  for (const Request& r : w) v.submit(r);
  const std::vector<Output> b = v.run();
  v.cache().check_invariants();
  CHECK(v.cache().stats().steps > 0);
  for (std::uint32_t slot = 0; slot < 4; ++slot) CHECK_FALSE(v.cache().active(slot));
  check_complete(w, b);
  CHECK(b == a);
}

TEST_CASE("forked parallel samples equal independent runs", "[mini_engine]") {
  std::vector<Request> forked = workload(6, 8);
  std::vector<Request> independent;
  for (Request& r : forked) {
    r.n = 3;
    for (std::uint32_t k = 0; k < r.n; ++k) {
      Request one = r;
      one.n = 1;
      one.first_rank = k;
      independent.push_back(one);
    }
  }
  mini::EngineStats fs;
  const std::vector<Output> f = serve(forked, {.num_large_pages = 256}, &fs);
  const std::vector<Output> ind = serve(independent, {.num_large_pages = 256, .prefix_caching = false});
  CHECK(fs.forks == 2 * forked.size());
  CHECK(fs.cow_copies > 0);  // prompts not a multiple of the page size share a partial page
  REQUIRE(f.size() == ind.size());
  for (std::size_t i = 0; i < f.size(); ++i) {
    INFO("request " << f[i].request << " sample " << f[i].sample);
    CHECK(f[i].tokens == ind[i].tokens);
  }
  // The samples of one request differ (their first tokens are the 1st, 2nd, 3rd best).
  for (std::size_t i = 0; i + 2 < f.size(); i += 3) {
    CHECK(f[i].tokens[0] != f[i + 1].tokens[0]);
    CHECK(f[i + 1].tokens[0] != f[i + 2].tokens[0]);
  }
  // And under memory pressure (swapping and recomputing forked children) too.
  CHECK(serve(forked, {.num_large_pages = 40, .num_host_large_pages = 8}) == f);
}

TEST_CASE("misuse raises kvmm::Error naming the argument; the engine is unchanged", "[mini_engine]") {
  mini::Engine e(model(), {.num_large_pages = 16});
  Request ok{.prompt = {1, 2, 3}, .max_new_tokens = 2};
  e.submit(ok);
  auto raises = [&](const Request& r, const std::string& what) {
    try {
      e.submit(r);
      FAIL("no error for " << what);
    } catch (const kvmm::Error& err) {
      CHECK_THAT(err.what(), Catch::Contains(what));
    }
    CHECK(e.num_unfinished() == 1);
  };
  raises(Request{.prompt = {}, .max_new_tokens = 2}, "request.prompt");
  raises(Request{.prompt = {1}, .max_new_tokens = 0}, "request.max_new_tokens = 0");
  raises(Request{.prompt = {1}, .max_new_tokens = 1, .n = 0}, "request.n = 0");
  CHECK_THROWS_WITH(mini::Engine(model(), {.token_budget = 0}), Catch::Contains("options.token_budget = 0"));
  // A token id outside the vocabulary is caught by the model before any KV is written.
  mini::Engine bad(model(), {.num_large_pages = 16});
  bad.submit(Request{.prompt = {1, 500}, .max_new_tokens = 1});
  CHECK_THROWS_WITH(bad.step(), Catch::Contains("tokens[1] = 500"));
  // A request that cannot fit in device memory is reported, not looped on.
  mini::Engine tiny(model(), {.num_large_pages = 2, .token_budget = 64});
  tiny.submit(Request{.prompt = std::vector<std::uint32_t>(40, 3), .max_new_tokens = 1});
  CHECK_THROWS_WITH(tiny.step(), Catch::Contains("do not fit"));
  // Also when the first prefill chunks fit and a later one does not.
  mini::Engine chunked(model(), {.num_large_pages = 4, .token_budget = 4});
  chunked.submit(Request{.prompt = std::vector<std::uint32_t>(40, 3), .max_new_tokens = 1});
  CHECK(chunked.step());
  CHECK_THROWS_WITH(
      [&] {
        while (chunked.step()) {
        }
      }(),
      Catch::Contains("do not fit"));
  // The good request still runs to completion.
  const std::vector<Output> out = e.run();
  REQUIRE(out.size() == 1);
  CHECK(out[0].tokens.size() == 2);
}
