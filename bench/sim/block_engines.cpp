// Block-pool models of today's engines (paged-uniform, max-page, static-split,
// unified-block): each one's vgroups and pools for a layout, on the engine of
// block_policy.cpp. See docs/sim.md for each model.
#include "sim/block_policy.hpp"

#include "kvmm/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <optional>

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

// Bytes of one layer and one token in an engine's block: K and V of the layer's heads for a
// group without formats (every layout before issue 32), else the group's own page bytes per
// layer and token (an MLA latent read as K and V, an indexer's keys, formatted K and V with
// their in-page scales), as vLLM's MLAAttentionSpec and quantized specs size a block.
std::uint64_t layer_token_bytes(const LayerGroup& g) {
  if (g.kind == LayerKind::kVisionEmbedding) return g.bytes_per_token();
  if (g.is_plain()) return 2 * g.head_bytes_per_token();
  const std::uint64_t per = std::uint64_t{g.tokens_per_page} * g.num_layers;
  return (g.natural_page_bytes() + per - 1) / per;
}

// The attention group an indexer (key-only) group is tied to, if gid is one.
std::optional<GroupId> indexed_group(const KVLayout& layout, GroupId gid) {
  const LayerGroup& g = layout.group(gid);
  if (g.storage != KvStorage::kKeyOnly) return std::nullopt;
  return layout.find_group(g.tied_to);
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
    per_layer = std::max(per_layer, layer_token_bytes(g));
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
// An indexer (DeepSeek-V3.2's DSA keys) is no group of its own there: vLLM registers its
// cache beside the attention layers it indexes, the same kind and block size, so both sit
// in one KV cache group (UniformTypeKVCacheSpecs) whose block holds the latent and the
// keys of a layer; here its vgroup covers both and its per-layer bytes are their sum.
std::vector<VGroup> unified_groups(const KVLayout& layout, std::uint64_t& page, std::string& tpbs) {
  std::vector<std::uint64_t> per_layer_token(layout.num_groups(), 0);
  for (GroupId gid = 0; gid < layout.num_groups(); ++gid) {
    const LayerGroup& g = layout.group(gid);
    if (g.is_state()) continue;
    const auto owner = indexed_group(layout, gid);
    per_layer_token[owner.value_or(gid)] += layer_token_bytes(g);
  }
  page = 0;  // per-layer block bytes shared by every group
  for (GroupId gid = 0; gid < layout.num_groups(); ++gid)
    if (!layout.group(gid).is_state() && !indexed_group(layout, gid))
      page = std::max(page, per_layer_token[gid] * layout.group(gid).tokens_per_page);
  if (page == 0) fail("layout: unified-block needs at least one attention group");
  const std::uint64_t step = page;  // attention blocks grow in whole kernel blocks
  for (const LayerGroup& g : layout.groups())
    if (g.is_state()) page = std::max(page, (g.state_bytes_per_layer + step - 1) / step * step);
  std::vector<VGroup> vgs;
  tpbs.clear();
  for (GroupId gid = 0; gid < layout.num_groups(); ++gid) {
    const LayerGroup& g = layout.group(gid);
    if (indexed_group(layout, gid)) continue;  // in its attention group's vgroup
    std::uint32_t tpb = 1;
    if (!g.is_state()) {
      tpb = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, page / per_layer_token[gid]));  // padded if not exact
    }
    const std::uint64_t layers = g.kind == LayerKind::kVisionEmbedding ? 1 : g.num_layers;
    vgs.push_back(own_group(layout, gid, tpb, layers, 0));
    std::string with;
    for (GroupId x = 0; x < layout.num_groups(); ++x)
      if (indexed_group(layout, x) == gid) {
        vgs.back().covers.push_back(x);
        with += fmt::format(" + {}", layout.group(x).name);
      }
    if (g.is_state())
      tpbs += fmt::format("{}{} 1 state block x {} layers", tpbs.empty() ? "" : ", ", g.name, layers);
    else
      tpbs += fmt::format("{}{}{} {} tokens/block x {} layers", tpbs.empty() ? "" : ", ", g.name, with, tpb, layers);
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
  rules.window.prompt_end = rules.window.junction = true;
  if (tuned) rules.window.interval = (o.retention_interval + block - 1) / block * block;  // a block multiple
  if (o.prefix_match_unit > 0) {
    if (block % o.prefix_match_unit != 0)
      fail("prefix_match_unit = {}: must divide the {}-token blocks", o.prefix_match_unit, block);
    unit = o.prefix_match_unit;
  }
  rules.hit_unit = unit == 0 || unit >= block ? 0 : unit;
  rules.state_caching = true;
  rules.state = rules.window;
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
      rules.window.interval > 0 ? fmt::format(" or a multiple of {} tokens", rules.window.interval) : "",
      rules.window.interval);
  return make_engine(name, layout, std::move(vgs), std::move(pools), caching, d, SkipOrder::kHighFirst, rules);
}

