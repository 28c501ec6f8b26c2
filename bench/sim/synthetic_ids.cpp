// The token ids and image items kvmm-sim gives the manager (synthetic_ids.hpp).
#include "sim/synthetic_ids.hpp"

#include "sim/workload.hpp"

#include <algorithm>
#include <cstddef>

namespace kvmm::sim {

namespace {

// Even and odd positions carry the two halves of a 64-bit stream key, so two streams
// collide only if their 64-bit keys do. Writes the ids of positions [from, to) of stream
// `key` to out[t - from]. A plain loop: an earlier 8-lane running-sum version was
// miscompiled by GCC 12.2 at -O3 (lanes 4-7 got lanes 0-3's ids), so ids written in bulk (a
// lookup's prompt) disagreed with ids fed one decode step at a time, and a chat turn never
// hit the pages of its parent's answer.
void fill_stream(std::uint32_t* out, std::uint64_t from, std::uint64_t to, std::uint64_t key) {
  constexpr std::uint32_t kStep = 0x9e3779b1u;  // id(t) = half(t) + t * kStep (mod 2^32)
  const auto even = static_cast<std::uint32_t>(key), odd = static_cast<std::uint32_t>(key >> 32);
  for (std::uint64_t t = from; t < to; ++t)
    *out++ = ((t & 1) != 0 ? odd : even) + static_cast<std::uint32_t>(t) * kStep;
}

}  // namespace

void synthetic_items(const SeqInfo& info, bool cross, std::vector<MultimodalItem>& items) {
  if (info.images == nullptr) return;
  std::uint64_t shift = 0, end = 0;
  for (std::size_t k = 0; k < info.images->size(); ++k) {
    const ImageSpan& s = (*info.images)[k];
    if (s.length == 0) continue;
    const std::uint64_t off = cross ? std::max<std::uint64_t>(s.offset, end) : s.offset + shift;
    const bool shared = info.prefix_len > 0 && (cross ? s.offset < info.prefix_len : off + s.length <= info.prefix_len);
    const std::uint64_t key =
        shared ? mix64(mix64(info.prefix_id ^ (std::uint64_t{s.length} << 40)) ^ (0x1a9e000000000000ULL + off))
               : mix64(mix64(0x7e57000000000000ULL + info.uid) ^ (0x1a9e000000000000ULL + k));
    items.push_back(MultimodalItem{BlockHash{key, mix64(key)}, off, s.length});
    shift += s.length;
    end = off + s.length;
  }
}

void trace_prompt_ids(const std::vector<std::uint32_t>& text, std::span<const MultimodalItem> items, bool cross,
                      std::vector<std::uint32_t>& out) {
  std::size_t t = 0;
  for (const MultimodalItem& m : items) {
    if (cross) break;
    while (out.size() < m.offset && t < text.size()) out.push_back(text[t++]);
    out.insert(out.end(), m.length, 0xfffffff0u);
  }
  out.insert(out.end(), text.begin() + static_cast<std::ptrdiff_t>(t), text.end());
}

std::span<const std::uint32_t> synthetic_ids(std::span<const std::uint32_t> prompt_ids, const SeqInfo& info,
                                             std::uint64_t from, std::uint64_t n, std::vector<std::uint32_t>& out) {
  if (out.size() < n - from) out.resize(n - from);
  const std::uint64_t a = std::clamp<std::uint64_t>(prompt_ids.size(), from, n);
  const std::uint64_t b = std::clamp<std::uint64_t>(info.prefix_len, a, n);
  for (std::uint64_t t = from; t < a; ++t) out[t - from] = prompt_ids[t];
  fill_stream(out.data() + (a - from), a, b, mix64(info.prefix_id));
  fill_stream(out.data() + (b - from), b, n, mix64(0x7e57000000000000ULL + info.uid));
  return {out.data(), n - from};
}

}  // namespace kvmm::sim
