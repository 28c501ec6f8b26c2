// Two mini engines (examples/mini_engine) sharing KV pages through a real redis-server:
// engine A computes and stores, a fresh engine B loads the shared prefixes. B's tier hits
// must be exactly where A's pages are, every loaded page byte-identical to A's, every load
// finished, the manager's invariants hold after every step, and B's tokens equal a run
// without a tier. Then the faults at the engine level (SIGKILL mid-put and mid-get, SIGSTOP
// past the timeout, values corrupted in place, keys evicted between contains and get, a
// cut connection): each step returns within the tier's bounds, nothing corrupt is loaded,
// the tokens stay those of the run without a tier, and once the server is back a further
// pair of runs gets tier hits again.
#include "mini_engine.hpp"
#include "tier_fixture.hpp"

#include <functional>
#include <map>
#include <thread>

using namespace kvmm;
using namespace kvmm::test;
using namespace std::chrono_literals;

namespace {

constexpr auto kStepBound = kBound;  // a step waits on nothing: at most what one completion may take

mini::Model& model() {
  static mini::Model m{mini::ModelConfig{}};
  return m;
}

std::unique_ptr<KVTier> engine_tier(const std::string& endpoint) {
  RedisTierOptions o = fault_options(endpoint);
  o.notify_when_armed = true;  // the engine arms event_fd() before it sleeps on it
  return make_redis_tier(model().layout(), {.model_id = "mini-hybrid@seed42", .dtype = "float16"}, o);
}

// Forwards to a tier and calls `hook(op, index of that op's submission, before)` around each
// submission; the time spent in the hook is not the engine's.
class HookTier final : public KVTier {
 public:
  explicit HookTier(KVTier& inner) : inner_(inner) {}
  std::function<void(TierOp, int, bool)> hook;
  std::chrono::nanoseconds hook_time{0};
  TierTicket contains(std::span<const TierKey> k) override {
    return around(TierOp::kContains, [&] { return inner_.contains(k); });
  }
  TierTicket get(std::span<const TierPage> p) override {
    return around(TierOp::kGet, [&] { return inner_.get(p); });
  }
  TierTicket put(std::span<const TierPage> p) override {
    return around(TierOp::kPut, [&] { return inner_.put(p); });
  }
  TierTicket remove(std::span<const TierKey> k) override {
    return around(TierOp::kRemove, [&] { return inner_.remove(k); });
  }
  std::size_t poll(TierResults& out) override { return inner_.poll(out); }
  int event_fd() const override { return inner_.event_fd(); }
  bool arm() override { return inner_.arm(); }
  TierHealth health() const override { return inner_.health(); }
  std::uint64_t scope() const override { return inner_.scope(); }

