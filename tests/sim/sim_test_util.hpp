// Helpers for the simulator tests: tiny layouts whose numbers are easy to work by hand,
// and a runner that returns the per-step CSV as rows of named columns.
#pragma once

#include "sim/policy.hpp"
#include "sim/scheduler.hpp"
#include "sim/workload.hpp"

#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace simtest {

using Row = std::map<std::string, std::uint64_t>;

struct Run {
  kvmm::sim::Summary summary;
  std::vector<Row> rows;
  std::string csv;
};

inline std::vector<Row> parse_csv(const std::string& csv) {
  std::istringstream in(csv);
  std::string line;
  std::getline(in, line);
  std::vector<std::string> cols;
  for (std::size_t p = 0; p <= line.size();) {
    std::size_t e = line.find(',', p);
    if (e == std::string::npos) e = line.size();
    cols.push_back(line.substr(p, e - p));
    p = e + 1;
  }
  std::vector<Row> rows;
  while (std::getline(in, line)) {
    Row r;
    std::size_t p = 0;
    for (const std::string& c : cols) {
      std::size_t e = line.find(',', p);
      if (e == std::string::npos) e = line.size();
      r[c] = std::stoull(line.substr(p, e - p));
      p = e + 1;
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

inline Run run(const kvmm::sim::Workload& w, const kvmm::KVLayout& layout, const std::string& policy,
               std::uint64_t memory_bytes, std::uint32_t token_budget = 8192, std::uint32_t max_seqs = 64,
               std::uint32_t max_model_len = 0, std::uint32_t max_encoder_tokens = 1, bool prefix_caching = true,
               kvmm::sim::BoundaryMode boundaries = kvmm::sim::BoundaryMode::kLearned) {
  kvmm::sim::PolicyOptions po;
  po.prefix_caching = prefix_caching;
  po.boundaries = boundaries;
  po.memory_bytes = memory_bytes;
  po.max_seqs = max_seqs;
  po.max_encoder_tokens = max_encoder_tokens;
  po.max_model_len = max_model_len;
  if (po.max_model_len == 0)
    for (const auto& r : w.requests) po.max_model_len = std::max(po.max_model_len, r.prompt_len + r.output_len);
  auto p = kvmm::sim::make_policy(policy, layout, po);
  kvmm::sim::SchedulerOptions so;
  so.token_budget = token_budget;
  so.max_seqs = max_seqs;
  so.check_invariants = true;
  std::ostringstream csv;
  Run out;
  out.summary = kvmm::sim::simulate(w, layout, *p, so, &csv);
  out.csv = csv.str();
  out.rows = parse_csv(out.csv);
  return out;
}

// One full-attention layer (32 B per token, 4 tokens per page = 128 B pages) and two
// sliding-window layers (window 8, 64 B per token, 256 B pages). Large page 256 B.
inline kvmm::KVLayout hybrid_layout() {
  return kvmm::KVLayout::plan({kvmm::LayerGroup::full_attention("full", 1, 1, 8, 2, 4),
                               kvmm::LayerGroup::sliding_window("sliding", 2, 1, 8, 2, 4, 8)});
}

inline kvmm::KVLayout full_layout() {
  return kvmm::KVLayout::plan({kvmm::LayerGroup::full_attention("full", 1, 1, 8, 2, 4)});
}

inline kvmm::sim::SimRequest req(std::uint32_t prompt, std::uint32_t output, std::uint64_t arrival = 0) {
  kvmm::sim::SimRequest r;
  r.prompt_len = prompt;
  r.output_len = output;
  r.arrival = arrival;
  return r;
}

}  // namespace simtest
