// Workloads for kvmm-sim: seeded synthetic generators (ShareGPT-like chat, MMMU-pro-like
// vision QA, arXiv long-context QA and its Jenga Fig. 17 sweep, multi-turn sessions, long
// chats with their turn boundaries, agentic tool-call loops) and the JSONL trace format.
// Generating n requests is O(n) plus the token-id lists a trace carries; a trace read
// reports malformed input as kvmm::Error naming the file, the line and the field.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace kvmm::sim {

struct ImageSpan {
  std::uint32_t offset = 0;  // position in the text prompt where the image is inlined
  std::uint32_t length = 0;  // image tokens
};

// One request. Its sequence is the prompt (text tokens, with images inlined for models
// without cross-attention) followed by output_len generated tokens. Tokens
// [0, prefix_len) of that sequence are the first prefix_len tokens of the content
// stream `prefix_id`, so two requests with the same prefix_id share them (an article, a
// system prompt, a conversation's history, which then includes earlier outputs).
struct SimRequest {
  std::uint64_t arrival = 0;     // step at which the request may be scheduled
  std::uint32_t prompt_len = 0;  // text tokens
  std::uint32_t output_len = 1;  // tokens to generate (>= 1)
  std::vector<ImageSpan> images;
  std::uint64_t prefix_id = 0;
  std::uint32_t prefix_len = 0;          // 0: nothing shared
  std::int64_t parent = -1;              // index of a request that must finish first (multi-turn)
  std::uint64_t delay = 0;               // steps after the parent finishes (think time)
  std::vector<std::uint32_t> token_ids;  // optional: the text prompt's token ids
  // Prefix lengths later requests are likely to share (an article, earlier turns):
  // ascending, each in [1, prompt_len]; kvmm-sim --boundaries hinted passes them to the
  // manager (RequestExtras::cache_boundaries).
  std::vector<std::uint32_t> boundaries;

  std::uint32_t image_tokens() const {
    std::uint32_t n = 0;
    for (const ImageSpan& s : images) n += s.length;
    return n;
  }
};

struct Workload {
  std::string name;
  std::vector<SimRequest> requests;
};

struct WorkloadOptions {
  std::uint32_t num_requests = 1000;
  std::uint64_t seed = 1;
  // Poisson arrivals at this many requests per step; 0: all arrive at step 0 (offline).
  double rate = 0;
  std::uint32_t articles = 8;  // arxiv-sweep: articles the questions cycle over
  // arxiv-qa / arxiv-sweep: question tokens U[question_min, question_max] (Jenga: 16-64).
  std::uint32_t question_min = 16, question_max = 64;
};

// The synthetic workload names, in a stable order.
const std::vector<std::string>& workload_names();
// A name from workload_names() or a path to a .jsonl trace.
Workload make_workload(const std::string& name_or_path, const WorkloadOptions& o);
Workload read_trace(const std::string& path);
Workload parse_trace(std::string_view text, std::string_view file);
void write_trace(const Workload& w, std::ostream& out);

// 64-bit mixing used for content keys (splitmix64 finalizer).
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace kvmm::sim
