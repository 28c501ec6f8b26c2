// RedisTier benchmarks against a redis-server the benchmark starts itself (unix socket in a
// temporary directory, as in the tests): put and get throughput of 2 MiB pages (64 a
// ticket) by connection count, the presence check of a 128k-token prefix (8192 keys), and
// the caller thread's CPU time per request (inside submit and poll, the cost of the clock
// reads subtracted), also per admission when a step submits several. The baseline, in the
// same run: hiredis's synchronous client, one SET or GET at a time.
// Throughput counters are decimal GB/s (1e9 B/s).
#include "kvmm/distributed/redis_tier.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/manager/tier_admission.hpp"
#include "redis_harness.hpp"

#include <benchmark/benchmark.h>
#include <poll.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

using namespace kvmm;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kPages = 64;  // 2 MiB pages per ticket: 128 MiB

test::RedisServer& server() {
  static test::RedisServer s({"--maxmemory", "2gb", "--maxmemory-policy", "allkeys-lru"});
  return s;
}

// Group 0: 2 MiB pages (32 layers x 8 KV heads x 128 x bf16 x 16 tokens); group 1: 1 KiB.
const KVLayout& layout() {
  static const KVLayout l = KVLayout::plan(
      {LayerGroup::full_attention("full", 32, 8, 128, 2, 16), LayerGroup::full_attention("small", 1, 1, 16, 2, 16)});
  return l;
}

TierScope scope() { return TierScope{"bench-model", "bfloat16", 0, 1, false}; }

// doze: the I/O threads doze between commands (RedisTierOptions' default) or are woken by
// every submission (doze_window 0, the plain path).
std::unique_ptr<KVTier> tier(std::uint32_t connections, bool doze = true, const KVLayout& l = layout()) {
  RedisTierOptions o;
  o.endpoint = server().endpoint();
  o.connections = connections;
  o.command_timeout = 10s;
  if (!doze) o.doze_window = 0ms;
  return make_redis_tier(l, scope(), o);
}

struct Pages {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<TierPage> pages;
  std::vector<TierKey> keys;
  Pages(GroupId g, std::size_t n, std::uint64_t base) {
    std::mt19937_64 rng(base);
    for (std::size_t i = 0; i < n; ++i) {
      keys.push_back(TierKey{g, BlockHash{base + i, 0x5eed}});
      bytes.emplace_back(layout().small_page_bytes(g));
      for (std::size_t at = 0; at + 8 <= bytes.back().size(); at += 8) {
        const std::uint64_t v = rng();
        std::memcpy(bytes.back().data() + at, &v, 8);
      }
    }
    for (std::size_t i = 0; i < n; ++i) pages.push_back(TierPage{keys[i], bytes[i].data()});
  }
};

// The caller thread's CPU time (wall time would count preemption on a loaded machine).
double now_us() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

// What one measured interval (two clock reads) adds by itself, measured in this run and
// subtracted from every interval.
double clock_pair_us() {
  static const double cost = [] {
    constexpr int kPairs = 20000;
    double sum = 0;
    for (int i = 0; i < kPairs; ++i) {
      const double t0 = now_us();
      sum += now_us() - t0;
    }
    return sum / kPairs;
  }();
  return cost;
}

// Waits for `ticket`, sleeping in poll() on the event fd (the engine's event loop would);
// the CPU time spent inside tier.poll() is added to *poll_us. Aborts the benchmark on a status other than kOk.
void finish(benchmark::State& state, KVTier& tier, TierTicket ticket, TierResults& r, double* poll_us = nullptr) {
  for (;;) {
    pollfd p{tier.event_fd(), POLLIN, 0};
    ::poll(&p, 1, 1000);
    r.clear();
    const double t0 = poll_us ? now_us() : 0;
    tier.poll(r);
    if (poll_us) *poll_us += now_us() - t0 - clock_pair_us();
    for (const TierCompletion& c : r.completions) {
      if (c.ticket != ticket) continue;
      for (const TierStatus s : r.status_of(c))
        if (s != TierStatus::kOk) state.SkipWithError(std::string(to_string(s)).c_str());
      return;
    }
  }
}

