#include "kvmm/caching/layer_policy.hpp"

#include "kvmm/error.hpp"

#include <algorithm>

namespace kvmm {

LayerPolicy::LayerPolicy(std::uint32_t tokens_per_page) : tokens_per_page_(tokens_per_page) {
  if (tokens_per_page == 0) fail("tokens_per_page = 0: must be >= 1");
}

std::uint64_t FullAttentionPolicy::longest_valid_prefix(std::uint64_t limit, PageProbe& probe) const {
  const std::uint64_t pages = floor_page(limit);
  for (std::uint64_t j = 0; j < pages; ++j)
    if (!probe.hit(j)) return j * tokens_per_page_;
  return pages * tokens_per_page_;
}

std::uint64_t LayerPolicy::longest_suffix_hit(std::uint64_t limit, PageProbe& probe) const {
  // Candidate b (a hit of b pages) needs pages [lo(b), b). Each window is checked from its
  // bottom: a miss at page j rules out every candidate in (j, b], since lo never decreases
  // and all their windows contain j, so the next candidate is j. Where few pages are
  // cached this jumps a window per probe, O(prefix / window) probes, instead of walking
  // every page from the top. Pages [known_lo, known_hi) are hits seen already.
  std::uint64_t b = floor_page(limit);
  std::uint64_t known_lo = 0, known_hi = 0;
  while (b > 0) {
    const std::uint64_t lo = std::min(first_required_page(b * tokens_per_page_), b);
    std::uint64_t j = lo;
    while (j < b) {
      if (j >= known_lo && j < known_hi) {
        j = std::min(known_hi, b);
        continue;
      }
      if (!probe.hit(j)) break;
      ++j;
    }
    if (j == b) return b * tokens_per_page_;
    known_lo = lo;
    known_hi = j;
    b = j;
  }
  return 0;
}

SlidingWindowPolicy::SlidingWindowPolicy(std::uint32_t tokens_per_page, std::uint32_t window)
    : LayerPolicy(tokens_per_page), window_(window) {
  if (window == 0) fail("window = 0: must be >= 1");
}

std::uint64_t SlidingWindowPolicy::first_touched_page(std::uint64_t begin, std::uint64_t) const {
  return floor_page(begin + 1 > window_ ? begin + 1 - window_ : 0);
}

std::uint64_t SlidingWindowPolicy::first_needed_page(std::uint64_t computed) const {
  return floor_page(computed + 1 > window_ ? computed + 1 - window_ : 0);
}

std::uint64_t SlidingWindowPolicy::first_required_page(std::uint64_t prefix) const {
  return floor_page(prefix > window_ ? prefix - window_ : 0);
}

std::uint64_t SlidingWindowPolicy::longest_valid_prefix(std::uint64_t limit, PageProbe& probe) const {
  return longest_suffix_hit(limit, probe);
}

ChunkedLocalPolicy::ChunkedLocalPolicy(std::uint32_t tokens_per_page, std::uint32_t chunk)
    : LayerPolicy(tokens_per_page), chunk_(chunk) {
  if (chunk == 0) fail("chunk = 0: must be >= 1");
}

std::uint64_t ChunkedLocalPolicy::first_touched_page(std::uint64_t begin, std::uint64_t) const {
  return floor_page(chunk_start(begin));
}

std::uint64_t ChunkedLocalPolicy::first_needed_page(std::uint64_t computed) const {
  return floor_page(chunk_start(computed));
}

std::uint64_t ChunkedLocalPolicy::first_required_page(std::uint64_t prefix) const {
  return std::min(floor_page(chunk_start(prefix)), floor_page(prefix));
}

std::uint64_t ChunkedLocalPolicy::longest_valid_prefix(std::uint64_t limit, PageProbe& probe) const {
  return longest_suffix_hit(limit, probe);
}

std::uint64_t MambaPolicy::first_touched_page(std::uint64_t begin, std::uint64_t) const {
  return begin > 0 ? floor_page(begin - 1) : 0;
}

std::uint64_t MambaPolicy::first_needed_page(std::uint64_t computed) const {
  return computed > 0 ? floor_page(computed - 1) : 0;
}

std::uint64_t MambaPolicy::first_required_page(std::uint64_t prefix) const {
  return prefix >= tokens_per_page_ ? floor_page(prefix) - 1 : 0;
}

std::uint64_t MambaPolicy::longest_valid_prefix(std::uint64_t limit, PageProbe& probe) const {
  for (std::uint64_t k = floor_page(limit); k > 0; --k)
    if (probe.hit(k - 1)) return k * tokens_per_page_;
  return 0;
}

std::unique_ptr<LayerPolicy> make_policy(const LayerGroup& group) {
  switch (group.kind) {
    case LayerKind::kFullAttention:
      return std::make_unique<FullAttentionPolicy>(group.tokens_per_page);
    case LayerKind::kSlidingWindow:
      return std::make_unique<SlidingWindowPolicy>(group.tokens_per_page, group.window);
    case LayerKind::kChunkedLocal:
      return std::make_unique<ChunkedLocalPolicy>(group.tokens_per_page, group.chunk);
    case LayerKind::kMambaState:
      return std::make_unique<MambaPolicy>(group.tokens_per_page);
    case LayerKind::kCrossAttention:
    case LayerKind::kVisionEmbedding:
      break;
  }
  fail("group = {}: kind {} holds encoder tokens and uses ImagePolicy", group.name, to_string(group.kind));
}

}  // namespace kvmm
