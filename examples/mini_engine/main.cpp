// The mini engine demo: serves a seeded shared-prefix workload through the paged engine
// with little device memory and some host swap space, prints the report, then serves it
// again through the vAttention path and checks that every generated token matches. With
// --events ENDPOINT the paged engine publishes its KV events there as vLLM's stream
// (kvmm::KvEventPublisher, when built with kvmm::events) and the report counts them. With
// --tier redis:ENDPOINT (built with kvmm::redis) it shares KV pages through a Redis tier:
// prefix hits past its own cache load from there, its newly cached pages are stored there.
// --seed picks the workload's system prompts, --suffix-seed the rest of each prompt: two
// runs with one --seed and different --suffix-seed share prefixes, not whole prompts.
#include "mini_engine.hpp"

#include "kvmm/error.hpp"
#ifdef KVMM_MINI_EVENTS
#include "kvmm/distributed/event_publisher.hpp"
#endif
#ifdef KVMM_MINI_REDIS
#include "kvmm/distributed/redis_tier.hpp"
#endif

#include <fmt/format.h>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace {

// What the engine's KV events said, for the report.
struct EventCounts {
  std::uint64_t batches = 0, runs = 0, stored = 0, removed = 0, cleared = 0;
  void add(const kvmm::KvEventBatch& b) {
    ++batches;
    for (const kvmm::KvEvent& e : b.events) {
      if (e.kind == kvmm::KvEventKind::kStored)
        ++runs, stored += e.num_pages;
      else if (e.kind == kvmm::KvEventKind::kRemoved)
        removed += e.num_pages;
      else
        ++cleared;
    }
  }
};

// --tier redis:<endpoint>: a RedisTier whose scope names this model (its seed: other
// weights, other bytes) and its KV dtype.
std::unique_ptr<kvmm::KVTier> make_tier(const std::string& spec, const mini::Model& model) {
  if (spec.empty()) return nullptr;
  if (!spec.starts_with("redis:"))
    kvmm::fail("--tier = '{}': the tier is 'redis:<endpoint>' (redis:unix:/path/redis.sock, redis:tcp:host:port)",
               spec);
#ifdef KVMM_MINI_REDIS
  kvmm::RedisTierOptions o;
  o.endpoint = spec.substr(6);
  o.notify_when_armed = true;  // the engine polls every step and arms the fd before it sleeps
  return kvmm::make_redis_tier(
      model.layout(), {.model_id = fmt::format("mini-hybrid@seed{}", model.config().seed), .dtype = "float16"}, o);
#else
  (void)model;
  kvmm::fail("--tier = '{}': this build has no kvmm::redis (libhiredis-dev not found)", spec);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::uint32_t requests = 24, large_pages = 64, host_pages = 8;
    std::uint64_t seed = 7, suffix_seed = 7;
    std::string events_endpoint, tier_spec;
    if (argc % 2 == 0) kvmm::fail("{}: a flag without a value (flags come as --name value)", argv[argc - 1]);
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::uint32_t v = static_cast<std::uint32_t>(std::strtoul(argv[i + 1], nullptr, 10));
      if (std::strcmp(argv[i], "--requests") == 0)
        requests = v;
      else if (std::strcmp(argv[i], "--large-pages") == 0)
        large_pages = v;
      else if (std::strcmp(argv[i], "--host-pages") == 0)
        host_pages = v;
      else if (std::strcmp(argv[i], "--events") == 0)
        events_endpoint = argv[i + 1];
      else if (std::strcmp(argv[i], "--tier") == 0)
        tier_spec = argv[i + 1];
      else if (std::strcmp(argv[i], "--seed") == 0)
        seed = std::strtoull(argv[i + 1], nullptr, 10);
      else if (std::strcmp(argv[i], "--suffix-seed") == 0)
        suffix_seed = std::strtoull(argv[i + 1], nullptr, 10);
      else
        kvmm::fail(
            "{} = '{}': flags are --requests, --large-pages, --host-pages, --events, --tier, --seed, --suffix-seed",
            argv[i], argv[i + 1]);
    }
    mini::Model model(mini::ModelConfig{});
    const kvmm::KVLayout layout = model.layout();
    fmt::print("mini engine: {} layers (full, sliding w={}, recurrent, full, sliding), vocab {}, hidden {}\n",
               model.config().layers.size(), model.config().window, model.config().vocab, model.config().hidden);
    fmt::print("{}\n", layout.describe());
    fmt::print("device KV: {} large pages of {} bytes; host swap: {} large pages\n\n", large_pages,
               layout.large_page_bytes(), host_pages);

    const std::vector<mini::Request> work =
        mini::shared_prefix_workload(requests, model.config().vocab, seed, suffix_seed);
    mini::EngineOptions options{.num_large_pages = large_pages, .num_host_large_pages = host_pages};
    std::unique_ptr<kvmm::KVTier> tier = make_tier(tier_spec, model);
    options.tier = tier.get();
    EventCounts counts;
#ifdef KVMM_MINI_EVENTS
    std::unique_ptr<kvmm::KvEventPublisher> publisher;
    if (!events_endpoint.empty()) {
      kvmm::EventPublisherOptions po;
      po.endpoint = events_endpoint;
      po.topic = "kv@mini@hybrid";
      publisher = std::make_unique<kvmm::KvEventPublisher>(layout, po);
      options.kv_events = [&](const kvmm::KvEventBatch& b) {
        counts.add(b);
        publisher->publish(b);
      };
    }
#else
    if (!events_endpoint.empty())
      kvmm::fail("--events = '{}': this build has no kvmm::events (libzmq and cppzmq not found)", events_endpoint);
#endif
    mini::Engine engine(model, options);
    for (const mini::Request& r : work) engine.submit(r);
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<mini::Output> paged = engine.run();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    engine.manager().check_invariants();
    fmt::print("{}", mini::format_report(engine.stats(), secs));
    if (tier) fmt::print("{}", mini::format_tier_report(engine.stats()));
    const kvmm::CacheStats end = engine.manager().stats();
    std::uint32_t used = 0;
    for (const kvmm::GroupStats& g : end.groups) used += g.used_pages;
    fmt::print("after the run         {} used pages, {} active requests (no leak)\n", used,
               engine.manager().num_active());
#ifdef KVMM_MINI_EVENTS
    if (publisher) {
      publisher->flush(std::chrono::seconds(5));
      const kvmm::PublisherStats ps = publisher->stats();
      fmt::print(
          "KV events             {} batches on {} (vLLM's stream, topic kv@mini@hybrid): {} pages stored in "
          "{} runs, {} removed, {} cleared; {} sent ({} bytes), {} dropped\n",
          counts.batches, publisher->endpoint(), counts.stored, counts.runs, counts.removed, counts.cleared, ps.sent,
          ps.sent_bytes, ps.dropped);
    }
#endif

    mini::VAttentionEngine vattn(model, {});
    for (const mini::Request& r : work) vattn.submit(r);
    const std::vector<mini::Output> virt = vattn.run();
    bool same = paged.size() == virt.size();
    for (std::size_t i = 0; same && i < paged.size(); ++i) same = paged[i].tokens == virt[i].tokens;
    fmt::print("vAttention path       {} samples, tokens {}\n", virt.size(),
               same ? "identical to the paged engine" : "DIFFER from the paged engine");
    fmt::print("request 0 generated  ");
    for (std::uint32_t t : paged.front().tokens) fmt::print(" {}", t);
    fmt::print("\n");
    return same ? 0 : 1;
  } catch (const kvmm::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
}
