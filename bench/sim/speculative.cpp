// Speculative decoding in kvmm-sim's kvmm policy (see speculative.hpp).
#include "sim/speculative.hpp"

#include <utility>

namespace kvmm::sim {

KVLayout without_draft_roles(const KVLayout& layout) {
  std::vector<LayerGroup> groups = layout.groups();
  for (LayerGroup& g : groups) g.draft.reset();
  LayoutOptions o;
  o.slice_layers = SliceLayers::kOff;  // the policy slices (PolicyOptions::slice_layers)
  return KVLayout::plan(std::move(groups), o);
}

std::uint64_t vllm_block_tokens(const KVLayout& l) {
  for (GroupId g = 0; g < l.num_groups(); ++g)
    if (l.group(g).kind == LayerKind::kFullAttention) return l.requested_tokens_per_page(g);
  return l.requested_tokens_per_page(0);
}

std::uint32_t vllm_eagle_hit(KVCacheManager& kv, RequestId r, std::uint32_t hit, std::uint64_t block_tokens) {
  if (hit == 0) return hit;
  const std::uint64_t B = block_tokens, whole = hit / B * B;
  kv.reset(r);
  return static_cast<std::uint32_t>(kv.lookup_prefix(r, whole >= B ? whole - B : 0));
}

std::uint64_t draft_recompute_tokens(const KVCacheManager& kv, RequestId r) {
  std::uint64_t n = 0;
  for (GroupId g = 0; g < kv.layout().num_groups(); ++g)
    if (kv.layout().group(g).draft) {
      const TokenRange t = kv.draft_recompute(r, g);
      n += t.end - t.begin;
    }
  return n;
}

void tag_verified_states(KVCacheManager& kv, RequestId r, std::vector<std::uint64_t>& tagged, std::uint64_t verified) {
  const KVLayout& l = kv.layout();
  if (tagged.size() != l.num_groups()) tagged.assign(l.num_groups(), 0);
  for (GroupId g = 0; g < l.num_groups(); ++g) {
    if (!l.group(g).tagged_checkpoints) continue;
    const std::uint64_t C = l.group(g).checkpoint_interval(), n = verified / C * C;
    if (n == 0 || n <= tagged[g]) continue;
    tagged[g] = n;
    kv.tag_state(r, g, n);
  }
}

std::string_view vllm_eagle_description() {
  return "vLLM's rules for EAGLE/MTP (draft groups cached as plain groups, the last block of every hit dropped) "
         "over ";
}

}  // namespace kvmm::sim
