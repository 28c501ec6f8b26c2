#include "sim/workload.hpp"

#include "kvmm/error.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <ostream>
#include <sstream>

namespace kvmm::sim {

namespace {

// Self-contained generator and distributions, so a seed gives the same workload with
// any standard library (std:: distributions are implementation-defined).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() { return mix64(s_++ * 0x2545f4914f6cdd1dULL + 0x1234567ULL); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  std::uint32_t uniform_int(std::uint32_t lo, std::uint32_t hi) {             // [lo, hi]
    return lo + static_cast<std::uint32_t>(next() % (std::uint64_t{hi} - lo + 1));
  }
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // Lognormal with the given mean and log-space sigma, rounded and clamped.
  std::uint32_t lognormal(double mean, double sigma, std::uint32_t lo, std::uint32_t hi) {
    const double mu = std::log(mean) - sigma * sigma / 2;
    const double v = std::exp(mu + sigma * normal());
    return static_cast<std::uint32_t>(std::clamp<long long>(std::llround(v), lo, hi));
  }
  double exponential(double mean) { return -mean * std::log(1.0 - uniform()); }

 private:
  std::uint64_t s_;
};

void assign_arrivals(std::vector<SimRequest>& reqs, double rate, Rng& rng) {
  if (rate <= 0) return;
  double t = 0;
  for (SimRequest& r : reqs) {
    if (r.parent >= 0) continue;  // follow-up turns arrive after their parent
    r.arrival = static_cast<std::uint64_t>(t);
    t += rng.exponential(1.0 / rate);
  }
}

// ShareGPT (vLLM paper Fig. 11): 161 input / 338 output tokens on average; Jenga §4.4
// quotes 1085 tokens per request. We keep the 338-token output mean and set the input
// mean to 747 so the request mean is Jenga's 1085; lognormal (sigma 1.0 / 0.9).
Workload sharegpt(const WorkloadOptions& o) {
  Rng rng(o.seed ^ 0x5a5a0001ULL);
  Workload w{"sharegpt", {}};
  w.requests.resize(o.num_requests);
  for (SimRequest& r : w.requests) {
    r.prompt_len = rng.lognormal(747, 1.0, 4, 16384);
    r.output_len = rng.lognormal(338, 0.9, 1, 4096);
  }
  assign_arrivals(w.requests, o.rate, rng);
  return w;
}

// MMMU-pro with Llama-3.2-Vision (Jenga §3.2): 6193 image and 43 text tokens per request
// on average. An image is 1..4 tiles of 1601 tokens; P(4, 3, 2, 1 tiles) = .90, .07, .02,
// .01 gives 6180 on average. Text U[20, 66]. Output U[16, 128] (an answer letter with a
// short rationale; the papers give no output statistic, so this is our assumption).
Workload mmmu_pro(const WorkloadOptions& o) {
  Rng rng(o.seed ^ 0x5a5a0002ULL);
  Workload w{"mmmu-pro", {}};
  w.requests.resize(o.num_requests);
  for (SimRequest& r : w.requests) {
    const double u = rng.uniform();
    const std::uint32_t tiles = u < 0.90 ? 4 : u < 0.97 ? 3 : u < 0.99 ? 2 : 1;
    r.images.push_back({0, tiles * 1601});
    r.prompt_len = rng.uniform_int(20, 66);
    r.output_len = rng.uniform_int(16, 128);
  }
  assign_arrivals(w.requests, o.rate, rng);
  return w;
}