void set_gbps(benchmark::State& state, double bytes_per_iteration) {
  state.counters["GB/s"] = benchmark::Counter(bytes_per_iteration / 1e9 * static_cast<double>(state.iterations()),
                                              benchmark::Counter::kIsRate);
}

void flush() { server().command({"FLUSHALL"}); }

void BM_TierPut2MiB(benchmark::State& state) {
  auto t = tier(static_cast<std::uint32_t>(state.range(0)));
  Pages p(0, kPages, 1);
  TierResults r;
  for (auto _ : state) {
    state.PauseTiming();
    flush();  // fresh keys every time: SET NX stores
    state.ResumeTiming();
    finish(state, *t, t->put(p.pages), r);
  }
  set_gbps(state, static_cast<double>(kPages * layout().small_page_bytes(0)));
}

void BM_TierGet2MiB(benchmark::State& state) {
  flush();
  auto t = tier(static_cast<std::uint32_t>(state.range(0)));
  Pages p(0, kPages, 2);
  TierResults r;
  finish(state, *t, t->put(p.pages), r);
  for (auto _ : state) finish(state, *t, t->get(p.pages), r);
  set_gbps(state, static_cast<double>(kPages * layout().small_page_bytes(0)));
}

// The baseline: one synchronous SET / GET at a time with hiredis's own client.
void BM_HiredisSyncSet2MiB(benchmark::State& state) {
  Pages p(0, kPages, 3);
  std::string key;
  for (auto _ : state) {
    state.PauseTiming();
    flush();
    state.ResumeTiming();
    for (std::size_t i = 0; i < kPages; ++i) {
      format_tier_key("base", 0, p.keys[i], key);
      server().command({"SET", key, std::string(reinterpret_cast<const char*>(p.bytes[i].data()), p.bytes[i].size())});
    }
  }
  set_gbps(state, static_cast<double>(kPages * layout().small_page_bytes(0)));
}

void BM_HiredisSyncGet2MiB(benchmark::State& state) {
  flush();
  Pages p(0, kPages, 4);
  std::string key;
  for (std::size_t i = 0; i < kPages; ++i) {
    format_tier_key("base", 0, p.keys[i], key);
    server().command({"SET", key, std::string(reinterpret_cast<const char*>(p.bytes[i].data()), p.bytes[i].size())});
  }
  for (auto _ : state) {
    for (std::size_t i = 0; i < kPages; ++i) {
      format_tier_key("base", 0, p.keys[i], key);
      test::Reply reply = server().command({"GET", key});
      std::memcpy(p.bytes[i].data(), reply->str, p.bytes[i].size());
    }
  }
  set_gbps(state, static_cast<double>(kPages * layout().small_page_bytes(0)));
}

// Presence of a 128k-token prefix: 8192 keys of pages that are all stored. Also reports
// the caller thread's CPU time per request (inside submit and every poll call) in us.
void BM_TierContains(benchmark::State& state) {
  flush();
  const auto n = static_cast<std::size_t>(state.range(1));
  auto t = tier(static_cast<std::uint32_t>(state.range(0)), state.range(2) != 0);
  Pages p(1, n, 5);
  TierResults r;
  finish(state, *t, t->put(p.pages), r);
  double submit_us = 0, poll_us = 0;
  for (auto _ : state) {
    const double t0 = now_us();
    const TierTicket ticket = t->contains(p.keys);
    submit_us += now_us() - t0 - clock_pair_us();
    finish(state, *t, ticket, r, &poll_us);
  }
  const auto iters = static_cast<double>(state.iterations());
  state.counters["caller_us"] = (submit_us + poll_us) / iters;
  state.counters["submit_us"] = submit_us / iters;
  state.counters["poll_us"] = poll_us / iters;
  state.counters["clock_pair_us"] = clock_pair_us();
}

