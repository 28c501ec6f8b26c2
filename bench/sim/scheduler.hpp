// The one scheduler of kvmm-sim, shared by every policy: FCFS continuous batching with a
// per-step token budget, chunked prefill, and preemption by recompute (the newest
// running request goes back to the head of the queue and loses its KV) when the policy
// cannot allocate. Each step is O(running requests x groups) plus the policy's page
// work; per-step rows go to CSV, the summary to JSON.
#pragma once

#include "sim/policy.hpp"
#include "sim/workload.hpp"

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace kvmm::sim {

struct SchedulerOptions {
  std::uint32_t token_budget = 8192;  // tokens computed per step (prefill chunks + decodes)
  std::uint32_t max_seqs = 256;       // running requests at most
  std::uint64_t max_steps = 0;        // 0: run until every request finished or aborted
  std::uint32_t csv_every = 1;        // write every n-th step row
  bool check_invariants = false;      // policy.check_invariants() after every step (tests)
  // Speculative decoding: each decode step proposes up to `speculative` draft tokens
  // (Policy::allocate_lookahead; never past the request's output), the target computes
  // 1 + drafts tokens, and the drafts accepted are drawn per step: draft j is accepted
  // with probability accept_rate while drafts 1..j-1 were (a chain, Leviathan et al.
  // 2023), seeded by spec_seed. Draft positions recomputed at admission
  // (Policy::draft_recompute_tokens) count as prefill tokens. 0: off.
  std::uint32_t speculative = 0;
  double accept_rate = 0.65;
  std::uint64_t spec_seed = 1;
};

struct GroupSummary {
  std::string name;
  double mean_used = 0, mean_wasted = 0, mean_cached = 0, mean_group_free = 0;  // fractions of capacity
};

struct Summary {
  std::string policy, model, workload;
  std::uint64_t requests = 0, finished = 0, aborted = 0, steps = 0;
  std::uint64_t preemptions = 0, evictions = 0;
  std::uint64_t computed_tokens = 0, prefill_tokens = 0, decode_tokens = 0, output_tokens = 0;
  std::uint64_t lookup_tokens = 0, hit_tokens = 0;  // every admission (a preempted request's re-hits too)
  // At each request's first admission only: a preempted request re-hitting its own pages
  // is not a hit of the cache. prefill_tokens counts recomputation.
  std::uint64_t first_lookup_tokens = 0, first_hit_tokens = 0;
  // Speculative mode: draft tokens proposed and accepted, draft positions recomputed at
  // admission (also in prefill_tokens).
  std::uint64_t drafted_tokens = 0, accepted_tokens = 0, draft_recompute_tokens = 0;
  std::uint32_t speculative = 0;
  std::uint64_t capacity_bytes = 0;
  double mean_running = 0, mean_decode_batch = 0;
  std::uint64_t peak_running = 0;
  double tokens_per_step = 0, output_tokens_per_step = 0, prefix_hit_rate = 0, first_hit_rate = 0;
  double mean_used = 0, mean_wasted = 0, peak_wasted = 0, mean_cached = 0, mean_group_free = 0, mean_free = 0;
  std::vector<GroupSummary> groups;
  double wall_seconds = 0;  // not part of the deterministic output
};

struct ModelShape {
  bool cross_attention = false;  // images are encoder tokens, not decoder tokens
  bool encoder_groups = false;   // some group holds image tokens
};
ModelShape shape_of(const KVLayout& layout);

// Runs the workload through the policy. `csv` (may be null) receives a header and one
// row per step (every csv_every-th).
Summary simulate(const Workload& w, const KVLayout& layout, Policy& policy, const SchedulerOptions& o,
                 std::ostream* csv);

// The summary as a JSON object (wall time included only when with_wall_time).
std::string summary_json(const Summary& s, bool with_wall_time);

}  // namespace kvmm::sim