// arXiv long-document QA (Jenga §7.3): articles of U[55k, 110k] tokens, U[2, 6] questions
// each (U[16, 64] tokens), answers U[50, 100] tokens. A question's prompt is the article
// followed by the question, so the article is a shared prefix. Questions on one article
// arrive near each other: the order is by article index plus a jitter U[0, 3).
Workload arxiv_qa(const WorkloadOptions& o) {
  Rng rng(o.seed ^ 0x5a5a0003ULL);
  Workload w{"arxiv-qa", {}};
  std::vector<double> key;
  for (std::uint32_t article = 0; w.requests.size() < o.num_requests; ++article) {
    const std::uint32_t len = rng.uniform_int(55000, 110000);
    const std::uint32_t questions = rng.uniform_int(2, 6);
    for (std::uint32_t q = 0; q < questions && w.requests.size() < o.num_requests; ++q) {
      SimRequest r;
      r.prompt_len = len + rng.uniform_int(o.question_min, o.question_max);
      r.output_len = rng.uniform_int(50, 100);
      r.prefix_id = 0xa000000000000000ULL + article;
      r.prefix_len = len;
      r.boundaries = {len};
      w.requests.push_back(std::move(r));
      key.push_back(article + 3.0 * rng.uniform());
    }
  }
  std::vector<std::size_t> order(w.requests.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return key[a] < key[b]; });
  std::vector<SimRequest> sorted;
  sorted.reserve(order.size());
  for (std::size_t i : order) sorted.push_back(std::move(w.requests[i]));
  w.requests = std::move(sorted);
  assign_arrivals(w.requests, o.rate, rng);
  return w;
}

// Multi-turn chat (LMSYS-Chat-1M statistics: 2.0 turns per conversation, 69.5-token user
// messages, 214.5-token responses on average). Turns per session are 1 + geometric
// (continue with p = 0.5, at most 16); turn t's prompt is the whole history plus the new
// message, and turn t+1 arrives U[1, 50] steps after turn t finished.
Workload multi_turn(const WorkloadOptions& o) {
  Rng rng(o.seed ^ 0x5a5a0004ULL);
  Workload w{"multi-turn", {}};
  for (std::uint64_t session = 0; w.requests.size() < o.num_requests; ++session) {
    std::uint32_t history = 0;
    std::int64_t parent = -1;
    for (std::uint32_t turn = 0; turn < 16 && w.requests.size() < o.num_requests; ++turn) {
      SimRequest r;
      r.prompt_len = history + rng.lognormal(69.5, 1.0, 1, 4096);
      r.output_len = rng.lognormal(214.5, 0.8, 1, 2048);
      r.prefix_id = 0xb000000000000000ULL + session;
      r.prefix_len = r.prompt_len + r.output_len;  // the whole turn is session content
      r.parent = parent;
      r.delay = parent >= 0 ? rng.uniform_int(1, 50) : 0;
      history = r.prompt_len + r.output_len;
      parent = static_cast<std::int64_t>(w.requests.size());
      w.requests.push_back(std::move(r));
      if (rng.uniform() >= 0.5) break;
    }
  }
  assign_arrivals(w.requests, o.rate, rng);
  return w;
}

// The arXiv-QA sweep of Jenga Fig. 17: `articles` articles (U[55k, 110k] tokens) and
// questions on them in round robin (request i asks about article i mod N), so a question
// finds its article cached only if the cache kept all N articles since the previous
// question on it. Questions, answers and the article boundary as in arxiv-qa.
Workload arxiv_sweep(const WorkloadOptions& o) {
  if (o.articles == 0) fail("articles = 0: arxiv-sweep needs at least one article");
  Rng rng(o.seed ^ 0x5a5a0005ULL);
  Workload w{"arxiv-sweep", {}};
  std::vector<std::uint32_t> len(o.articles);
  for (std::uint32_t& l : len) l = rng.uniform_int(55000, 110000);
  w.requests.resize(o.num_requests);
  for (std::uint32_t i = 0; i < o.num_requests; ++i) {
    SimRequest& r = w.requests[i];
    const std::uint32_t a = i % o.articles;
    r.prompt_len = len[a] + rng.uniform_int(o.question_min, o.question_max);
    r.output_len = rng.uniform_int(50, 100);
    r.prefix_id = 0xa100000000000000ULL + a;
    r.prefix_len = len[a];
    r.boundaries = {len[a]};
  }
  assign_arrivals(w.requests, o.rate, rng);
  return w;
}

