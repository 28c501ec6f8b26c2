// kvmm-sim: replays a serving workload through kvmm and through models of today's
// engines' KV memory policies, with one scheduler, and writes per-step CSV and summary
// JSON per policy. Usage: kvmm-sim --help; docs/sim.md describes models and workloads.
#include "kvmm/spec/layer_slicing.hpp"
#include "sim/model_config.hpp"
#include "sim/policy.hpp"
#include "sim/scheduler.hpp"
#include "sim/workload.hpp"

#include "kvmm/error.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace kvmm::sim;
using kvmm::kSliceAuto;
using kvmm::kSliceSmallest;

constexpr const char* kUsage = R"(usage: kvmm-sim --model PRESET|config.json --workload NAME|trace.jsonl [options]

  --model M           preset name (see --list) or a Hugging Face config.json
                      (llama, mllama, gemma2, gemma3, mistral, jamba)
  --workload W        sharegpt | mmmu-pro | arxiv-qa | multi-turn | arxiv-sweep |
                      chat | agentic | path.jsonl
  --policy P          kvmm | paged-uniform | max-page | static-split | unified-block |
                      vllm-0.33 | vllm-0.33-tuned | trtllm-v2 | sglang, a comma-separated
                      list, or all (default: all); vllm-eagle (kvmm's manager under
                      vLLM's EAGLE rules) only by name
  --memory-gib X      KV cache memory budget in GiB (default 40)
  --seed N            workload seed (default 1)
  --requests N        requests to generate for a synthetic workload (default 1000)
  --rate R            Poisson arrivals, R requests per step (default 0: all at step 0)
  --articles N        arxiv-sweep: articles the questions cycle over (default 8)
  --question-tokens LO-HI
                      arxiv-qa / arxiv-sweep: question tokens U[LO, HI] (default 16-64)
  --retention-interval N
                      vllm-0.33-tuned: prefix_cache_retention_interval in tokens
                      (default 4096; a multiple of the block size)
  --prefix-match-unit N
                      vllm-0.33: vLLM's prefix_match_unit, the finest boundary a hit may
                      end on (default: the configured block size; the grown block size
                      gives hits at block boundaries only)
  --hit-unit N        kvmm: KVCacheManagerOptions::hit_unit, hits ending at any multiple of
                      N tokens inside a page, the partial page copied (default 0: off;
                      full-attention and sliding-window models of one page size only)
  --learned-tail N    kvmm: KVCacheManagerOptions::learned_tail_tokens (the prompt tail
                      that adapts to the suffixes seen; 0: off; default the manager's)
  --retention-budget X
                      kvmm: KVCacheManagerOptions::retention_budget, the bound on pages
                      held for retention as a fraction of the pool (default 0.25)
  --retention-release off|own|all
                      kvmm: KVCacheManagerOptions::retention_release, which held pages a
                      refused running request releases first (default own)
  --max-state-pages N kvmm's plan: LayoutOptions::max_state_pages_per_large_page, at
                      most N recurrent-state pages per large page by fitting the
                      attention pages (default the library's; 0: off)
  --pack-small-pages on|off|auto
                      kvmm: KVCacheManagerOptions::pack_small_pages (default auto: on
                      unless the model has draft groups; off: Jenga's step order, a
                      fresh large page per request first)
  --slice-layers N|auto|smallest|default|off
                      kvmm: cut each attention group into groups of N layers (the
                      remainder one smaller group), so that every group's page has one
                      size as in vLLM's hybrid allocator (auto: the gcd of their layer
                      counts, smallest: the fewest, if per-layer pages are equal; off or
                      0: one group per layer kind; default: the library planner's rule,
                      LayoutOptions::slice_layers: smallest when a group has more than 8
                      pages per large page, so Gemma-3-27B only)
  --sparse-state-checkpoints on|off
                      kvmm: KVCacheManagerOptions::sparse_state_checkpoints (default
                      off: every Mamba checkpoint cached; on: only those at the prompt's
                      end and at cache boundaries)
  --boundaries B      kvmm's retention at shared-prefix boundaries: none (Jenga's rule),
                      hinted (the trace's boundaries as RequestExtras::cache_boundaries),
                      learned (the manager's defaults: learned_boundaries = 4096 and
                      prompt_tail_tokens = 64; the default here too), both
  --token-budget N    tokens computed per step (default 8192)
  --max-seqs N        running requests at most (default 256)
  --tokens-per-page N tokens per small page / block (default 16)
  --group-tokens-per-page G=N[,G=N...]
                      tokens per page of the named groups only (e.g. self=8)
  --kv-dtype-bytes N  KV element size in bytes (default 2)
  --kv-cache-dtype D  KV element format of the attention groups, vLLM's names (fp8,
                      fp8_e5m2, fp8_ds_mla, nvfp4, mxfp8, int8, ...; default auto:
                      --kv-dtype-bytes, unscaled)
  --max-large-page-mib X
                      the planner's large-page limit in MiB (default: the library's,
                      64 MiB; past it kvmm fits smaller attention pages, else pads)
  --fit-tokens-per-page on|off
                      kvmm's plan may shrink the attention pages when the LCM passes
                      the limit (default on); off, it pads them (kvmm and vllm-eagle;
                      the other policies always page at --tokens-per-page)
  --speculative K     speculative decoding: each decode step proposes K draft tokens
                      (lookahead pages), draft j accepted with probability
                      --accept-rate while the earlier ones were; draft positions
                      recomputed at admission count as prefill (kvmm, vllm-eagle only)
  --accept-rate A     per-draft acceptance probability (default 0.65)
  --max-steps N       stop after N steps (default: run to completion)
  --csv-every N       write every N-th step to the CSV (default 1)
  --out DIR           write DIR/<policy>.steps.csv, DIR/<policy>.summary.json,
                      DIR/summary.csv and DIR/run.json
  --no-prefix-caching turn prefix caching off in every policy (compares the
                      memory policies alone)
  --dump-trace FILE   write the workload as a JSONL trace and continue
  --list              list presets, workloads and policies
)";

