// Synthetic workloads match their documented statistics and are reproducible; the JSONL
// trace format round-trips and reports malformed lines with line and field.
#include "sim/workload.hpp"

#include "kvmm/error.hpp"
#include "support/error_of.hpp"

#include <catch2/catch.hpp>

#include <map>
#include <sstream>

using namespace kvmm::sim;

namespace {
std::string dump(const Workload& w) {
  std::ostringstream out;
  write_trace(w, out);
  return out.str();
}
WorkloadOptions opts(std::uint32_t n, std::uint64_t seed = 1) {
  WorkloadOptions o;
  o.num_requests = n;
  o.seed = seed;
  return o;
}
}  // namespace

TEST_CASE("mmmu-pro: about 6193 image and 43 text tokens per request", "[sim][workload]") {
  const Workload w = make_workload("mmmu-pro", opts(4000));
  double img = 0, text = 0;
  for (const auto& r : w.requests) {
    REQUIRE(r.images.size() == 1);
    CHECK(r.images[0].length % 1601 == 0);
    img += r.image_tokens();
    text += r.prompt_len;
  }
  img /= 4000;
  text /= 4000;
  CHECK(img > 6100);
  CHECK(img < 6260);
  CHECK(text > 41.5);
  CHECK(text < 44.5);
}

TEST_CASE("arxiv-qa: 55k-110k articles, 50-100 output, 2-6 questions per article", "[sim][workload]") {
  const Workload w = make_workload("arxiv-qa", opts(3000));
  REQUIRE(w.requests.size() == 3000);
  std::map<std::uint64_t, int> per_article;
  for (const auto& r : w.requests) {
    CHECK(r.prefix_len >= 55000);
    CHECK(r.prefix_len <= 110000);
    CHECK(r.prompt_len >= r.prefix_len + 16);
    CHECK(r.prompt_len <= r.prefix_len + 64);
    CHECK(r.output_len >= 50);
    CHECK(r.output_len <= 100);
    ++per_article[r.prefix_id];
  }
  int bad = 0;
  for (const auto& [id, n] : per_article) bad += (n < 2 || n > 6) ? 1 : 0;
  CHECK(bad <= 1);  // only the last article may be cut short
  CHECK(per_article.size() > 3000 / 6);
}

TEST_CASE("sharegpt and multi-turn statistics", "[sim][workload]") {
  const Workload s = make_workload("sharegpt", opts(20000));
  double in = 0, out = 0;
  for (const auto& r : s.requests) {
    in += r.prompt_len;
    out += r.output_len;
  }
  CHECK(in / 20000 > 650);
  CHECK(in / 20000 < 850);
  CHECK(out / 20000 > 300);
  CHECK(out / 20000 < 380);
  const Workload m = make_workload("multi-turn", opts(5000));
  int follow_ups = 0;
  for (std::size_t i = 0; i < m.requests.size(); ++i) {
    const auto& r = m.requests[i];
    CHECK(r.prefix_len == r.prompt_len + r.output_len);
    if (r.parent < 0) continue;
    ++follow_ups;
    const auto& p = m.requests[static_cast<std::size_t>(r.parent)];
    CHECK(r.parent < static_cast<std::int64_t>(i));
    CHECK(p.prefix_id == r.prefix_id);
    CHECK(r.prompt_len > p.prompt_len + p.output_len);  // history plus a new message
    CHECK(r.delay >= 1);
  }
  // 2.0 turns per conversation on average: about half the requests are follow-ups.
  CHECK(follow_ups > 2000);
  CHECK(follow_ups < 3000);
}

TEST_CASE("arxiv-qa: longer questions, same articles", "[sim][workload]") {
  WorkloadOptions o = opts(300, 1);
  o.question_min = 400;
  o.question_max = 1000;
  const Workload longq = make_workload("arxiv-qa", o);
  const Workload base = make_workload("arxiv-qa", opts(300, 1));
  REQUIRE(longq.requests.size() == base.requests.size());
  for (std::size_t i = 0; i < longq.requests.size(); ++i) {
    const auto& r = longq.requests[i];
    CHECK(r.prompt_len - r.prefix_len >= 400);
    CHECK(r.prompt_len - r.prefix_len <= 1000);
    CHECK(r.prefix_len == base.requests[i].prefix_len);  // the same articles in the same order
  }
  o.question_min = 0;
  CHECK_THROWS_WITH(make_workload("arxiv-qa", o), Catch::Contains("question tokens = 0-1000"));
}

TEST_CASE("agentic: tool-call loops with growing context", "[sim][workload]") {
  const Workload w = make_workload("agentic", opts(3000, 1));
  REQUIRE(w.requests.size() == 3000);
  std::uint64_t first = 0, firsts = 0, results = 0, follow_ups = 0, out = 0;
  for (std::size_t i = 0; i < w.requests.size(); ++i) {
    const auto& r = w.requests[i];
    out += r.output_len;
    CHECK(r.prefix_len == r.prompt_len + r.output_len);
    if (r.parent < 0) {
      first += r.prompt_len;
      ++firsts;
      CHECK(r.boundaries.empty());
      continue;
    }
    ++follow_ups;
    const auto& p = w.requests[static_cast<std::size_t>(r.parent)];
    CHECK(p.prefix_id == r.prefix_id);
    CHECK(r.prompt_len >= p.prompt_len + p.output_len + 16);  // history plus a tool result
    results += r.prompt_len - (p.prompt_len + p.output_len);
    CHECK(r.boundaries.back() == p.prompt_len + p.output_len);
    CHECK(r.delay >= 1);
    CHECK(r.delay <= 5);
  }
  // 3-12 calls per session (mean 7.5): about 13% first calls; means 3,000 / 800 / 150.
  CHECK(firsts > 300);
  CHECK(firsts < 500);
  CHECK(static_cast<double>(first) / static_cast<double>(firsts) == Approx(3000).epsilon(0.1));
  CHECK(static_cast<double>(results) / static_cast<double>(follow_ups) == Approx(800).epsilon(0.15));
  CHECK(static_cast<double>(out) / 3000.0 == Approx(150).epsilon(0.1));
}