// Long multi-turn chats: sessions of U[2, 8] turns; a turn's prompt is the session's
// history (earlier prompts and answers) plus a new user message (lognormal, mean 300
// tokens), the answer lognormal with mean 400; turn t+1 arrives U[1, 50] steps after turn
// t finished. Boundaries: where each earlier turn ended (the last kMaxBoundaries of them).
Workload chat(const WorkloadOptions& o) {
  constexpr std::size_t kMaxBoundaries = 8;  // the manager's kMaxCacheBoundaries
  Rng rng(o.seed ^ 0x5a5a0006ULL);
  Workload w{"chat", {}};
  for (std::uint64_t session = 0; w.requests.size() < o.num_requests; ++session) {
    const std::uint32_t turns = rng.uniform_int(2, 8);
    std::vector<std::uint32_t> ends;
    std::int64_t parent = -1;
    for (std::uint32_t turn = 0; turn < turns && w.requests.size() < o.num_requests; ++turn) {
      SimRequest r;
      r.prompt_len = (ends.empty() ? 0 : ends.back()) + rng.lognormal(300, 1.0, 1, 8192);
      r.output_len = rng.lognormal(400, 0.8, 1, 4096);
      r.prefix_id = 0xb100000000000000ULL + session;
      r.prefix_len = r.prompt_len + r.output_len;  // the whole turn is session content
      r.boundaries.assign(ends.end() - static_cast<std::ptrdiff_t>(std::min(ends.size(), kMaxBoundaries)), ends.end());
      r.parent = parent;
      r.delay = parent >= 0 ? rng.uniform_int(1, 50) : 0;
      ends.push_back(r.prompt_len + r.output_len);
      parent = static_cast<std::int64_t>(w.requests.size());
      w.requests.push_back(std::move(r));
    }
  }
  assign_arrivals(w.requests, o.rate, rng);
  return w;
}

// Agentic tool-call loops: sessions of U[3, 12] model calls. The first call's prompt is a
// task with its system prompt and tool definitions (lognormal, mean 3,000 tokens); the
// model answers with a tool call (lognormal, mean 150 tokens); each later call's prompt is
// the whole history plus the tool's result (lognormal, mean 800 tokens, 16..16384), and it
// arrives U[1, 5] steps after the previous call finished (the tool runs). The context grows
// by about 1,000 tokens a call. Boundaries: where each earlier call ended (the last
// kMaxBoundaries). The system prompt is the session's own stream (not shared across
// sessions: a request has one shared stream).
Workload agentic(const WorkloadOptions& o) {
  constexpr std::size_t kMaxBoundaries = 8;  // the manager's kMaxCacheBoundaries
  Rng rng(o.seed ^ 0x5a5a0007ULL);
  Workload w{"agentic", {}};
  for (std::uint64_t session = 0; w.requests.size() < o.num_requests; ++session) {
    const std::uint32_t calls = rng.uniform_int(3, 12);
    std::vector<std::uint32_t> ends;
    std::int64_t parent = -1;
    for (std::uint32_t call = 0; call < calls && w.requests.size() < o.num_requests; ++call) {
      SimRequest r;
      r.prompt_len =
          ends.empty() ? rng.lognormal(3000, 0.5, 256, 16384) : ends.back() + rng.lognormal(800, 1.0, 16, 16384);
      r.output_len = rng.lognormal(150, 0.7, 8, 2048);
      r.prefix_id = 0xb200000000000000ULL + session;
      r.prefix_len = r.prompt_len + r.output_len;  // the whole call is session content
      r.boundaries.assign(ends.end() - static_cast<std::ptrdiff_t>(std::min(ends.size(), kMaxBoundaries)), ends.end());
      r.parent = parent;
      r.delay = parent >= 0 ? rng.uniform_int(1, 5) : 0;
      ends.push_back(r.prompt_len + r.output_len);
      parent = static_cast<std::int64_t>(w.requests.size());
      w.requests.push_back(std::move(r));
    }
  }
  assign_arrivals(w.requests, o.rate, rng);
  return w;
}

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h | (std::uint64_t{1} << 63);
}