// One scheduler step's admissions: range(0) presence checks of 64 keys (1k tokens) each,
// then every completion; 2 connections; range(1): dozing I/O threads; range(2): ms of idle
// time between steps (not timed; beyond doze_window the threads sleep until woken).
// caller_us is per admission: its submit and its share of the poll() calls. Without doze
// the first submission of a step wakes the sleeping I/O thread; the next ones find it awake.
void BM_TierAdmissions(benchmark::State& state) {
  flush();
  const auto k = static_cast<std::size_t>(state.range(0));
  auto t = tier(2, state.range(1) != 0);
  Pages p(1, 64, 6);
  TierResults r;
  finish(state, *t, t->put(p.pages), r);
  double caller_us = 0;
  for (auto _ : state) {
    const double t0 = now_us();
    for (std::size_t i = 0; i < k; ++i) t->contains(p.keys);
    caller_us += now_us() - t0 - clock_pair_us();
    std::size_t done = 0;
    while (done < k) {
      pollfd pf{t->event_fd(), POLLIN, 0};
      ::poll(&pf, 1, 1000);
      r.clear();
      const double t1 = now_us();
      done += t->poll(r);
      caller_us += now_us() - t1 - clock_pair_us();
    }
    if (state.range(2) > 0) std::this_thread::sleep_for(std::chrono::milliseconds(state.range(2)));
  }
  state.counters["caller_us"] = caller_us / static_cast<double>(state.iterations() * k);
}