std::uint64_t parse_uint(const std::string& flag, const std::string& v) {
  std::uint64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size()) kvmm::fail("{} = '{}': expected a non-negative integer", flag, v);
  return x;
}

double parse_double(const std::string& flag, const std::string& v) {
  try {
    std::size_t used = 0;
    const double x = std::stod(v, &used);
    if (used != v.size() || !std::isfinite(x) || x < 0) throw std::invalid_argument(v);
    return x;
  } catch (const std::exception&) {
    kvmm::fail("{} = '{}': expected a non-negative number", flag, v);
  }
}

std::uint32_t to_u32(const std::string& flag, std::uint64_t x, std::uint64_t lo) {
  if (x < lo || x > 0xffffffffULL) kvmm::fail("{} = {}: must be in [{}, 2^32)", flag, x, lo);
  return static_cast<std::uint32_t>(x);
}

int run(int argc, char** argv) {
  std::string model, workload, policies = "all", out, dump;
  double memory_gib = 40, rate = 0, accept_rate = 0.65;
  std::uint32_t speculative = 0;
  bool caching = true;
  std::uint64_t seed = 1, requests = 1000, max_steps = 0, articles = 0;  // articles 0: not given
  BoundaryMode boundaries = BoundaryMode::kLearned;
  std::uint32_t token_budget = 8192, max_seqs = 256, tpp = 16, dtype = 2, csv_every = 1;
  std::string kv_cache_dtype = "auto";
  std::uint64_t max_large_page_bytes = 0;  // 0: the library's default
  bool fit_tokens_per_page = true;
  std::optional<std::uint32_t> max_state_pages;  // --max-state-pages (unset: the library's default)
  std::string pack_small_pages = "auto";         // on, off or auto (the manager's default)
  bool sparse_state_checkpoints = false;
  std::uint32_t prefix_match_unit = 0;                                         // 0: the policy's default
  std::uint32_t question_min = 16, question_max = 64, retention_interval = 0;  // interval 0: the policy's default
  std::uint32_t hit_unit = 0;
  std::uint32_t slice = kSliceLibraryDefault;  // --slice-layers: 0 off, kSliceAuto, kSliceSmallest
  std::optional<std::uint32_t> learned_tail;   // none: the manager's default
  double retention_budget = kvmm::KVCacheManagerOptions{}.retention_budget;
  kvmm::RetentionRelease retention_release = kvmm::KVCacheManagerOptions{}.retention_release;
  bool questions_given = false;
  std::vector<std::pair<std::string, std::uint32_t>> group_tpp;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--list") {
      fmt::print("presets:   {}\nworkloads: {}\npolicies:  {}\n", fmt::join(kvmm::presets::names(), ", "),
                 fmt::join(workload_names(), ", "), fmt::join(policy_names(), ", "));
      return 0;
    }
    if (a == "--no-prefix-caching") {
      caching = false;
      continue;
    }
    if (i + 1 >= argc) kvmm::fail("{}: missing value (see --help)", a);
    const std::string v = argv[++i];
    if (a == "--model")
      model = v;
    else if (a == "--workload")
      workload = v;
    else if (a == "--policy")
      policies = v;
    else if (a == "--memory-gib")
      memory_gib = parse_double(a, v);
    else if (a == "--seed")
      seed = parse_uint(a, v);
    else if (a == "--requests")
      requests = parse_uint(a, v);
    else if (a == "--rate")
      rate = parse_double(a, v);
    else if (a == "--articles")
      articles = to_u32(a, parse_uint(a, v), 1);
    else if (a == "--question-tokens") {
      const std::size_t dash = v.find('-');
      if (dash == std::string::npos) kvmm::fail("{} = '{}': expected LO-HI", a, v);
      question_min = to_u32(a, parse_uint(a, v.substr(0, dash)), 1);
      question_max = to_u32(a, parse_uint(a, v.substr(dash + 1)), question_min);
      questions_given = true;
    } else if (a == "--retention-interval")
      retention_interval = to_u32(a, parse_uint(a, v), 1);
    else if (a == "--prefix-match-unit")
      prefix_match_unit = to_u32(a, parse_uint(a, v), 1);
    else if (a == "--hit-unit")
      hit_unit = to_u32(a, parse_uint(a, v), 0);
    else if (a == "--learned-tail")
      learned_tail = to_u32(a, parse_uint(a, v), 0);
    else if (a == "--retention-budget")
      retention_budget = parse_double(a, v);
    else if (a == "--retention-release")
      retention_release = parse_retention_release(v);
    else if (a == "--boundaries")
      boundaries = parse_boundary_mode(v);
    else if (a == "--token-budget")
      token_budget = to_u32(a, parse_uint(a, v), 1);
    else if (a == "--max-seqs")
      max_seqs = to_u32(a, parse_uint(a, v), 1);
    else if (a == "--tokens-per-page")
      tpp = to_u32(a, parse_uint(a, v), 1);
    else if (a == "--group-tokens-per-page") {
      for (std::size_t p = 0; p <= v.size();) {
        const std::size_t e = std::min(v.find(',', p), v.size());
        const std::string item = v.substr(p, e - p);
        const std::size_t eq = item.find('=');
        if (eq == std::string::npos || eq == 0) kvmm::fail("{} = '{}': expected GROUP=N[,GROUP=N...]", a, v);
        group_tpp.emplace_back(item.substr(0, eq), to_u32(a, parse_uint(a, item.substr(eq + 1)), 1));
        p = e + 1;
      }
    } else if (a == "--kv-dtype-bytes")
      dtype = to_u32(a, parse_uint(a, v), 1);
    else if (a == "--kv-cache-dtype")
      kv_cache_dtype = v;
    else if (a == "--max-large-page-mib") {
      const double mib = parse_double(a, v);
      if (!(mib > 0) || mib > 1048576) kvmm::fail("{} = '{}': expected a number of MiB in (0, 1048576]", a, v);
      max_large_page_bytes = static_cast<std::uint64_t>(mib * 1048576.0);
    } else if (a == "--fit-tokens-per-page") {
      if (v != "on" && v != "off") kvmm::fail("{} = '{}': expected on or off", a, v);
      fit_tokens_per_page = v == "on";
    } else if (a == "--max-state-pages") {
      max_state_pages = to_u32(a, parse_uint(a, v), 0);
    } else if (a == "--pack-small-pages") {
      if (v != "on" && v != "off" && v != "auto") kvmm::fail("{} = '{}': expected on, off or auto", a, v);
      pack_small_pages = v;
    } else if (a == "--slice-layers") {
      slice = v == "auto"       ? kSliceAuto
              : v == "smallest" ? kSliceSmallest
              : v == "default"  ? kSliceLibraryDefault
              : v == "off"      ? 0
                                : to_u32(a, parse_uint(a, v), 0);
      if ((slice == kSliceAuto && v != "auto") || (slice == kSliceSmallest && v != "smallest") ||
          (slice == kSliceLibraryDefault && v != "default"))
        kvmm::fail("{} = '{}': expected a layer count, auto, smallest, default or off", a, v);
    } else if (a == "--sparse-state-checkpoints") {
      if (v != "on" && v != "off") kvmm::fail("{} = '{}': expected on or off", a, v);
      sparse_state_checkpoints = v == "on";
    } else if (a == "--speculative")
      speculative = to_u32(a, parse_uint(a, v), 0);
    else if (a == "--accept-rate") {
      accept_rate = parse_double(a, v);
      if (accept_rate > 1) kvmm::fail("{} = '{}': expected a probability in [0, 1]", a, v);
    } else if (a == "--max-steps")
      max_steps = parse_uint(a, v);
    else if (a == "--csv-every")
      csv_every = to_u32(a, parse_uint(a, v), 1);
    else if (a == "--out")
      out = v;
    else if (a == "--dump-trace")
      dump = v;
    else
      kvmm::fail("{}: unknown option (see --help)", a);
  }
  if (model.empty()) kvmm::fail("--model: required (a preset from --list or a config.json)");
  if (workload.empty()) kvmm::fail("--workload: required ({} or a .jsonl)", fmt::join(workload_names(), ", "));
  if (memory_gib <= 0) kvmm::fail("--memory-gib = {}: must be > 0", memory_gib);

  ModelOptions mo;
  mo.tokens_per_page = tpp;
  mo.group_tokens_per_page = group_tpp;
  mo.dtype_bytes = dtype;
  mo.kv_cache_dtype = kv_cache_dtype;
  mo.max_large_page_bytes = max_large_page_bytes;
  mo.fit_tokens_per_page = fit_tokens_per_page;
  mo.max_state_pages_per_large_page = max_state_pages;
  const kvmm::KVLayout layout = load_model(model, mo);
  // The policies on kvmm's manager (kvmm, and vllm-eagle: vLLM's rules on kvmm's manager)
  // take kvmm's plan (tokens per page fitted where the LCM passes the limit); the other
  // engines' policies page the model at the tokens per page asked for.
  ModelOptions asked = mo;
  asked.fit_tokens_per_page = false;
  const kvmm::KVLayout requested = load_model(model, asked);
  WorkloadOptions wo;
  wo.num_requests = to_u32("--requests", requests, 1);
  wo.seed = seed;
  wo.rate = rate;
  if (articles > 0 && workload != "arxiv-sweep")
    kvmm::fail("--articles = {}: only arxiv-sweep has articles (workload '{}')", articles, workload);
  if (articles > 0) wo.articles = static_cast<std::uint32_t>(articles);
  if (questions_given && workload != "arxiv-qa" && workload != "arxiv-sweep")
    kvmm::fail("--question-tokens = {}-{}: only arxiv-qa and arxiv-sweep have questions (workload '{}')", question_min,
               question_max, workload);
  wo.question_min = question_min;
  wo.question_max = question_max;
  const Workload w = make_workload(workload, wo);
  if (!dump.empty()) {
    std::ofstream f(dump);
    if (!f) kvmm::fail("--dump-trace = '{}': cannot write", dump);
    write_trace(w, f);
  }

  std::vector<std::string> names;
  if (policies == "all") {
    names = policy_names();
  } else {
    for (std::size_t p = 0; p <= policies.size();) {
      const std::size_t e = std::min(policies.find(',', p), policies.size());
      names.push_back(policies.substr(p, e - p));
      p = e + 1;
    }
  }
  for (const std::string& n : names)
    if (std::find(policy_names().begin(), policy_names().end(), n) == policy_names().end() &&
        std::find(speculative_policy_names().begin(), speculative_policy_names().end(), n) ==
            speculative_policy_names().end())
      kvmm::fail("--policy = '{}': unknown; known: {}, {} or all", n, fmt::join(policy_names(), ", "),
                 fmt::join(speculative_policy_names(), ", "));
  if (speculative > 0)
    for (const std::string& n : names)
      if (n != "kvmm" && n != "vllm-eagle")
        kvmm::fail("--policy = '{}': no speculative mode (--speculative {}: kvmm and vllm-eagle only)", n, speculative);
  const ModelShape shape = shape_of(layout);
  PolicyOptions po;
  po.memory_bytes = static_cast<std::uint64_t>(memory_gib * 1073741824.0);
  po.max_seqs = max_seqs;
  po.prefix_caching = caching;
  po.boundaries = boundaries;
  if (retention_interval > 0) po.retention_interval = retention_interval;
  po.prefix_match_unit = prefix_match_unit;
  po.hit_unit = hit_unit;
  po.slice_layers = slice;
  if (pack_small_pages != "auto") po.pack_small_pages = pack_small_pages == "on";
  po.sparse_state_checkpoints = sparse_state_checkpoints;
  if (learned_tail) po.learned_tail = *learned_tail;
  po.retention_budget = retention_budget;
  po.retention_release = retention_release;
  po.tag_states = speculative > 0;
  po.max_model_len = 1;
  po.max_encoder_tokens = 1;
  for (const SimRequest& r : w.requests) {
    const std::uint32_t dec = r.prompt_len + (shape.cross_attention ? 0 : r.image_tokens()) + r.output_len;
    po.max_model_len = std::max(po.max_model_len, dec);
    po.max_encoder_tokens = std::max(po.max_encoder_tokens, r.image_tokens());
  }
  SchedulerOptions so;
  so.token_budget = token_budget;
  so.max_seqs = max_seqs;
  so.max_steps = max_steps;
  so.csv_every = csv_every;
  so.speculative = speculative;
  so.accept_rate = accept_rate;
  so.spec_seed = seed;

  if (!out.empty()) std::filesystem::create_directories(out);
  fmt::print("model {}:\n{}\nworkload {}: {} requests\n", model, layout.describe(), w.name, w.requests.size());
  fmt::print("{:<15} {:>7} {:>9} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>12}\n", "policy", "steps",
             "finished", "batch", "decode", "preempt", "out/step", "hit%", "waste%", "peakw%", "gfree%", "hit1st%",
             "prefill");
  std::string csv_summary =
      "policy,steps,finished,aborted,mean_running,mean_decode_batch,preemptions,tokens_per_step,"
      "output_tokens_per_step,prefix_hit_rate,mean_used,mean_wasted,peak_wasted,mean_cached,mean_group_free,"
      "mean_free,evictions,wall_seconds,first_admission_hit_rate,prefill_tokens\n";
  std::string run_json = fmt::format("{{\n  \"command\": \"{}\",\n  \"policies\": {{\n", [&] {
    std::string c;
    for (int i = 0; i < argc; ++i) {
      if (i > 0) c.push_back(' ');
      c.append(argv[i]);
    }
    return c;
  }());
  for (std::size_t k = 0; k < names.size(); ++k) {
    const kvmm::KVLayout& own = names[k] == "kvmm" || names[k] == "vllm-eagle" ? layout : requested;
    auto policy = make_policy(names[k], own, po);
    std::ofstream csv;
    if (!out.empty()) {
      csv.open(out + "/" + names[k] + ".steps.csv");
      if (!csv) kvmm::fail("--out = '{}': cannot write {}.steps.csv", out, names[k]);
    }
    Summary s = simulate(w, own, *policy, so, out.empty() ? nullptr : &csv);
    s.model = model;
    fmt::print(
        "{:<15} {:>7} {:>9} {:>8.2f} {:>8.2f} {:>9} {:>9.2f} {:>8.2f} {:>8.3f} {:>8.3f} {:>8.2f} {:>8.2f} {:>12}"
        "  ({:.2f} s)\n",
        s.policy, s.steps, s.finished, s.mean_running, s.mean_decode_batch, s.preemptions, s.output_tokens_per_step,
        100 * s.prefix_hit_rate, 100 * s.mean_wasted, 100 * s.peak_wasted, 100 * s.mean_group_free,
        100 * s.first_hit_rate, s.prefill_tokens, s.wall_seconds);
    // Why lookups missed (kvmm: the manager's miss reasons; a retried admission counts each lookup).
    if (const auto misses = policy->miss_reasons(); !misses.empty()) {
      std::string line;
      for (const Policy::MissCount& m : misses)
        if (m.lookups > 0) line += fmt::format(" {} {} ({} tok)", m.reason, m.lookups, m.tokens);
      fmt::print("{:<15}   misses:{}\n", "", line.empty() ? " none" : line);
    }
    if (const std::string line = policy->retention_line(); !line.empty()) fmt::print("{:<15}   {}\n", "", line);
    csv_summary += fmt::format(
        "{},{},{},{},{:.4f},{:.4f},{},{:.3f},{:.4f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{},{:.3f},"
        "{:.6f},{}\n",
        s.policy, s.steps, s.finished, s.aborted, s.mean_running, s.mean_decode_batch, s.preemptions, s.tokens_per_step,
        s.output_tokens_per_step, s.prefix_hit_rate, s.mean_used, s.mean_wasted, s.peak_wasted, s.mean_cached,
        s.mean_group_free, s.mean_free, s.evictions, s.wall_seconds, s.first_hit_rate, s.prefill_tokens);
    std::string desc;
    for (char c : policy->describe()) {
      if (c == '"' || c == '\\') desc.push_back('\\');
      desc.push_back(c);
    }
    run_json += fmt::format("    \"{}\": \"{}\"{}\n", names[k], desc, k + 1 < names.size() ? "," : "");
    if (!out.empty()) {
      std::ofstream j(out + "/" + names[k] + ".summary.json");
      j << summary_json(s, true) << '\n';
    }
  }
  run_json += "  }\n}\n";
  if (!out.empty()) {
    std::ofstream(out + "/summary.csv") << csv_summary;
    std::ofstream(out + "/run.json") << run_json;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const kvmm::Error& e) {
    std::fprintf(stderr, "kvmm-sim: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvmm-sim: error: %s\n", e.what());
    return 2;
  }
}