// A trace line's "boundaries": ascending prefix lengths in [1, prompt_len].
void parse_boundaries(const nlohmann::json& a, SimRequest& r, std::string_view file, std::size_t line_no) {
  if (!a.is_array()) fail("{}:{}: field 'boundaries': expected an ascending array of prefix lengths", file, line_no);
  for (std::size_t i = 0; i < a.size(); ++i) {
    const nlohmann::json& b = a[i];
    const std::int64_t lo = r.boundaries.empty() ? 1 : std::int64_t{r.boundaries.back()} + 1;
    if (!b.is_number_integer() || b.get<std::int64_t>() < lo || b.get<std::int64_t>() > r.prompt_len)
      fail("{}:{}: field 'boundaries[{}]': expected an integer in [{}, {}] (ascending, at most prompt_len), got {}",
           file, line_no, i, lo, r.prompt_len, b.dump());
    r.boundaries.push_back(static_cast<std::uint32_t>(b.get<std::int64_t>()));
  }
}

}  // namespace

const std::vector<std::string>& workload_names() {
  static const std::vector<std::string> kNames{"sharegpt",    "mmmu-pro", "arxiv-qa", "multi-turn",
                                               "arxiv-sweep", "chat",     "agentic"};
  return kNames;
}

Workload make_workload(const std::string& name_or_path, const WorkloadOptions& o) {
  if (o.question_min == 0 || o.question_min > o.question_max)
    fail("question tokens = {}-{}: expected 1 <= LO <= HI", o.question_min, o.question_max);
  if (name_or_path == "sharegpt") return sharegpt(o);
  if (name_or_path == "mmmu-pro") return mmmu_pro(o);
  if (name_or_path == "arxiv-qa") return arxiv_qa(o);
  if (name_or_path == "multi-turn") return multi_turn(o);
  if (name_or_path == "arxiv-sweep") return arxiv_sweep(o);
  if (name_or_path == "chat") return chat(o);
  if (name_or_path == "agentic") return agentic(o);
  if (name_or_path.ends_with(".jsonl")) return read_trace(name_or_path);
  fail(
      "workload = '{}': unknown; known: sharegpt, mmmu-pro, arxiv-qa, multi-turn, arxiv-sweep, chat, agentic, or a "
      ".jsonl "
      "trace",
      name_or_path);
}

Workload read_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("workload = '{}': cannot open the file", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_trace(ss.str(), path);
}

