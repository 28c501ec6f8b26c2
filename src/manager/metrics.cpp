// Prometheus text exposition of the manager's counters (kvmm/manager/metrics.hpp).
#include "kvmm/manager/metrics.hpp"

#include "kvmm/error.hpp"

#include <fmt/format.h>

#include <cctype>
#include <iterator>
#include <tuple>

namespace kvmm {

namespace {

bool valid_name(std::string_view p) {
  if (p.empty() || !(std::isalpha(static_cast<unsigned char>(p[0])) || p[0] == '_')) return false;
  for (char ch : p)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_')) return false;
  return true;
}

// A label value: backslash, double quote and newline escaped, as the format requires.
std::string escaped(std::string_view v) {
  std::string out;
  for (char ch : v) {
    if (ch == '\\' || ch == '"') out += '\\';
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out += ch;
  }
  return out;
}

}  // namespace

void append_prometheus_text(const ManagerCounters& c, const KVLayout& layout, std::string& out,
                            std::string_view prefix) {
  if (!valid_name(prefix)) fail("prefix = \"{}\": a metric name prefix is [a-zA-Z_][a-zA-Z0-9_]*", prefix);
  auto it = std::back_inserter(out);
  auto metric = [&](std::string_view name, std::string_view type, std::string_view help, std::uint64_t v) {
    fmt::format_to(it, "# HELP {0}_{1} {2}\n# TYPE {0}_{1} {3}\n{0}_{1} {4}\n", prefix, name, help, type, v);
  };
  metric("lookups_total", "counter", "lookup_prefix calls, retries of a blocked request included", c.lookups);
  metric("lookup_tokens_total", "counter", "Prompt tokens looked up", c.lookup_tokens);
  metric("hit_tokens_total", "counter", "Prompt tokens the lookups found cached", c.hit_tokens);
  metric("admissions_total", "counter", "Requests whose first allocate succeeded", c.admissions);
  metric("admitted_lookup_tokens_total", "counter", "Prompt tokens looked up by admitted requests",
         c.admitted_lookup_tokens);
  metric("admitted_hit_tokens_total", "counter", "Prompt tokens cached for admitted requests", c.admitted_hit_tokens);
  metric("refused_admissions_total", "counter", "First allocates refused (a blocked queue head counts each retry)",
         c.refused_admissions);
  metric("refused_allocations_total", "counter", "Allocates refused, running requests included", c.refused_allocations);
  metric("lost_hits_total", "counter", "Prefix hits evicted between lookup_prefix and allocate", c.lost_hits);
  metric("cow_copies_total", "counter", "Copy-on-write page copies planned", c.cow_copies);
  metric("swapped_out_pages_total", "counter", "Pages planned device to host", c.swapped_out_pages);
  metric("swapped_in_pages_total", "counter", "Pages planned host to device", c.swapped_in_pages);
  metric("evicted_pages_total", "counter", "Cached small pages evicted", c.evicted_pages);
  metric("tier_hit_tokens_total", "counter", "Hit tokens extend_prefix added from a shared tier", c.tier_hit_tokens);
  metric("tier_loaded_pages_total", "counter", "Tier loads finished verified", c.tier_loaded_pages);
  metric("tier_failed_pages_total", "counter", "Tier loads finished failed (recomputed)", c.tier_failed_pages);
  metric("tier_cut_tokens_total", "counter", "Hit tokens failed tier loads cut back", c.tier_cut_tokens);
  metric("retention_released_pages_total", "counter", "Pages held for retention released under memory pressure",
         c.retention_released_pages);
  metric("retention_bytes", "gauge", "Bytes of pages held for cache boundaries past their windows", c.retention_bytes);
  metric("active_requests", "gauge", "Requests added and not freed", c.active_requests);
  metric("free_large_pages", "gauge", "Large pages in the pool", c.free_large_pages);
  metric("large_pages", "gauge", "Large pages the manager holds", c.large_pages);
  // Miss reasons (all zero unless KVCacheManagerOptions::miss_reasons): one series per reason.
  for (const auto& [name, values, help] :
       {std::tuple{"lookup_stops_total", &c.misses.lookups, "Lookups whose hit stopped for this reason"},
        std::tuple{"missed_tokens_total", &c.misses.tokens,
                   "Tokens looked up and not hit, by the reason the hit stopped"}}) {
    fmt::format_to(it, "# HELP {0}_{1} {2}\n# TYPE {0}_{1} counter\n", prefix, name, help);
    for (std::size_t k = 0; k < kNumMissReasons; ++k)
      fmt::format_to(it, "{}_{}{{reason=\"{}\"}} {}\n", prefix, name, to_string(static_cast<MissReason>(k)),
                     (*values)[k]);
  }
  for (const auto& [name, values, help] :
       {std::tuple{"used_pages", &c.used_pages, "Small pages with holders, per group"},
        std::tuple{"evictable_pages", &c.evictable_pages, "Cached small pages without holders, per group"}}) {
    fmt::format_to(it, "# HELP {0}_{1} {2}\n# TYPE {0}_{1} gauge\n", prefix, name, help);
    for (GroupId g = 0; g < values->size() && g < layout.num_groups(); ++g)
      fmt::format_to(it, "{}_{}{{group=\"{}\"}} {}\n", prefix, name, escaped(layout.group(g).name), (*values)[g]);
  }
}

}  // namespace kvmm
