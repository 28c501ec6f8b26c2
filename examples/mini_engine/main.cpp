// The mini engine demo: serves a seeded shared-prefix workload through the paged engine
// with little device memory and some host swap space, prints the report, then serves it
// again through the vAttention path and checks that every generated token matches.
#include "mini_engine.hpp"

#include "kvmm/error.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>

int main(int argc, char** argv) {
  try {
    std::uint32_t requests = 24, large_pages = 64, host_pages = 8;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::uint32_t v = static_cast<std::uint32_t>(std::strtoul(argv[i + 1], nullptr, 10));
      if (std::strcmp(argv[i], "--requests") == 0) requests = v;
      else if (std::strcmp(argv[i], "--large-pages") == 0) large_pages = v;
      else if (std::strcmp(argv[i], "--host-pages") == 0) host_pages = v;
      else kvmm::fail("{} = '{}': flags are --requests, --large-pages, --host-pages", argv[i], argv[i + 1]);
    }
    mini::Model model(mini::ModelConfig{});
    const kvmm::KVLayout layout = model.layout();
    fmt::print("mini engine: {} layers (full, sliding w={}, recurrent, full, sliding), vocab {}, hidden {}\n",
               model.config().layers.size(), model.config().window, model.config().vocab, model.config().hidden);
    fmt::print("{}\n", layout.describe());
    fmt::print("device KV: {} large pages of {} bytes; host swap: {} large pages\n\n", large_pages,
               layout.large_page_bytes(), host_pages);

    const std::vector<mini::Request> work = mini::shared_prefix_workload(requests, model.config().vocab, 7);
    mini::Engine engine(model, {.num_large_pages = large_pages, .num_host_large_pages = host_pages});
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