// One pool per distinct page size (the groups whose pages are equal share it), sized in
// proportion to what a max-length request needs in each group (TensorRT-LLM's typical
// step: max-length sequences; a state group needs one state). Returns the vgroups; `pools` gets the pools and `shares`
// their description.
std::vector<VGroup> merged_pools(const KVLayout& layout, const PolicyOptions& o, std::vector<Pool>& pools,
                                 std::string& shares) {
  std::vector<VGroup> vgs;
  std::vector<std::uint64_t> page_of;  // pool -> page bytes
  std::vector<double> demand;
  double total = 0;
  for (GroupId gid = 0; gid < layout.num_groups(); ++gid) {
    const LayerGroup& g = layout.group(gid);
    const std::uint64_t page = g.natural_page_bytes();
    std::size_t p = std::find(page_of.begin(), page_of.end(), page) - page_of.begin();
    if (p == page_of.size()) {
      page_of.push_back(page);
      demand.push_back(0);
    }
    double d = 0;
    if (g.is_state()) {
      d = static_cast<double>(page);  // one state per sequence of the typical step
    } else {
      std::uint64_t toks = g.is_decoder() ? o.max_model_len : o.max_encoder_tokens;
      if (g.kind == LayerKind::kSlidingWindow) toks = std::min<std::uint64_t>(toks, g.window);
      if (g.kind == LayerKind::kChunkedLocal) toks = std::min<std::uint64_t>(toks, g.chunk);
      d = static_cast<double>(g.bytes_per_token()) * static_cast<double>(std::max<std::uint64_t>(toks, 1));
    }
    demand[p] += d;
    total += d;
    vgs.push_back(own_group(layout, gid, g.is_state() ? 1 : g.tokens_per_page, 1, static_cast<std::uint32_t>(p)));
  }
  // Feasibility floor (the engine's constraints): a step of max_seqs running requests must
  // fit, so a state pool holds at least max_seqs states; the rest is split by demand.
  std::vector<double> floor_bytes(page_of.size(), 0);
  double floors = 0, rest_demand = 0;
  for (GroupId gid = 0; gid < layout.num_groups(); ++gid)
    if (layout.group(gid).is_state())
      floor_bytes[vgs[gid].pool] += static_cast<double>(page_of[vgs[gid].pool]) * o.max_seqs;
  for (std::size_t p = 0; p < page_of.size(); ++p) {
    if (floor_bytes[p] > static_cast<double>(o.memory_bytes) * demand[p] / total) {
      floors += floor_bytes[p];
    } else {
      floor_bytes[p] = 0;
      rest_demand += demand[p];
    }
  }
  if (floors >= static_cast<double>(o.memory_bytes))
    fail("memory_bytes = {}: too small for {} state slots", o.memory_bytes, o.max_seqs);
  for (std::size_t p = 0; p < page_of.size(); ++p) {
    const auto bytes = static_cast<std::uint64_t>(
        floor_bytes[p] > 0 ? floor_bytes[p] : (static_cast<double>(o.memory_bytes) - floors) * demand[p] / rest_demand);
    std::string names;
    for (const VGroup& v : vgs)
      if (v.pool == p) names += (names.empty() ? "" : "+") + v.name;
    pools.push_back(make_pool(names, page_of[p], bytes, false));
    shares += fmt::format("{}{} {:.1f}%", shares.empty() ? "" : ", ", names,
                          100.0 * static_cast<double>(bytes) / static_cast<double>(o.memory_bytes));
  }
  return vgs;
}

std::unique_ptr<Policy> trtllm_v2(const KVLayout& layout, const PolicyOptions& o) {
  // TensorRT-LLM's KV cache manager v2 (docs/sim.md "trtllm-v2").
  std::vector<Pool> pools;
  std::string shares;
  std::vector<VGroup> vgs = merged_pools(layout, o, pools, shares);
  const bool caching = o.prefix_caching && !has_kind(layout, is_encoder);
  CacheRules rules;
  rules.hit_unit = 1;  // enable_partial_reuse with copy_on_partial_reuse: any token inside a block
  rules.stream_partial = true;
  rules.state_caching = true;  // Mamba: the prompt-end snapshot (no periodic or extra offsets by default)
  rules.state.prompt_end = true;
  Rebalance rb;
  rb.enabled = true;
  std::string d = fmt::format(
      "TensorRT-LLM KV cache manager v2: one pool per distinct page size, groups with equal pages merged ({}), "
      "sized by a max-length typical step and rebalanced at run time (after {} finished requests, targets every {} "
      "from moving averages of their lengths, when a share is off by more than {}x, at most every {} steps); "
      "block reuse {} (all blocks reusable, windows too; partial reuse at any token inside a block, copied; Mamba "
      "state snapshot at the prompt end)",
      shares, rb.min_closed, rb.update_interval, rb.threshold, rb.cooldown_steps, caching ? "on" : "off");
  return make_engine("trtllm-v2", layout, std::move(vgs), std::move(pools), caching, d, SkipOrder::kLowFirst, rules,
                     rb);
}