TEST_CASE("workloads: same seed same requests, another seed others", "[sim][workload][determinism]") {
  for (const auto& name : workload_names()) {
    INFO(name);
    CHECK(dump(make_workload(name, opts(300, 5))) == dump(make_workload(name, opts(300, 5))));
    CHECK(dump(make_workload(name, opts(300, 5))) != dump(make_workload(name, opts(300, 6))));
  }
  WorkloadOptions o = opts(200, 2);
  o.rate = 0.5;
  const Workload w = make_workload("sharegpt", o);
  CHECK(w.requests.back().arrival > 200);  // about 400 steps for 200 arrivals
  CHECK(w.requests.back().arrival < 600);
}

TEST_CASE("JSONL trace: fields, round trip", "[sim][trace]") {
  const std::string text =
      "{\"arrival\": 3, \"prompt_len\": 100, \"output_len\": 20, \"prefix_id\": \"sys\", \"prefix_len\": 64}\n"
      "\n"
      "{\"prompt_tokens\": [1, 2, 3, 4, 5], \"output_len\": 2, \"images\": [{\"offset\": 2, \"length\": 576}]}\n"
      "{\"prompt_len\": 140, \"output_len\": 5, \"parent\": 0, \"delay\": 7, \"prefix_id\": 9, \"prefix_len\": 120}\n";
  const Workload w = parse_trace(text, "t.jsonl");
  REQUIRE(w.requests.size() == 3);
  CHECK(w.requests[0].arrival == 3);
  CHECK(w.requests[0].prefix_len == 64);
  CHECK(w.requests[1].prompt_len == 5);
  CHECK(w.requests[1].token_ids.size() == 5);
  CHECK(w.requests[1].image_tokens() == 576);
  CHECK(w.requests[1].images[0].offset == 2);
  CHECK(w.requests[2].parent == 0);
  CHECK(w.requests[2].delay == 7);
  CHECK(w.requests[2].prefix_id == 9);
  CHECK(dump(parse_trace(dump(w), "again.jsonl")) == dump(w));
}

TEST_CASE("JSONL trace: errors name the file, line and field", "[sim][trace][errors]") {
  auto err = [](const std::string& text) { return kvmm::test::error_of([&] { parse_trace(text, "t.jsonl"); }); };
  CHECK_THAT(err("{\"prompt_len\": 4, \"output_len\": 1}\n{\"prompt_len\": 4}\n"),
             Catch::Contains("t.jsonl:2: field 'output_len': missing"));
  CHECK_THAT(err("{\"prompt_len\": 4, \"output_len\": 1}\n\n{\"prompt_len\": 4, \"output_len\": 1,}\n"),
             Catch::Contains("t.jsonl:3: malformed JSON"));
  CHECK_THAT(err("{\"prompt_len\": -4, \"output_len\": 1}"), Catch::Contains("t.jsonl:1: field 'prompt_len'"));
  CHECK_THAT(err("{\"prompt_len\": 4, \"output_len\": 0}"),
             Catch::Contains("field 'output_len': expected an integer >= 1"));
  CHECK_THAT(err("{\"prompt_len\": 4, \"output_len\": 1, \"prompt\": \"hi\"}"),
             Catch::Contains("field 'prompt': unknown field"));
  CHECK_THAT(err("{\"prompt_len\": 4, \"output_len\": 1, \"images\": [{\"length\": 0}]}"),
             Catch::Contains("field 'images[0].length'"));
  CHECK_THAT(err("{\"prompt_len\": 4, \"output_len\": 1, \"images\": [{\"offset\": 9, \"length\": 3}]}"),
             Catch::Contains("field 'images[0].offset': 9 is outside"));
  CHECK_THAT(err("{\"prompt_len\": 4, \"output_len\": 1, \"parent\": 0}"),
             Catch::Contains("field 'parent': 0 must name an earlier request"));
  CHECK_THAT(err("{\"prompt_tokens\": [1, \"x\"], \"output_len\": 1}"), Catch::Contains("field 'prompt_tokens[1]'"));
  CHECK_THAT(err("{\"prompt_len\": 4, \"output_len\": 1, \"prefix_len\": 3}"),
             Catch::Contains("field 'prefix_len': given without prefix_id"));
  CHECK_THAT(err("[1]"), Catch::Contains("t.jsonl:1: expected a JSON object"));
  CHECK_THAT(err("\n\n"), Catch::Contains("no requests"));
  CHECK_THROWS_WITH(make_workload("alpaca", opts(1)), Catch::Contains("workload = 'alpaca'"));
}