// An admission through a tier as an engine makes it (examples/mini_engine): after the
// local lookup (not counted), tier_candidates + contains at once, then, when the event fd
// is readable, poll + extend_prefix (which looks the request up again). A 1025-token
// prompt of 16-token pages whose 64 pages the tier holds; one group of 1 KiB pages; the
// request is freed after (not counted). caller_us: the scheduler thread's CPU time per
// admission beyond the local lookup; lookup_us: the local lookup's, for scale.
// range(1) = 0: the engine sleeps on event_fd() for the answer (readable exactly while
// completions wait: an eventfd read per poll that finds them); 1: the engine keeps stepping
// (a step of ~20 us, not counted, between polls) with notify_when_armed, so its polls make
// no system call; every poll() call is counted against the admission.
void BM_ManagerTierAdmission(benchmark::State& state) {
  flush();
  static const KVLayout one = KVLayout::plan({LayerGroup::full_attention("full", 1, 1, 16, 2, 16)});
  const bool stepping = state.range(1) != 0;
  RedisTierOptions o;
  o.endpoint = server().endpoint();
  o.connections = 2;
  o.command_timeout = 10s;
  if (state.range(0) == 0) o.doze_window = 0ms;
  o.notify_when_armed = stepping;
  auto t = make_redis_tier(one, scope(), o);
  KVCacheManager kv(one, {.num_large_pages = 256, .max_requests = 4});
  TierAdmission adm(kv);
  std::vector<std::uint32_t> prompt(1025);
  for (std::uint32_t i = 0; i < prompt.size(); ++i) prompt[i] = 3 * i + 1;
  std::vector<TierKey> keys;
  TierResults r;
  {  // the tier holds the prompt's pages
    const RequestId q = kv.add_request(prompt);
    kv.lookup_prefix(q);
    adm.tier_candidates(q, keys);
    std::vector<std::vector<std::byte>> bytes(keys.size(), std::vector<std::byte>(one.small_page_bytes(0)));
    std::vector<TierPage> pages;
    for (std::size_t i = 0; i < keys.size(); ++i) pages.push_back(TierPage{keys[i], bytes[i].data()});
    const TierTicket put = t->put(pages);
    for (bool stored = false; !stored;) {  // finish() sleeps on the fd: arm it first
      if (t->arm()) {
        pollfd pf{t->event_fd(), POLLIN, 0};
        ::poll(&pf, 1, 1000);
      }
      r.clear();
      t->poll(r);
      for (const TierCompletion& c : r.completions) stored |= c.ticket == put;
    }
    kv.free(q);
  }
  double caller_us = 0, lookup_us = 0;
  std::vector<double> wall;         // the same intervals on the monotonic clock (vDSO: no system call)
  std::vector<double> submit_wall;  // of which tier_candidates + contains
  std::uint64_t hit = 0;
  using Wall = std::chrono::steady_clock;
  auto us = [](Wall::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
  for (auto _ : state) {
    const RequestId q = kv.add_request(prompt);
    const double t0 = now_us();
    kv.lookup_prefix(q);
    const double t1 = now_us();
    const Wall::time_point w1 = Wall::now();
    keys.clear();
    adm.tier_candidates(q, keys);
    const TierTicket ticket = t->contains(keys);
    double w = us(Wall::now() - w1);
    submit_wall.push_back(w);
    const double t2 = now_us();
    lookup_us += t1 - t0 - clock_pair_us();
    caller_us += t2 - t1 - clock_pair_us();
    for (bool done = false; !done;) {
      if (stepping) {
        std::this_thread::sleep_for(20us);
      } else {
        pollfd pf{t->event_fd(), POLLIN, 0};
        ::poll(&pf, 1, 1000);
      }
      r.clear();
      const double t3 = now_us();
      const Wall::time_point w3 = Wall::now();
      t->poll(r);
      for (const TierCompletion& c : r.completions)
        if (c.ticket == ticket) {
          hit = adm.extend_prefix(q, r.status_of(c));
          done = true;
        }
      w += us(Wall::now() - w3);
      caller_us += now_us() - t3 - clock_pair_us();
    }
    wall.push_back(w);
    kv.free(q);
  }
  if (hit != 1024) state.SkipWithError("the tier's pages were not hit");
  state.counters["caller_us"] = caller_us / static_cast<double>(state.iterations());
  state.counters["lookup_us"] = lookup_us / static_cast<double>(state.iterations());
  std::nth_element(wall.begin(), wall.begin() + static_cast<std::ptrdiff_t>(wall.size() / 2), wall.end());
  state.counters["caller_wall_median_us"] = wall.empty() ? 0.0 : wall[wall.size() / 2];
  std::nth_element(submit_wall.begin(), submit_wall.begin() + static_cast<std::ptrdiff_t>(submit_wall.size() / 2),
                   submit_wall.end());
  state.counters["submit_wall_median_us"] = submit_wall.empty() ? 0.0 : submit_wall[submit_wall.size() / 2];
}

}  // namespace

BENCHMARK(BM_HiredisSyncSet2MiB)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TierPut2MiB)->Arg(1)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_HiredisSyncGet2MiB)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TierGet2MiB)->Arg(1)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime();
// {connections, keys, doze}
BENCHMARK(BM_TierContains)
    ->Args({1, 8192, 1})
    ->Args({2, 8192, 0})
    ->Args({2, 8192, 1})
    ->Args({4, 8192, 1})
    ->Args({2, 64, 0})
    ->Args({2, 64, 1})
    ->Args({2, 1, 0})
    ->Args({2, 1, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// {admissions per step, doze, idle ms between steps}
BENCHMARK(BM_TierAdmissions)
    ->Args({1, 0, 0})
    ->Args({1, 1, 0})
    ->Args({8, 0, 0})
    ->Args({8, 1, 0})
    ->Args({32, 0, 0})
    ->Args({32, 1, 0})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_TierAdmissions)
    ->Args({1, 0, 60})
    ->Args({1, 1, 60})
    ->Iterations(40)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
// {doze, stepping engine with notify_when_armed}
BENCHMARK(BM_ManagerTierAdmission)
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({1, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

BENCHMARK_MAIN();