 private:
  template <class F>
  TierTicket around(TierOp op, F submit) {
    const int n = count_[static_cast<int>(op)]++;
    call(op, n, true);
    const TierTicket t = submit();
    call(op, n, false);
    return t;
  }
  void call(TierOp op, int n, bool before) {
    if (!hook) return;
    const auto t0 = std::chrono::steady_clock::now();
    hook(op, n, before);
    hook_time += std::chrono::steady_clock::now() - t0;
  }
  KVTier& inner_;
  int count_[4] = {};
};

using PageMap = std::map<std::pair<GroupId, std::pair<std::uint64_t, std::uint64_t>>, std::vector<std::byte>>;
auto page_id(const TierKey& k) { return std::make_pair(k.group, std::make_pair(k.hash.hi, k.hash.lo)); }

struct RunResult {
  std::vector<mini::Output> out;
  mini::EngineStats stats;
  std::chrono::nanoseconds longest_step{0};
};

// Runs `work` on a fresh engine (own arena and manager) with `tier` (may be null), stepping
// by hand: invariants after every step, each step's wall time (less the hook's), waiting on
// the tier's event fd while only it has work. `stored`: pages A put; `loaded_from`: pages B
// loaded must equal those.
RunResult run_engine(const std::vector<mini::Request>& work, KVTier* tier, PageMap* stored = nullptr,
                     const PageMap* loaded_from = nullptr, HookTier* hooks = nullptr) {
  mini::Model m{mini::ModelConfig{}};
  mini::EngineOptions o{.num_large_pages = 256, .max_requests = 64, .tier = tier};
  std::uint64_t checked = 0;
  o.tier_page = [&](const TierKey& key, std::span<const std::byte> bytes, bool is_store) {
    if (is_store && stored) stored->emplace(page_id(key), std::vector<std::byte>(bytes.begin(), bytes.end()));
    if (!is_store && loaded_from) {
      const auto it = loaded_from->find(page_id(key));  // CHECK: no exception through the engine
      CHECK(it != loaded_from->end());
      if (it != loaded_from->end() && std::equal(bytes.begin(), bytes.end(), it->second.begin(), it->second.end()))
        ++checked;
    }
  };
  mini::Engine e(m, o);
  for (const mini::Request& r : work) e.submit(r);
  RunResult res;
  for (bool more = true; more;) {
    const auto hook0 = hooks ? hooks->hook_time : std::chrono::nanoseconds{0};
    const auto t0 = std::chrono::steady_clock::now();
    more = e.step();
    const auto took = std::chrono::steady_clock::now() - t0 - ((hooks ? hooks->hook_time : hook0) - hook0);
    res.longest_step = std::max(res.longest_step, std::chrono::duration_cast<std::chrono::nanoseconds>(took));
    e.manager().check_invariants();
    if (more && e.idle()) e.wait_tier(20ms);
  }
  REQUIRE(e.drain_tier(5s));
  res.out = e.run();  // nothing left to step: collects the outputs
  res.stats = e.stats();
  CHECK(res.longest_step <= kStepBound);
  CHECK(e.num_loading() == 0);
  CHECK(e.manager().num_active() == 0);
  CHECK(e.tier_in_flight() == 0);
  const ManagerCounters c = e.manager().counters();  // every load ended: the manager agrees
  CHECK(c.tier_loaded_pages == res.stats.tier_loaded_pages);
  CHECK(c.tier_failed_pages == res.stats.tier_failed_pages);
  if (loaded_from) CHECK(checked == res.stats.tier_loaded_pages);
  return res;
}

// A's prompts: 6 prefixes of 24 tokens (6 pages) + 5 tokens. B's: prefixes 0..3 with other
// suffixes (the tier serves 24 tokens each), A's prompts 4 and 5 extended by 3 tokens (28:
// A's 7 full prompt pages), two fresh prompts (nothing). B's prompts share nothing among
// themselves, so every hit of B's comes from the tier.
struct Workloads {
  std::vector<mini::Request> a, b;
  std::uint64_t b_tier_tokens = 0;             // what the tier must serve B
  std::vector<mini::Output> a_plain, b_plain;  // without a tier
};

const Workloads& workloads() {
  static const Workloads workloads = [] {
    Workloads w;
    std::mt19937_64 rng(2026);
    auto tokens = [&](std::size_t n) {
      std::vector<std::uint32_t> t(n);
      for (auto& x : t) x = static_cast<std::uint32_t>(rng() % 96);
      return t;
    };
    std::vector<std::vector<std::uint32_t>> prefix;
    for (int i = 0; i < 6; ++i) prefix.push_back(tokens(24));
    for (int i = 0; i < 6; ++i) {
      mini::Request r{.prompt = prefix[i], .max_new_tokens = 4, .n = i == 2 ? 2u : 1u};
      const auto s = tokens(5);
      r.prompt.insert(r.prompt.end(), s.begin(), s.end());
      w.a.push_back(r);
    }
    w.a_plain = run_engine(w.a, nullptr).out;
    for (int i = 0; i < 4; ++i) {
      mini::Request r{.prompt = prefix[i], .max_new_tokens = 5};
      auto s = tokens(6);
      s[0] = (w.a[i].prompt[24] + 1) % 96;  // parts from A's prompt at token 24
      r.prompt.insert(r.prompt.end(), s.begin(), s.end());
      w.b.push_back(r);
      w.b_tier_tokens += 24;
    }
    for (int i = 4; i < 6; ++i) {
      mini::Request r{.prompt = w.a[i].prompt, .max_new_tokens = 5, .n = i == 5 ? 2u : 1u};
      const std::uint32_t first = w.a_plain[static_cast<std::size_t>(i)].tokens[0];
      r.prompt.insert(r.prompt.end(), {(first + 1) % 96, 3, 4});  // parts from A's output
      w.b.push_back(r);
      w.b_tier_tokens += 28;
    }
    for (int i = 0; i < 2; ++i) w.b.push_back({.prompt = tokens(30), .max_new_tokens = 5});
    w.b_plain = run_engine(w.b, nullptr).out;
    return w;
  }();
  return workloads;
}

// Waits (<= 5 s) until the tier answers a contains from the server again.
void wait_back(KVTier& tier) {
  const TierKey probe{0, BlockHash{1, 2}};
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < until) {
    const auto st = wait_ticket(tier, tier.contains(std::span(&probe, 1)), 5s);
    if (!st.empty() && (st[0] == TierStatus::kMiss || st[0] == TierStatus::kOk)) return;
    std::this_thread::sleep_for(20ms);
  }
  FAIL("the tier did not come back within 5 s");
}

