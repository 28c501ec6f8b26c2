#include "sim/policy.hpp"

#include "kvmm/error.hpp"

#include <algorithm>

namespace kvmm::sim {

const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> kNames{"kvmm",          "paged-uniform", "max-page",        "static-split",
                                               "unified-block", "vllm-0.33",     "vllm-0.33-tuned", "trtllm-v2",
                                               "sglang"};
  return kNames;
}

const std::vector<std::string>& speculative_policy_names() {
  static const std::vector<std::string> kNames{"vllm-eagle"};
  return kNames;
}

bool Policy::allocate_lookahead(std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t) {
  fail("policy = '{}': no speculative mode (only kvmm and vllm-eagle)", name());
}

std::unique_ptr<Policy> make_policy(std::string_view name, const KVLayout& layout, const PolicyOptions& o) {
  if (name == "kvmm") return make_kvmm_policy(layout, o);
  if (name == "vllm-eagle") return make_vllm_eagle_policy(layout, o);
  if (std::find(policy_names().begin(), policy_names().end(), name) != policy_names().end())
    return make_block_policy(name, layout, o);
  fail(
      "policy = '{}': unknown; known: kvmm, paged-uniform, max-page, static-split, unified-block, vllm-0.33, "
      "vllm-0.33-tuned, trtllm-v2, sglang, vllm-eagle",
      name);
}

BoundaryMode parse_boundary_mode(std::string_view s) {
  if (s == "none") return BoundaryMode::kNone;
  if (s == "hinted") return BoundaryMode::kHinted;
  if (s == "learned") return BoundaryMode::kLearned;
  if (s == "both") return BoundaryMode::kBoth;
  fail("boundaries = '{}': unknown; known: none, hinted, learned, both", s);
}

RetentionRelease parse_retention_release(std::string_view s) {
  if (s == "off") return RetentionRelease::kOff;
  if (s == "own") return RetentionRelease::kOwn;
  if (s == "all") return RetentionRelease::kAll;
  fail("retention-release = '{}': unknown; known: off, own, all", s);
}

std::uint64_t needed_bytes(const LayerGroup& g, std::uint64_t T, std::uint64_t E) {
  switch (g.kind) {
    case LayerKind::kFullAttention:
      return T * g.bytes_per_token();
    case LayerKind::kSlidingWindow:
      return std::min<std::uint64_t>(T, g.window) * g.bytes_per_token();
    case LayerKind::kChunkedLocal:
      return (T == 0 ? 0 : (T - 1) % g.chunk + 1) * g.bytes_per_token();
    case LayerKind::kMambaState:
      return T > 0 ? g.natural_page_bytes() : 0;
    case LayerKind::kCrossAttention:
    case LayerKind::kVisionEmbedding:
      return E * g.bytes_per_token();
  }
  return 0;
}

}  // namespace kvmm::sim
