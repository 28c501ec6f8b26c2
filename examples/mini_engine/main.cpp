// The mini engine demo: serves a seeded shared-prefix workload through the paged engine
// with little device memory and some host swap space, prints the report, then serves it
// again through the vAttention path and checks that every generated token matches. With
// --events ENDPOINT the paged engine publishes its KV events there as vLLM's stream
// (kvmm::KvEventPublisher, when built with kvmm::events) and the report counts them.
#include "mini_engine.hpp"

#include "kvmm/error.hpp"
#ifdef KVMM_MINI_EVENTS
#include "kvmm/dist/event_publisher.hpp"
#endif

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <memory>
#include <string>

namespace {

// What the engine's KV events said, for the report.
struct EventCounts {
  std::uint64_t batches = 0, runs = 0, stored = 0, removed = 0, cleared = 0;
  void add(const kvmm::KvEventBatch& b) {
    ++batches;
    for (const kvmm::KvEvent& e : b.events) {
      if (e.kind == kvmm::KvEventKind::kStored) ++runs, stored += e.num_pages;
      else if (e.kind == kvmm::KvEventKind::kRemoved) removed += e.num_pages;
      else ++cleared;
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  try {
    std::uint32_t requests = 24, large_pages = 64, host_pages = 8;
    std::string events_endpoint;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::uint32_t v = static_cast<std::uint32_t>(std::strtoul(argv[i + 1], nullptr, 10));
      if (std::strcmp(argv[i], "--requests") == 0) requests = v;
      else if (std::strcmp(argv[i], "--large-pages") == 0) large_pages = v;
      else if (std::strcmp(argv[i], "--host-pages") == 0) host_pages = v;
      else if (std::strcmp(argv[i], "--events") == 0) events_endpoint = argv[i + 1];
      else kvmm::fail("{} = '{}': flags are --requests, --large-pages, --host-pages, --events", argv[i], argv[i + 1]);
    }
    mini::Model model(mini::ModelConfig{});
    const kvmm::KVLayout layout = model.layout();
    fmt::print("mini engine: {} layers (full, sliding w={}, recurrent, full, sliding), vocab {}, hidden {}\n",
               model.config().layers.size(), model.config().window, model.config().vocab, model.config().hidden);
    fmt::print("{}\n", layout.describe());
    fmt::print("device KV: {} large pages of {} bytes; host swap: {} large pages\n\n", large_pages,
               layout.large_page_bytes(), host_pages);

    const std::vector<mini::Request> work = mini::shared_prefix_workload(requests, model.config().vocab, 7);
    mini::EngineOptions options{.num_large_pages = large_pages, .num_host_large_pages = host_pages};
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
    const kvmm::CacheStats end = engine.manager().stats();
    std::uint32_t used = 0;
    for (const kvmm::GroupStats& g : end.groups) used += g.used_pages;
    fmt::print("after the run         {} used pages, {} active requests (no leak)\n", used,
               engine.manager().num_active());
#ifdef KVMM_MINI_EVENTS
    if (publisher) {
      publisher->flush(std::chrono::seconds(5));
      const kvmm::PublisherStats ps = publisher->stats();
      fmt::print("KV events             {} batches on {} (vLLM's stream, topic kv@mini@hybrid): {} pages stored in "
                 "{} runs, {} removed, {} cleared; {} sent ({} bytes), {} dropped\n",
                 counts.batches, publisher->endpoint(), counts.stored, counts.runs, counts.removed, counts.cleared,
                 ps.sent, ps.sent_bytes, ps.dropped);
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
