// Prometheus text exposition (format 0.0.4) of a KVCacheManager's counters: one HELP and
// TYPE line per metric, counters suffixed _total, per-group gauges labelled with the
// group's name. O(groups) and one string; meant for a metrics endpoint scraped every few
// seconds, not for each step.
#pragma once

#include "kvmm/manager/kv_cache_manager.hpp"

#include <string>
#include <string_view>

namespace kvmm {

// Appends the exposition of `c` (group names from `layout`) to `out`, every metric name
// starting with `prefix` + '_' (prefix: [a-zA-Z_][a-zA-Z0-9_]*, else kvmm::Error).
void append_prometheus_text(const ManagerCounters& c, const KVLayout& layout, std::string& out,
                            std::string_view prefix = "kvmm");
inline std::string prometheus_text(const KVCacheManager& kv, std::string_view prefix = "kvmm") {
  std::string out;
  append_prometheus_text(kv.counters(), kv.layout(), out, prefix);
  return out;
}

}  // namespace kvmm