// A stores everything, B (fresh) gets exactly the hits it must, all loaded bytes A's.
void require_shared_run(KVTier& tier_a, KVTier& tier_b, RedisServer& server) {
  const Workloads& w = workloads();
  PageMap stored;
  const RunResult a = run_engine(w.a, &tier_a, &stored);
  REQUIRE(a.out == w.a_plain);
  REQUIRE(a.stats.tier_puts > 0);
  REQUIRE(a.stats.tier_puts_ok == a.stats.tier_puts);
  REQUIRE(a.stats.tier_puts_skipped == 0);
  CHECK(server.dbsize() == static_cast<long long>(stored.size()));  // every page A put, once
  const RunResult b = run_engine(w.b, &tier_b, nullptr, &stored);
  REQUIRE(b.out == w.b_plain);
  CHECK(b.stats.hit_tokens == 0);  // B's own cache never served it
  CHECK(b.stats.tier_hit_tokens == w.b_tier_tokens);
  CHECK(b.stats.tier_failed_pages == 0);
  CHECK(b.stats.tier_cut_tokens == 0);
  CHECK(b.stats.tier_loaded_pages > 0);
}

}  // namespace

TEST_CASE("two mini engines share prefixes through a redis-server") {
  KVMM_REQUIRE_REDIS();
  RedisServer server;
  auto tier_a = engine_tier(server.endpoint());
  auto tier_b = engine_tier(server.endpoint());  // another engine: its own connections
  require_shared_run(*tier_a, *tier_b, server);
  CHECK(tier_b->health().corrupt == 0);
  // Without the server's pages (flushed), B computes everything and its tokens are the same.
  server.command({"FLUSHALL"});
  const RunResult b = run_engine(workloads().b, tier_b.get());
  CHECK(b.out == workloads().b_plain);
  CHECK(b.stats.tier_hit_tokens == 0);
}

