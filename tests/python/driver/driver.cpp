// kvmm_py_driver: replays an operation script (written by tests/python/test_differential.py)
// through the C++ KVCacheManager and prints one line per result, the same lines the Python
// side prints for the same script through the bindings; the test compares the two.
// Usage: kvmm_py_driver SCRIPT. O(script) manager calls; output O(pages) per `tables`.
#include "kvmm/error.hpp"
#include "kvmm/manager/kernel_exports.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/testing/manager_inspector.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace kvmm;

std::string join(std::span<const PageId> ids) {
  std::string s;
  for (PageId p : ids) s += fmt::format(" {}", p == kNullPage ? std::int64_t{-1} : std::int64_t{p});
  return s;
}

std::string join32(const std::vector<std::int32_t>& v, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) s += fmt::format(" {}", v[i]);
  return s;
}

std::string plan_text(const std::optional<std::span<const PageCopy>>& plan) {
  if (!plan) return "none";
  std::string s = fmt::format("{}", plan->size());
  for (const PageCopy& c : *plan) s += fmt::format(" {}:{}:{}", c.group, c.src, c.dst);
  return s;
}

struct Driver {
  std::vector<LayerGroup> groups;
  std::optional<KVCacheManager> kv;
  std::map<std::uint32_t, RequestId> slots;
  std::map<std::uint32_t, PinId> pins;

  void tables() {
    for (const auto& [slot, r] : slots) {
      if (!kv->is_active(r)) continue;
      std::cout << fmt::format("req {} computed={} allocated={} tokens={} swapped={}\n", slot, kv->num_computed(r),
                               kv->num_allocated(r), kv->num_tokens(r), kv->is_swapped(r) ? 1 : 0);
      for (GroupId g = 0; g < groups.size(); ++g)
        std::cout << fmt::format(
            "  g{}:{}\n", g,
            join(kv->is_swapped(r) ? testing::ManagerInspector(*kv).host_page_table(r, g) : kv->page_table(r, g)));
    }
    const CacheStats st = kv->stats();
    std::cout << fmt::format("stats free={} lookups={} lookup_tokens={} hit_tokens={}\n", st.free_large_pages,
                             st.lookups, st.lookup_tokens, st.hit_tokens);
    for (const GroupStats& g : st.groups)
      std::cout << fmt::format("  used={} evictable={} empty={} large={} waste={} hit={} evicted={}\n", g.used_pages,
                               g.evictable_pages, g.empty_pages, g.large_pages, g.waste_bytes, g.hit_pages,
                               g.evicted_pages);
  }

  std::string exports(GroupId g, const std::vector<RequestId>& batch) {
    std::uint64_t bound = 0;
    for (RequestId r : batch) bound += kv->page_table(r, g).size();
    std::vector<std::int32_t> indptr(batch.size() + 1), indices(bound), last(batch.size());
    const std::size_t nnz = KernelExports(*kv).export_csr(g, batch, indptr, indices, last);
    return fmt::format("csr{} |{} |{}", join32(indptr, indptr.size()), join32(indices, nnz), join32(last, last.size()));
  }

  // Layout and manager set-up lines: "group ..." and "manager ...".
  void setup(const std::string& op, std::istringstream& in) {
    if (op == "group") {
      std::string kind, name;
      std::uint32_t layers = 0, heads = 0, dim = 0, dtype = 0, tpp = 0, window = 0;
      in >> kind >> name >> layers >> heads >> dim >> dtype >> tpp;
      if (kind == "full") groups.push_back(LayerGroup::full_attention(name, layers, heads, dim, dtype, tpp));
      if (kind == "sliding") {
        in >> window;
        groups.push_back(LayerGroup::sliding_window(name, layers, heads, dim, dtype, tpp, window));
      }
      return;
    }
    std::uint32_t large = 0, host = 0, rows = 0, caching = 0;
    in >> large >> host >> rows >> caching;
    kv.emplace(KVLayout::plan(groups), KVCacheManagerOptions{.num_large_pages = large,
                                                             .num_host_large_pages = host,
                                                             .max_requests = rows,
                                                             .prefix_caching = caching != 0});
  }

  // A request operation; returns its result line. kvmm::Error propagates.
  std::string request_op(const std::string& op, std::istringstream& in) {
    std::uint32_t a = 0, b = 0, c = 0;
    in >> a;
    if (op == "add") {
      std::uint32_t n = 0;
      in >> b >> n;
      std::vector<std::uint32_t> t(n);
      for (auto& x : t) in >> x;
      slots[a] = kv->add_request(t, {.lora_id = b});
    } else if (op == "lookup") {
      return fmt::format("{}", kv->lookup_prefix(slots.at(a)));
    } else if (op == "alloc") {
      in >> b >> c;
      return kv->allocate(slots.at(a), b, c) ? "1" : "0";
    } else if (op == "commit" || op == "append") {
      in >> b;
      if (op == "commit")
        kv->commit(slots.at(a), b);
      else
        kv->append_token(slots.at(a), b);
    } else if (op == "fork") {
      in >> b;
      slots[b] = kv->fork(slots.at(a));
    } else if (op == "free") {
      kv->free(slots.at(a));
    } else if (op == "reset") {
      kv->reset(slots.at(a));
    } else if (op == "swapout") {
      return plan_text(kv->swap_out(slots.at(a)));
    } else if (op == "swapin") {
      return plan_text(kv->swap_in(slots.at(a)));
    } else if (op == "pin") {
      in >> b;
      pins[b] = kv->pin_prefix(slots.at(a));
    } else if (op == "unpin") {
      kv->unpin(pins.at(a));
    } else if (op == "export") {
      std::vector<RequestId> batch;
      while (in >> b) batch.push_back(slots.at(b));
      return exports(a, batch);
    } else {
      fail("unknown op '{}'", op);
    }
    return "ok";
  }

  // One script line; prints its result line (or "error", the message on stderr).
  void run(const std::string& line) {
    std::istringstream in(line);
    std::string op;
    in >> op;
    if (op == "group" || op == "manager") return setup(op, in);
    if (op == "step") {
      kv->begin_step();
      return;
    }
    if (op == "tables") return tables();
    try {
      std::cout << request_op(op, in) << "\n";
    } catch (const Error& e) {
      std::cout << "error\n";
      std::cerr << line << ": " << e.what() << "\n";  // for a human reading a failure
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kvmm_py_driver SCRIPT\n");
    return 2;
  }
  std::ifstream f(argv[1]);
  if (!f) {
    std::fprintf(stderr, "kvmm_py_driver: cannot read %s\n", argv[1]);
    return 2;
  }
  Driver d;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) d.run(line);
  return 0;
}