Workload parse_trace(std::string_view text, std::string_view file) {
  using nlohmann::json;
  Workload w{std::string(file), {}};
  std::size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::parse_error& e) {
      fail("{}:{}: malformed JSON: {}", file, line_no, e.what());
    }
    auto bad = [&](std::string_view field, std::string_view why) {
      fail("{}:{}: field '{}': {}", file, line_no, field, why);
    };
    if (!j.is_object()) fail("{}:{}: expected a JSON object per line", file, line_no);
    auto uint_field = [&](std::string_view field, std::int64_t lo, std::int64_t fallback) -> std::int64_t {
      auto it = j.find(field);
      if (it == j.end()) {
        if (fallback < 0) bad(field, "missing");
        return fallback;
      }
      if (!it->is_number_integer() || it->get<std::int64_t>() < lo || it->get<std::int64_t>() > 0xffffffffLL)
        bad(field, fmt::format("expected an integer >= {}, got {}", lo, it->dump()));
      return it->get<std::int64_t>();
    };
    for (auto it = j.begin(); it != j.end(); ++it) {
      static const char* kKnown[] = {"arrival",    "prompt_len", "prompt_tokens", "output_len", "prefix_id",
                                     "prefix_len", "images",     "parent",        "delay",      "boundaries"};
      if (std::find(std::begin(kKnown), std::end(kKnown), it.key()) == std::end(kKnown))
        bad(it.key(),
            "unknown field (known: arrival, prompt_len, prompt_tokens, output_len, prefix_id, "
            "prefix_len, images, parent, delay, boundaries)");
    }
    SimRequest r;
    r.arrival = static_cast<std::uint64_t>(uint_field("arrival", 0, 0));
    if (auto it = j.find("prompt_tokens"); it != j.end()) {
      if (!it->is_array()) bad("prompt_tokens", "expected an array of token ids");
      for (std::size_t i = 0; i < it->size(); ++i) {
        const json& t = (*it)[i];
        if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() > 0xffffffffLL)
          bad(fmt::format("prompt_tokens[{}]", i), fmt::format("expected a token id, got {}", t.dump()));
        r.token_ids.push_back(static_cast<std::uint32_t>(t.get<std::int64_t>()));
      }
      r.prompt_len = static_cast<std::uint32_t>(r.token_ids.size());
      if (j.contains("prompt_len") && uint_field("prompt_len", 0, 0) != r.prompt_len)
        bad("prompt_len",
            fmt::format("{} disagrees with prompt_tokens, which has {} tokens", j["prompt_len"].dump(), r.prompt_len));
    } else {
      r.prompt_len = static_cast<std::uint32_t>(uint_field("prompt_len", 0, -1));
    }
    r.output_len = static_cast<std::uint32_t>(uint_field("output_len", 1, -1));
    if (auto it = j.find("prefix_id"); it != j.end()) {
      if (it->is_number_unsigned())
        r.prefix_id = it->get<std::uint64_t>();
      else if (it->is_string())
        r.prefix_id = fnv1a(it->get<std::string>());
      else
        bad("prefix_id", fmt::format("expected a non-negative integer or a string, got {}", it->dump()));
    }
    r.prefix_len = static_cast<std::uint32_t>(uint_field("prefix_len", 0, 0));
    if (r.prefix_len > 0 && !j.contains("prefix_id")) bad("prefix_len", "given without prefix_id");
    if (auto it = j.find("images"); it != j.end()) {
      if (!it->is_array()) bad("images", "expected an array of {\"offset\", \"length\"} objects");
      for (std::size_t i = 0; i < it->size(); ++i) {
        const json& s = (*it)[i];
        const std::string f = fmt::format("images[{}]", i);
        if (!s.is_object() || !s.contains("length") || !s["length"].is_number_integer() ||
            s["length"].get<std::int64_t>() <= 0 || s["length"].get<std::int64_t>() > 0xffffffffLL)
          bad(f + ".length", "expected a positive integer");
        const std::int64_t off = s.value("offset", std::int64_t{0});
        if (off < 0 || off > r.prompt_len)
          bad(f + ".offset", fmt::format("{} is outside the prompt of {} tokens", off, r.prompt_len));
        r.images.push_back(
            {static_cast<std::uint32_t>(off), static_cast<std::uint32_t>(s["length"].get<std::int64_t>())});
      }
    }
    if (auto it = j.find("parent"); it != j.end()) {
      const std::int64_t p = uint_field("parent", 0, 0);
      if (p >= static_cast<std::int64_t>(w.requests.size()))
        bad("parent", fmt::format("{} must name an earlier request (this is request {})", p, w.requests.size()));
      r.parent = p;
    }
    r.delay = static_cast<std::uint64_t>(uint_field("delay", 0, 0));
    if (auto it = j.find("boundaries"); it != j.end()) parse_boundaries(*it, r, file, line_no);
    w.requests.push_back(std::move(r));
  }
  if (w.requests.empty()) fail("{}: the trace holds no requests", file);
  return w;
}

void write_trace(const Workload& w, std::ostream& out) {
  using nlohmann::json;
  for (const SimRequest& r : w.requests) {
    json j;
    j["arrival"] = r.arrival;
    if (!r.token_ids.empty())
      j["prompt_tokens"] = r.token_ids;
    else
      j["prompt_len"] = r.prompt_len;
    j["output_len"] = r.output_len;
    if (r.prefix_len > 0) {
      j["prefix_id"] = r.prefix_id;
      j["prefix_len"] = r.prefix_len;
    }
    if (!r.images.empty()) {
      j["images"] = json::array();
      for (const ImageSpan& s : r.images) j["images"].push_back({{"offset", s.offset}, {"length", s.length}});
    }
    if (r.parent >= 0) {
      j["parent"] = r.parent;
      j["delay"] = r.delay;
    }
    if (!r.boundaries.empty()) j["boundaries"] = r.boundaries;
    out << j.dump() << '\n';
  }
}

}  // namespace kvmm::sim
