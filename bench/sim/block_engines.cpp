// Block-pool models of today's engines (paged-uniform, max-page, static-split,
// unified-block): each one's vgroups and pools for a layout, on the engine of
// block_policy.cpp. See docs/sim.md for each model.
#include "sim/block_policy.hpp"

#include "kvmm/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

namespace kvmm::sim {

namespace {

using namespace block;

VKind kind_of(const LayerGroup& g) {
  switch (g.kind) {
    case LayerKind::kFullAttention:
      return VKind::kFull;
    case LayerKind::kSlidingWindow:
      return VKind::kWindow;
    case LayerKind::kChunkedLocal:
      return VKind::kChunked;
    case LayerKind::kMambaState:
      return VKind::kState;
    default:
      return VKind::kEncoder;
  }
}

VGroup own_group(const KVLayout& layout, GroupId gid, std::uint32_t tpb, std::uint64_t units, std::uint32_t pool) {
  const LayerGroup& g = layout.group(gid);
  VGroup v;
  v.name = g.name;
  v.kind = kind_of(g);
  v.tpb = tpb;
  v.window = g.window;
  v.chunk = g.chunk;
  v.units = units;
  v.pool = pool;
  v.covers = {gid};
  return v;
}

bool has_kind(const KVLayout& layout, bool (*pred)(const LayerGroup&)) {
  for (const LayerGroup& g : layout.groups())
    if (pred(g)) return true;
  return false;
}
bool is_state(const LayerGroup& g) { return g.is_state(); }
bool is_encoder(const LayerGroup& g) { return !g.is_decoder(); }

Pool make_pool(std::string name, std::uint64_t unit_bytes, std::uint64_t bytes, bool shared) {
  Pool p;
  p.name = std::move(name);
  p.unit_bytes = unit_bytes;
  p.capacity = p.free = bytes / unit_bytes;
  p.shared = shared;
  if (p.capacity == 0)
    fail("memory_bytes: {} bytes for pool '{}' hold no block of {} bytes", bytes, p.name, unit_bytes);
  return p;
}

// The state slots that vLLM 0.6 (MambaCacheManager) and TensorRT-LLM (RNN state
// manager) reserve up front for max_seqs requests, carved from the budget first.
std::uint64_t reserve_state_pools(const KVLayout& layout, const PolicyOptions& o, std::vector<VGroup>& vgs,
                                  std::vector<Pool>& pools) {
  std::uint64_t reserved = 0;
  for (GroupId gid = 0; gid < layout.num_groups(); ++gid) {
    const LayerGroup& g = layout.group(gid);
    if (!g.is_state()) continue;
    const std::uint64_t bytes = g.natural_page_bytes() * o.max_seqs;
    if (reserved + bytes >= o.memory_bytes)
      fail("memory_bytes = {}: too small for {} state slots of group '{}' ({} bytes each)", o.memory_bytes, o.max_seqs,
           g.name, g.natural_page_bytes());
    vgs.push_back(own_group(layout, gid, 1, 1, static_cast<std::uint32_t>(pools.size())));
    pools.push_back(make_pool(g.name + "-slots", g.natural_page_bytes(), bytes, false));
    reserved += bytes;
  }
  return reserved;
}

std::unique_ptr<Policy> paged_uniform(const KVLayout& layout, const PolicyOptions& o) {
  // vLLM 0.6 PagedAttention: one block table over all attention layers; each layer keeps
  // every token (text and image), at the largest layer's per-token size.
  std::vector<VGroup> vgs;
  std::vector<Pool> pools;
  const std::uint64_t reserved = reserve_state_pools(layout, o, vgs, pools);
  VGroup u, x;
  u.name = "uniform";
  u.kind = VKind::kFull;
  x.name = "uniform-cross";
  x.kind = VKind::kEncoder;
  std::uint64_t layers = 0, per_layer = 0;
  for (GroupId gid = 0; gid < layout.num_groups(); ++gid) {
    const LayerGroup& g = layout.group(gid);
    if (g.is_state() || g.kind == LayerKind::kVisionEmbedding) continue;
    u.tpb = x.tpb = g.tokens_per_page;
    layers += g.num_layers;
    per_layer = std::max(per_layer, 2 * g.head_bytes_per_token());
    (g.is_decoder() ? u : x).covers.push_back(gid);
  }
  if (layers == 0) fail("layout: paged-uniform needs at least one attention group");
  const std::uint64_t block = u.tpb * layers * per_layer;
  u.pool = x.pool = static_cast<std::uint32_t>(pools.size());
  vgs.push_back(u);
  if (!x.covers.empty()) vgs.push_back(x);  // vLLM 0.6 encoder-decoder: a cross block table
  pools.push_back(make_pool("uniform", block, o.memory_bytes - reserved, true));
  const bool caching = o.prefix_caching && !has_kind(layout, is_state) && !has_kind(layout, is_encoder);
  std::string d = fmt::format(
      "vLLM 0.6 PagedAttention: one block of {} tokens x {} attention layers x {} B per layer-token = {} B; "
      "every layer keeps every decoder token{}; sliding windows are not freed{}; prefix caching {} (block "
      "hashes of full blocks, LRU over free cached blocks; vLLM 0.6 has none for encoder-decoder or Mamba models)",
      u.tpb, layers, per_layer, block,
      x.covers.empty() ? "" : ", and every encoder token in a cross block table from the same pool",
      reserved > 0 ? fmt::format("; {} Mamba state slots reserved up front ({} B)", o.max_seqs, reserved) : "",
      caching ? "on" : "off");
  return make_engine("paged-uniform", layout, std::move(vgs), std::move(pools), caching, d);
}

std::unique_ptr<Policy> max_page(const KVLayout& layout, const PolicyOptions& o) {
  // Jenga §4.4 MAX page: one page size, the largest group's page; every group's pages
  // (its own tokens, windows freed) occupy a whole max-size page.
  std::uint64_t unit = 0;
  for (GroupId gid = 0; gid < layout.num_groups(); ++gid) unit = std::max(unit, layout.group(gid).natural_page_bytes());
  std::vector<VGroup> vgs;
  for (GroupId gid = 0; gid < layout.num_groups(); ++gid)
    vgs.push_back(own_group(layout, gid, layout.group(gid).tokens_per_page, 1, 0));
  std::vector<Pool> pools{make_pool("max", unit, o.memory_bytes, true)};
  std::string d = fmt::format(
      "MAX page (Jenga 4.4, vLLM-max): one pool of {} B pages (the largest group's page); each group "
      "allocates its own pages at its own tokens per page, sliding windows freed at the next allocation, each page "
      "padded to {} B; "
      "no prefix caching",
      unit, unit);
  return make_engine("max-page", layout, std::move(vgs), std::move(pools), false, d);
}

std::unique_ptr<Policy> static_split(const KVLayout& layout, const PolicyOptions& o) {
  // TensorRT-LLM style: state slots reserved for max_seqs requests; the rest split into
  // one fixed pool per group, proportional to what a max-length request needs there.
  std::vector<VGroup> vgs;
  std::vector<Pool> pools;
  const std::uint64_t reserved = reserve_state_pools(layout, o, vgs, pools);
  std::vector<double> demand(layout.num_groups(), 0);
  double total = 0;
  for (GroupId gid = 0; gid < layout.num_groups(); ++gid) {
    const LayerGroup& g = layout.group(gid);
    if (g.is_state()) continue;
    std::uint64_t toks = g.is_decoder() ? o.max_model_len : o.max_encoder_tokens;
    if (g.kind == LayerKind::kSlidingWindow) toks = std::min<std::uint64_t>(toks, g.window);
    if (g.kind == LayerKind::kChunkedLocal) toks = std::min<std::uint64_t>(toks, g.chunk);
    demand[gid] = static_cast<double>(g.bytes_per_token()) * static_cast<double>(std::max<std::uint64_t>(toks, 1));
    total += demand[gid];
  }
  std::string shares;
  for (GroupId gid = 0; gid < layout.num_groups(); ++gid) {
    const LayerGroup& g = layout.group(gid);
    if (g.is_state()) continue;
    const auto bytes = static_cast<std::uint64_t>(static_cast<double>(o.memory_bytes - reserved) * demand[gid] / total);
    vgs.push_back(own_group(layout, gid, g.tokens_per_page, 1, static_cast<std::uint32_t>(pools.size())));
    pools.push_back(make_pool(g.name, g.natural_page_bytes(), bytes, false));
    shares += fmt::format("{}{} {:.1f}%", shares.empty() ? "" : ", ", g.name,
                          100.0 * static_cast<double>(bytes) / static_cast<double>(o.memory_bytes));
  }
  const bool caching = o.prefix_caching && !has_kind(layout, is_state) && !has_kind(layout, is_encoder);
  std::string d = fmt::format(
      "TensorRT-LLM style static split: {}one pool per group in proportion to a max-length request ({} decoder / "
      "{} encoder tokens): {}; sliding windows freed at the next allocation; block reuse {} (per-pool hashes "
      "and LRU, hit = longest prefix valid in every group)",
      reserved > 0
          ? fmt::format("{} Mamba state slots reserved first ({} B), the rest split into ", o.max_seqs, reserved)
          : "",
      o.max_model_len, o.max_encoder_tokens, shares, caching ? "on" : "off");
  return make_engine("static-split", layout, std::move(vgs), std::move(pools), caching, d);
}

// vLLM v1's hybrid allocator layout (2025 and 0.33 alike): one block byte size per layer
// for every group. Attention block sizes are enlarged (tokens per block) until their
// per-layer page equals the largest one; with Mamba, attention blocks grow until their page
// is at least one layer's state, and state pages are padded to it. Returns the vgroups (all
// in pool 0); `page` gets the per-layer block bytes, `tpbs` their description.
std::vector<VGroup> unified_groups(const KVLayout& layout, std::uint64_t& page, std::string& tpbs) {
  auto per_layer_token = [](const LayerGroup& g) {
    return g.kind == LayerKind::kVisionEmbedding ? g.bytes_per_token() : 2 * g.head_bytes_per_token();
  };
  page = 0;  // per-layer block bytes shared by every group
  for (const LayerGroup& g : layout.groups())
    if (!g.is_state()) page = std::max(page, per_layer_token(g) * g.tokens_per_page);
  if (page == 0) fail("layout: unified-block needs at least one attention group");
  const std::uint64_t step = page;  // attention blocks grow in whole kernel blocks
  for (const LayerGroup& g : layout.groups())
    if (g.is_state()) page = std::max(page, (g.state_bytes_per_layer + step - 1) / step * step);
  std::vector<VGroup> vgs;
  tpbs.clear();
  for (GroupId gid = 0; gid < layout.num_groups(); ++gid) {
    const LayerGroup& g = layout.group(gid);
    std::uint32_t tpb = 1;
    if (!g.is_state()) {
      tpb = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, page / per_layer_token(g)));  // padded if not exact
    }
    const std::uint64_t layers = g.kind == LayerKind::kVisionEmbedding ? 1 : g.num_layers;
    vgs.push_back(own_group(layout, gid, tpb, layers, 0));
    if (g.is_state())
      tpbs += fmt::format("{}{} 1 state block x {} layers", tpbs.empty() ? "" : ", ", g.name, layers);
    else
      tpbs += fmt::format("{}{} {} tokens/block x {} layers", tpbs.empty() ? "" : ", ", g.name, tpb, layers);
  }
  return vgs;
}