TEST_CASE("mini engines on a failing redis-server: bounded steps, sound tokens, hits again after") {
  KVMM_REQUIRE_REDIS();
  const Workloads& w = workloads();
  RedisServer server({"--maxmemory-policy", "allkeys-lru"});
  auto tier_a = engine_tier(server.endpoint());
  HookTier hooked(*tier_a);
  auto fill = [&] {  // A stores every page (not under test)
    PageMap stored;
    REQUIRE(run_engine(w.a, tier_a.get(), &stored).stats.tier_puts_ok > 0);
  };
  auto b_run = [&](KVTier* tier) {
    const RunResult b = run_engine(w.b, tier, nullptr, nullptr, &hooked);
    CHECK(b.out == w.b_plain);
    return b;
  };

  SECTION("SIGKILL while A's puts are in flight") {
    hooked.hook = [&](TierOp op, int n, bool before) {
      if (op != TierOp::kPut || n != 0) return;
      if (before)
        server.stop();  // the put is sent to a server that cannot answer
      else
        server.kill9();
    };
    const RunResult a = run_engine(w.a, &hooked, nullptr, nullptr, &hooked);
    CHECK(a.out == w.a_plain);
    CHECK(a.stats.tier_puts_failed > 0);
    hooked.hook = nullptr;
    server.start();
  }
  SECTION("SIGKILL while B's gets are in flight") {
    fill();
    hooked.hook = [&](TierOp op, int n, bool before) {
      if (op != TierOp::kGet || n != 0) return;
      if (before)
        server.stop();
      else
        server.kill9();
    };
    const RunResult b = b_run(&hooked);
    CHECK(b.stats.tier_failed_pages > 0);
    CHECK(b.stats.tier_cut_tokens > 0);
    hooked.hook = nullptr;
    server.start();
  }
  SECTION("SIGSTOP past the command timeout, then SIGCONT") {
    fill();
    server.stop();
    const RunResult b = b_run(tier_a.get());
    CHECK(b.stats.tier_hit_tokens == 0);
    CHECK(tier_a->health().timeouts + tier_a->health().unavailable > 0);
    server.resume();
  }
  SECTION("SIGSTOP while B's gets are in flight: they time out, the hits are recomputed") {
    fill();
    std::thread resumer;
    hooked.hook = [&](TierOp op, int n, bool before) {
      if (op != TierOp::kGet || n != 0 || !before) return;
      server.stop();
      resumer = std::thread([&] {
        std::this_thread::sleep_for(2 * kCommandTimeout);
        server.resume();
      });
    };
    const RunResult b = b_run(&hooked);
    resumer.join();
    CHECK(b.stats.tier_failed_pages > 0);
    hooked.hook = nullptr;
  }
  SECTION("values corrupted in place (SETRANGE) before B runs") {
    fill();
    const Reply keys = server.command({"KEYS", "kvmm:*"});
    REQUIRE(keys);
    std::size_t corrupted = 0;
    for (std::size_t i = 0; i < keys->elements; i += 2, ++corrupted)  // every other page
      server.command({"SETRANGE", std::string(keys->element[i]->str, keys->element[i]->len), "100", "X"});
    REQUIRE(corrupted > 0);
    const RunResult b = b_run(tier_a.get());
    CHECK(tier_a->health().corrupt > 0);  // found, deleted, never loaded (B's tokens are sound)
    CHECK(b.stats.tier_failed_pages == tier_a->health().corrupt);
  }
  SECTION("keys evicted by the server between B's contains and its get") {
    fill();
    hooked.hook = [&](TierOp op, int n, bool before) {
      if (op != TierOp::kGet || n != 0) return;
      if (before) {
        const long long held = server.dbsize();
        server.command({"CONFIG", "SET", "maxmemory", "1"});
        REQUIRE(server.dbsize() < held);  // allkeys-lru evicted them
      } else {
        server.command({"CONFIG", "SET", "maxmemory", "0"});
      }
    };
    const RunResult b = b_run(&hooked);
    CHECK(b.stats.tier_failed_pages > 0);
    CHECK(tier_a->health().corrupt == 0);
    hooked.hook = nullptr;
  }
  SECTION("the connection cut inside B's get replies (relay)") {
    fill();
    Relay relay(server.dir() + "/relay.sock", server.socket_path());
    auto tier_b = engine_tier(relay.endpoint());
    HookTier cut(*tier_b);
    cut.hook = [&](TierOp op, int n, bool before) {
      if (op == TierOp::kGet && n == 0 && before) relay.cut_next(Relay::Direction::kToClient, 100);
    };
    const RunResult b = run_engine(w.b, &cut, nullptr, nullptr, &cut);
    CHECK(b.out == w.b_plain);
    CHECK(relay.cuts() == 1);  // what was in flight on that connection (get or contains) failed
    CHECK(tier_b->health().unavailable + tier_b->health().timeouts > 0);
    cut.hook = nullptr;
    wait_back(*tier_b);
    server.command({"FLUSHALL"});
    require_shared_run(*tier_a, *tier_b, server);  // through the relay again
  }
  // The server is back (restarted, resumed, or never gone): a further pair of runs gets
  // its hits again, through the same tier object (connections reopened, breaker closed).
  wait_back(*tier_a);
  server.command({"FLUSHALL"});
  require_shared_run(*tier_a, *tier_a, server);
}