std::unique_ptr<Policy> sglang(const KVLayout& layout, const PolicyOptions& o) {
  // SGLang's unified radix cache (docs/sim.md "sglang"): a token pool per layer kind, the
  // sliding-window pool holding swa_full_tokens_ratio (0.8) of the full pool's tokens and
  // the Mamba pool mamba_full_memory_ratio (0.9) of the full pool's bytes.
  constexpr double kSwaRatio = 0.8, kMambaRatio = 0.9;
  // Tokens of a group's pool per token of the full pool: windows 0.8; encoder (image)
  // groups as many as the workload's longest image per longest sequence.
  auto share = [&](const LayerGroup& g) {
    if (g.kind == LayerKind::kSlidingWindow) return kSwaRatio;
    if (!g.is_decoder()) return static_cast<double>(o.max_encoder_tokens) / static_cast<double>(o.max_model_len);
    return 1.0;
  };
  double per_token = 0;  // bytes of one token in every attention pool, each at its share
  for (const LayerGroup& g : layout.groups())
    if (!g.is_state()) per_token += static_cast<double>(g.bytes_per_token()) * share(g);
  if (per_token == 0) fail("layout: sglang needs at least one attention group");
  const bool state = has_kind(layout, is_state);
  double state_page = 0;
  for (const LayerGroup& g : layout.groups())
    if (g.is_state()) state_page += static_cast<double>(g.natural_page_bytes());
  const double attn_bytes = static_cast<double>(o.memory_bytes) / (state ? 1 + kMambaRatio : 1.0);
  const double full_tokens = attn_bytes / per_token;
  std::vector<VGroup> vgs;
  std::vector<Pool> pools;
  std::string shares;
  for (GroupId gid = 0; gid < layout.num_groups(); ++gid) {
    const LayerGroup& g = layout.group(gid);
    double bytes = 0;
    if (g.is_state())
      bytes =
          (static_cast<double>(o.memory_bytes) - attn_bytes) * static_cast<double>(g.natural_page_bytes()) / state_page;
    else
      bytes = full_tokens * share(g) * static_cast<double>(g.bytes_per_token());
    vgs.push_back(
        own_group(layout, gid, g.is_state() ? 1 : g.tokens_per_page, 1, static_cast<std::uint32_t>(pools.size())));
    pools.push_back(make_pool(g.name, g.natural_page_bytes(), static_cast<std::uint64_t>(bytes), false));
    shares += fmt::format("{}{} {:.1f}%", shares.empty() ? "" : ", ", g.name,
                          100.0 * bytes / static_cast<double>(o.memory_bytes));
  }
  const bool caching = o.prefix_caching && !has_kind(layout, is_encoder);
  CacheRules rules;
  rules.sparse_retention = true;  // out-of-window KV is freed as the request runs
  rules.window.seq_end = rules.window.junction = true;
  rules.state_caching = true;
  rules.state.seq_end = rules.state.junction = true;
  std::string d = fmt::format(
      "SGLang unified radix cache: a pool per group ({}; sliding windows hold {} of the full pool's tokens, Mamba "
      "{} of its bytes); a request frees its out-of-window KV as it runs and keeps the window (and Mamba state) at "
      "its sequence's end and at the branching point found at lookup; hits at page boundaries; radix cache {}",
      shares, kSwaRatio, kMambaRatio, caching ? "on" : "off");
  return make_engine("sglang", layout, std::move(vgs), std::move(pools), caching, d, SkipOrder::kLowFirst, rules);
}

}  // namespace

std::unique_ptr<Policy> make_block_policy(std::string_view name, const KVLayout& layout, const PolicyOptions& o) {
  if (name == "paged-uniform") return paged_uniform(layout, o);
  if (name == "max-page") return max_page(layout, o);
  if (name == "static-split") return static_split(layout, o);
  if (name == "unified-block") return unified_block(layout, o);
  if (name == "vllm-0.33") return vllm_033(layout, o, false);
  if (name == "vllm-0.33-tuned") return vllm_033(layout, o, true);
  if (name == "trtllm-v2") return trtllm_v2(layout, o);
  if (name == "sglang") return sglang(layout, o);
  fail("policy = '{}': not a block-pool policy", name);
}

}  // namespace kvmm::sim
