#include "sim/scheduler.hpp"

#include "kvmm/error.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <deque>
#include <ostream>
#include <queue>

namespace kvmm::sim {

ModelShape shape_of(const KVLayout& layout) {
  ModelShape s;
  for (const LayerGroup& g : layout.groups()) {
    if (g.kind == LayerKind::kCrossAttention) s.cross_attention = true;
    if (!g.is_decoder()) s.encoder_groups = true;
  }
  return s;
}

namespace {

enum class Status : std::uint8_t { kPending, kWaiting, kRunning, kFinished, kAborted };

struct ReqState {
  std::uint32_t tokens = 0;    // decoder tokens known: prompt + generated
  std::uint32_t computed = 0;  // tokens with KV
  std::uint32_t generated = 0;
  Status status = Status::kPending;
  bool added = false;     // registered with the policy
  bool admitted = false;  // admitted once (first_hit_tokens counted)
};

}  // namespace

Summary simulate(const Workload& w, const KVLayout& layout, Policy& policy, const SchedulerOptions& o,
                 std::ostream* csv) {
  if (o.token_budget == 0) fail("token_budget = 0: must be >= 1");
  if (o.max_seqs == 0) fail("max_seqs = 0: must be >= 1");
  if (o.speculative > 0 && !policy.speculative())
    fail("policy = '{}': no speculative mode (speculative = {}; only kvmm and vllm-eagle)", policy.name(),
         o.speculative);
  if (!(o.accept_rate >= 0 && o.accept_rate <= 1)) fail("accept_rate = {}: must be in [0, 1]", o.accept_rate);
  std::uint64_t rng = o.spec_seed;  // splitmix64: the same draws with any standard library
  auto uniform = [&rng] {
    std::uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
  };
  auto draw_accepted = [&](std::uint32_t k) {
    std::uint32_t a = 0;
    while (a < k && uniform() < o.accept_rate) ++a;
    return a;
  };
  const auto start = std::chrono::steady_clock::now();
  const ModelShape shape = shape_of(layout);
  const auto n = static_cast<std::uint32_t>(w.requests.size());
  std::vector<ReqState> st(n);
  std::vector<SeqInfo> info(n);
  std::vector<std::vector<std::uint32_t>> children(n);
  using Arrival = std::pair<std::uint64_t, std::uint32_t>;
  std::priority_queue<Arrival, std::vector<Arrival>, std::greater<>> arrivals;
  for (std::uint32_t i = 0; i < n; ++i) {
    const SimRequest& r = w.requests[i];
    if (r.output_len == 0) fail("request {}: output_len = 0: must be >= 1", i);
    const std::uint32_t images = r.image_tokens();
    st[i].tokens = r.prompt_len + (shape.cross_attention ? 0 : images);
    if (st[i].tokens == 0) fail("request {}: empty prompt (no text or inlined image tokens)", i);
    info[i] = SeqInfo{i,
                      shape.encoder_groups ? images : 0,
                      r.prefix_id,
                      r.prefix_len,
                      r.token_ids.empty() ? nullptr : &r.token_ids,
                      r.images.empty() ? nullptr : &r.images,
                      r.boundaries.empty() ? nullptr : &r.boundaries,
                      st[i].tokens};
    if (r.parent >= 0) {
      if (r.parent >= i) fail("request {}: parent = {} must be an earlier request", i, r.parent);
      children[static_cast<std::size_t>(r.parent)].push_back(i);
    } else {
      arrivals.push({r.arrival, i});
    }
  }

  Summary s;
  s.speculative = o.speculative;
  s.policy = std::string(policy.name());
  s.workload = w.name;
  s.requests = n;
  std::deque<std::uint32_t> waiting;
  std::vector<std::uint32_t> running, sched_id, sched_n, sched_k;
  MemoryStats mem;
  std::vector<GroupSummary> gsum;
  double sum_running = 0, sum_decode = 0, decode_steps = 0;
  double sum_used = 0, sum_wasted = 0, sum_cached = 0, sum_gfree = 0, sum_free = 0;
  std::uint64_t step = 0;
  bool header = false;

  auto preempt = [&](std::uint32_t v) {
    policy.preempt(v);
    st[v].added = false;
    st[v].computed = 0;
    st[v].status = Status::kWaiting;
    waiting.push_front(v);
    ++s.preemptions;
  };
  // An aborted request's follow-ups (multi-turn) are aborted with it: they never arrive.
  std::vector<std::uint32_t> doomed;
  auto abort_request = [&](std::uint32_t v) {
    if (st[v].added) policy.free(v);
    st[v].added = false;
    doomed.assign(1, v);
    while (!doomed.empty()) {
      const std::uint32_t d = doomed.back();
      doomed.pop_back();
      st[d].status = Status::kAborted;
      ++s.aborted;
      doomed.insert(doomed.end(), children[d].begin(), children[d].end());
    }
  };
  auto finish = [&](std::uint32_t v) {
    policy.free(v);
    st[v].added = false;
    st[v].status = Status::kFinished;
    ++s.finished;
    for (std::uint32_t c : children[v]) {
      const SimRequest& r = w.requests[c];
      arrivals.push({std::max(r.arrival, step + 1 + r.delay), c});
    }
  };

  while (s.finished + s.aborted < n) {
    if (o.max_steps > 0 && step >= o.max_steps) break;
    if (running.empty() && waiting.empty()) {
      if (arrivals.empty()) fail("internal: requests left but none can arrive");
      step = std::max(step, arrivals.top().first);
    }
    while (!arrivals.empty() && arrivals.top().first <= step) {
      const std::uint32_t i = arrivals.top().second;
      arrivals.pop();
      st[i].status = Status::kWaiting;
      waiting.push_back(i);
    }
    policy.begin_step();
    std::uint64_t budget = o.token_budget;
    const std::uint64_t preemptions_before = s.preemptions;
    sched_id.clear();
    sched_n.clear();
    sched_k.clear();
    std::uint64_t recompute = 0;  // draft positions recomputed at this step's admissions
    // 1. Running requests, oldest first; preempt the newest when memory runs out.
    for (std::size_t i = 0; i < running.size() && budget > 0; ++i) {
      const std::uint32_t r = running[i];
      const auto want = static_cast<std::uint32_t>(std::min<std::uint64_t>(st[r].tokens - st[r].computed, budget));
      // Drafts: decode steps only, never past the output nor the budget.
      std::uint32_t drafts = 0;
      if (o.speculative > 0 && st[r].generated > 0 && st[r].tokens - st[r].computed == 1)
        drafts = static_cast<std::uint32_t>(
            std::min<std::uint64_t>({o.speculative, w.requests[r].output_len - st[r].generated - 1, budget - want}));
      auto alloc = [&] {
        return o.speculative > 0 ? policy.allocate_lookahead(r, st[r].computed, want, drafts)
                                 : policy.allocate(r, st[r].computed, want);
      };
      bool ok = true;
      while (!alloc()) {
        if (running.size() > i + 1) {
          preempt(running.back());
          running.pop_back();
          continue;
        }
        if (i == 0)
          abort_request(r);  // alone and still no memory: it can never fit
        else
          preempt(r);
        running.pop_back();
        ok = false;
        break;
      }
      if (!ok) break;
      sched_id.push_back(r);
      sched_n.push_back(want);
      sched_k.push_back(drafts);
      budget -= want + drafts;
    }
    // 2. Waiting requests in arrival order (preempted ones first), while budget lasts;
    //    none in a step that had to preempt (vLLM v1's rule against thrashing).
    const bool preempted_now = s.preemptions != preemptions_before;
    while (!preempted_now && !waiting.empty() && budget > 0 && running.size() < o.max_seqs) {
      const std::uint32_t r = waiting.front();
      ReqState& q = st[r];
      if (!q.added) {
        policy.add_request(r, info[r]);
        q.added = true;
        q.computed = policy.lookup_prefix(r, q.tokens - 1);
        s.lookup_tokens += q.tokens;
        s.hit_tokens += q.computed;
      }
      const auto want = static_cast<std::uint32_t>(std::min<std::uint64_t>(q.tokens - q.computed, budget));
      if (!(o.speculative > 0 ? policy.allocate_lookahead(r, q.computed, want, 0)
                              : policy.allocate(r, q.computed, want))) {
        s.lookup_tokens -= q.tokens;
        s.hit_tokens -= q.computed;
        q.added = false;
        q.computed = 0;
        if (running.empty()) {  // nothing else holds memory: it can never fit
          policy.free(r);
          waiting.pop_front();
          abort_request(r);
          continue;
        }
        policy.preempt(r);  // tried again next step
        break;              // FCFS: nobody overtakes the head of the queue
      }
      if (!q.admitted) {
        q.admitted = true;
        s.first_lookup_tokens += q.tokens;
        s.first_hit_tokens += q.computed;
      }
      if (o.speculative > 0) recompute += policy.draft_recompute_tokens(r);
      waiting.pop_front();
      q.status = Status::kRunning;
      running.push_back(r);
      sched_id.push_back(r);
      sched_n.push_back(want);
      sched_k.push_back(0);
      budget -= want;
    }
    // 3. Execute the step.
    std::uint64_t prefill = recompute, decode = 0;
    s.draft_recompute_tokens += recompute;
    for (std::size_t k = 0; k < sched_id.size(); ++k) {
      const std::uint32_t r = sched_id[k];
      ReqState& q = st[r];
      const bool is_decode = q.generated > 0 && q.tokens - q.computed == 1;
      (is_decode ? decode : prefill) += sched_n[k];
      if (sched_k[k] > 0) {
        // The target computed the last token and the drafts; the accepted ones are
        // generated tokens with KV, then the bonus token is sampled below.
        const std::uint32_t a = draw_accepted(sched_k[k]);
        decode += sched_k[k];
        s.drafted_tokens += sched_k[k];
        s.accepted_tokens += a;
        q.tokens += a;
        q.generated += a;
        s.output_tokens += a;
        q.computed += a;
      }
      q.computed += sched_n[k];
      policy.commit(r, q.computed);
      if (q.computed == q.tokens) {
        ++q.generated;
        ++s.output_tokens;
        if (q.generated >= w.requests[r].output_len)
          finish(r);
        else
          ++q.tokens;
      }
    }
    std::erase_if(running, [&](std::uint32_t r) { return st[r].status != Status::kRunning; });
    s.prefill_tokens += prefill;
    s.decode_tokens += decode;

    if (o.check_invariants) policy.check_invariants();
    policy.stats(mem);
    s.capacity_bytes = mem.capacity;
    s.evictions = mem.evictions;
    const double cap = mem.capacity > 0 ? static_cast<double>(mem.capacity) : 1.0;
    if (gsum.empty()) {
      gsum.resize(mem.groups.size());
      for (std::size_t g = 0; g < gsum.size(); ++g) gsum[g].name = mem.groups[g].name;
    }
    std::uint64_t used = 0, wasted = 0, cached = 0, gfree = 0;
    for (std::size_t g = 0; g < mem.groups.size(); ++g) {
      const GroupUsage& u = mem.groups[g];
      used += u.used;
      wasted += u.wasted;
      cached += u.cached;
      gfree += u.group_free;
      gsum[g].mean_used += static_cast<double>(u.used) / cap;
      gsum[g].mean_wasted += static_cast<double>(u.wasted) / cap;
      gsum[g].mean_cached += static_cast<double>(u.cached) / cap;
      gsum[g].mean_group_free += static_cast<double>(u.group_free) / cap;
    }
    sum_used += static_cast<double>(used) / cap;
    sum_wasted += static_cast<double>(wasted) / cap;
    s.peak_wasted = std::max(s.peak_wasted, static_cast<double>(wasted) / cap);
    sum_cached += static_cast<double>(cached) / cap;
    sum_gfree += static_cast<double>(gfree) / cap;
    sum_free += static_cast<double>(mem.free) / cap;
    sum_running += static_cast<double>(running.size());
    s.peak_running = std::max<std::uint64_t>(s.peak_running, running.size());
    if (decode > 0) {
      sum_decode += static_cast<double>(decode);
      decode_steps += 1;
    }
    if (csv != nullptr) {
      if (!header) {
        *csv << "step,running,waiting,prefill_tokens,decode_tokens,preemptions,finished,hit_tokens,evictions,"
                "capacity,free";
        for (const GroupUsage& u : mem.groups)
          *csv << fmt::format(",{0}.used,{0}.wasted,{0}.cached,{0}.group_free", u.name);
        *csv << '\n';
        header = true;
      }
      if (step % o.csv_every == 0) {
        fmt::memory_buffer b;
        fmt::format_to(std::back_inserter(b), "{},{},{},{},{},{},{},{},{},{},{}", step, running.size(), waiting.size(),
                       prefill, decode, s.preemptions, s.finished, s.hit_tokens, mem.evictions, mem.capacity, mem.free);
        for (const GroupUsage& u : mem.groups)
          fmt::format_to(std::back_inserter(b), ",{},{},{},{}", u.used, u.wasted, u.cached, u.group_free);
        b.push_back('\n');
        csv->write(b.data(), static_cast<std::streamsize>(b.size()));
      }
    }
    ++s.steps;
    ++step;
  }
  s.computed_tokens = s.prefill_tokens + s.decode_tokens;
  const double steps = s.steps > 0 ? static_cast<double>(s.steps) : 1.0;
  s.mean_running = sum_running / steps;
  s.mean_decode_batch = decode_steps > 0 ? sum_decode / decode_steps : 0;
  s.tokens_per_step = static_cast<double>(s.computed_tokens) / steps;
  s.output_tokens_per_step = static_cast<double>(s.output_tokens) / steps;
  auto ratio = [](std::uint64_t a, std::uint64_t b) {
    return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0;
  };
  s.prefix_hit_rate = ratio(s.hit_tokens, s.lookup_tokens);
  s.first_hit_rate = ratio(s.first_hit_tokens, s.first_lookup_tokens);
  s.mean_used = sum_used / steps;
  s.mean_wasted = sum_wasted / steps;
  s.mean_cached = sum_cached / steps;
  s.mean_group_free = sum_gfree / steps;
  s.mean_free = sum_free / steps;
  for (GroupSummary& g : gsum) {
    g.mean_used /= steps;
    g.mean_wasted /= steps;
    g.mean_cached /= steps;
    g.mean_group_free /= steps;
  }
  s.groups = std::move(gsum);
  s.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s;
}

std::string summary_json(const Summary& s, bool with_wall_time) {
  nlohmann::ordered_json j;
  j["policy"] = s.policy;
  j["model"] = s.model;
  j["workload"] = s.workload;
  j["requests"] = s.requests;
  j["finished"] = s.finished;
  j["aborted"] = s.aborted;
  j["steps"] = s.steps;
  j["capacity_bytes"] = s.capacity_bytes;
  j["mean_running"] = s.mean_running;
  j["peak_running"] = s.peak_running;
  j["mean_decode_batch"] = s.mean_decode_batch;
  j["preemptions"] = s.preemptions;
  j["prefix_hit_rate"] = s.prefix_hit_rate;
  j["hit_tokens"] = s.hit_tokens;
  j["lookup_tokens"] = s.lookup_tokens;
  j["first_admission_hit_rate"] = s.first_hit_rate;
  j["first_admission_hit_tokens"] = s.first_hit_tokens;
  j["first_admission_prompt_tokens"] = s.first_lookup_tokens;
  j["evictions"] = s.evictions;
  j["computed_tokens"] = s.computed_tokens;
  j["prefill_tokens"] = s.prefill_tokens;
  j["decode_tokens"] = s.decode_tokens;
  j["output_tokens"] = s.output_tokens;
  j["tokens_per_step"] = s.tokens_per_step;
  j["output_tokens_per_step"] = s.output_tokens_per_step;
  j["mean_used"] = s.mean_used;
  j["mean_wasted"] = s.mean_wasted;
  j["peak_wasted"] = s.peak_wasted;
  j["mean_cached"] = s.mean_cached;
  j["mean_group_free"] = s.mean_group_free;
  j["mean_free"] = s.mean_free;
  j["groups"] = nlohmann::ordered_json::array();
  for (const GroupSummary& g : s.groups)
    j["groups"].push_back({{"name", g.name},
                           {"mean_used", g.mean_used},
                           {"mean_wasted", g.mean_wasted},
                           {"mean_cached", g.mean_cached},
                           {"mean_group_free", g.mean_group_free}});
  if (s.speculative > 0) {
    j["speculative"] = s.speculative;
    j["drafted_tokens"] = s.drafted_tokens;
    j["accepted_tokens"] = s.accepted_tokens;
    j["draft_recompute_tokens"] = s.draft_recompute_tokens;
  }
  if (with_wall_time) j["wall_seconds"] = s.wall_seconds;
  return j.dump(2);
}

}  // namespace kvmm::sim