std::unique_ptr<Policy> unified_block(const KVLayout& layout, const PolicyOptions& o) {
  // vLLM v1 hybrid KV cache manager of 2025 (before sparse retention and Mamba caching).
  std::uint64_t page = 0;
  std::string tpbs;
  std::vector<VGroup> vgs = unified_groups(layout, page, tpbs);
  std::vector<Pool> pools{make_pool("unified", page, o.memory_bytes, true)};
  const bool caching = o.prefix_caching && !has_kind(layout, is_state) && !has_kind(layout, is_encoder);
  std::string d = fmt::format(
      "vLLM v1 hybrid allocator: one pool of {} B per-layer blocks shared by every group ({}); state pages "
      "padded to the block; sliding windows freed at the next allocation, highest block first (remove_skipped_blocks); "
      "prefix caching {} (block hashes per group, hit = longest prefix valid in all groups, one LRU free queue across "
      "groups; off with Mamba or encoder groups)",
      page, tpbs, caching ? "on" : "off");
  return make_engine("unified-block", layout, std::move(vgs), std::move(pools), caching, d, SkipOrder::kHighFirst);
}

std::unique_ptr<Policy> vllm_033(const KVLayout& layout, const PolicyOptions& o, bool tuned) {
  // vLLM 0.33 (docs/sim.md "vllm-0.33"): the same layout; prefix caching on with Mamba
  // ("align"); sparse retention of window blocks and state checkpoints at the replay
  // boundary and shared-prefix junctions (prefix_cache_retention_interval = 0, the
  // default) or also every `retention_interval` tokens (tuned); hits at prefix_match_unit
  // (the configured block size) inside grown blocks when a Mamba group grows them.
  std::uint64_t page = 0;
  std::string tpbs;
  std::vector<VGroup> vgs = unified_groups(layout, page, tpbs);
  std::vector<Pool> pools{make_pool("unified", page, o.memory_bytes, true)};
  const bool caching = o.prefix_caching && !has_kind(layout, is_encoder);
  std::uint32_t block = 1, unit = 0;  // scheduler block (the largest attention block), match unit
  for (const VGroup& v : vgs)
    if (v.kind != VKind::kState) block = std::max(block, v.tpb);
  if (has_kind(layout, is_state))
    for (const LayerGroup& g : layout.groups())
      if (!g.is_state()) unit = unit == 0 ? g.tokens_per_page : std::min(unit, g.tokens_per_page);
  CacheRules rules;
  rules.sparse_retention = true;
  rules.hit_unit = unit == 0 || unit >= block ? 0 : unit;
  rules.state_caching = true;
  if (tuned) rules.retention_interval = (o.retention_interval + block - 1) / block * block;  // a block multiple
  const std::string name = tuned ? "vllm-0.33-tuned" : "vllm-0.33";
  std::string d = fmt::format(
      "vLLM 0.33 hybrid allocator: one pool of {} B per-layer blocks shared by every group ({}); state pages padded "
      "to the block; prefix caching {} (hit = longest prefix valid in all groups, at {}); sparse retention: a window "
      "block that leaves the window stays cached only if a hit at the replay boundary (prompt end), the shared-prefix "
      "junction{} needs it, else it is dropped; Mamba state cached at those positions (\"align\"); "
      "prefix_cache_retention_interval = {}",
      page, tpbs, caching ? "on" : "off",
      rules.hit_unit > 0 ? fmt::format("{}-token units inside blocks, the partial block copied", rules.hit_unit)
                         : std::string("block boundaries"),
      rules.retention_interval > 0 ? fmt::format(" or a multiple of {} tokens", rules.retention_interval) : "",
      rules.retention_interval);
  return make_engine(name, layout, std::move(vgs), std::move(pools), caching, d, SkipOrder::kHighFirst, rules);
}

}  // namespace

std::unique_ptr<Policy> make_block_policy(std::string_view name, const KVLayout& layout, const PolicyOptions& o) {
  if (name == "paged-uniform") return paged_uniform(layout, o);
  if (name == "max-page") return max_page(layout, o);
  if (name == "static-split") return static_split(layout, o);
  if (name == "unified-block") return unified_block(layout, o);
  if (name == "vllm-0.33") return vllm_033(layout, o, false);
  if (name == "vllm-0.33-tuned") return vllm_033(layout, o, true);
  fail("policy = '{}': not a block-pool policy", name);
}

}  // namespace kvmm::sim
