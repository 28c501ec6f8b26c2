// From a family reader's Reading to a ModelSpec (hf_reader.hpp): one group per slot (full,
// sliding, chunked, cross, state, then the indexer) and KV format, each decoder layer's
// placement (own pages, another layer's, none; plus a second cache), the attention
// parameters per group and the planned layout. Each group names its decoder layers
// (LayerGroup::layers), so placements are read off the planned layout's layer map, sliced
// or not (LayoutOptions::slice_layers). Linear in the number of layers.
#include "hf_reader.hpp"

#include <fmt/ranges.h>

#include <map>
#include <utility>

namespace kvmm::hf {

namespace {

enum Slot : std::size_t { kFull, kSliding, kChunked, kCross, kState, kIndexer, kNumSlots };

Slot slot_of(LayerKind k) {
  switch (k) {
    case LayerKind::kFullAttention:
      return kFull;
    case LayerKind::kSlidingWindow:
      return kSliding;
    case LayerKind::kChunkedLocal:
      return kChunked;
    case LayerKind::kCrossAttention:
      return kCross;
    case LayerKind::kMambaState:
      return kState;
    default:
      fail("LayerKind {} has no group slot", to_string(k));
  }
}

bool is_element_size(std::uint32_t bytes) { return bytes == 1 || bytes == 2 || bytes == 4; }

// The K and V formats of one decoder layer: std::nullopt for "auto" (dtype_bytes, plain).
struct KvFormats {
  std::optional<ElementFormat> k, v;
  std::string label;  // "" for the options' default, else the layer's kv_cache_dtype
  bool operator==(const KvFormats& o) const { return k == o.k && v == o.v; }
};

std::optional<ElementFormat> format_or_auto(const std::string& name, std::string_view field) {
  if (name.empty() || name == "auto") return std::nullopt;
  return parse_kv_cache_dtype(name, field);
}

KvFormats default_formats(const HfConfigOptions& o) {
  KvFormats f;
  const auto all = format_or_auto(o.kv_cache_dtype, "HfConfigOptions.kv_cache_dtype");
  f.k = o.k_cache_dtype.empty() ? all : format_or_auto(o.k_cache_dtype, "HfConfigOptions.k_cache_dtype");
  f.v = o.v_cache_dtype.empty() ? all : format_or_auto(o.v_cache_dtype, "HfConfigOptions.v_cache_dtype");
  return f;
}

LayerGroup attention_group(Slot slot, const std::string& name, std::uint32_t layers, const Reading& r,
                           const KvFormats& f, const HfConfigOptions& o) {
  const AttentionParams& a = r.attn;
  if (slot == kFull && r.mla) {
    const ElementFormat latent = f.k.value_or(ElementFormat::raw_bytes(o.dtype_bytes));
    // vLLM's fp8_ds_mla keeps the rope part in 16 bits beside the scaled latent; an
    // unscaled (or per-tensor) latent stores its rope part in the same element type.
    std::optional<ElementFormat> rope;
    if (latent.scale.in_pages()) rope = ElementFormat::of(ElementType::kBf16);
    return LayerGroup::mla(name, layers, r.kv_lora_rank, r.rope_dim, latent, rope, o.tokens_per_page);
  }
  LayerGroup g;
  switch (slot) {
    case kSliding:
      g = LayerGroup::sliding_window(name, layers, a.num_kv_heads, a.head_dim, o.dtype_bytes, o.tokens_per_page,
                                     a.sliding_window);
      break;
    case kChunked:
      g = LayerGroup::chunked_local(name, layers, a.num_kv_heads, a.head_dim, o.dtype_bytes, o.tokens_per_page,
                                    a.attention_chunk);
      break;
    case kCross:
      g = LayerGroup::cross_attention(name, layers, a.num_kv_heads, a.head_dim, o.dtype_bytes, o.tokens_per_page);
      break;
    default:
      g = LayerGroup::full_attention(name, layers, a.num_kv_heads, a.head_dim, o.dtype_bytes, o.tokens_per_page);
  }
  if (f.k || f.v) {
    g.k_format = f.k.value_or(ElementFormat::raw_bytes(o.dtype_bytes));
    g.v_format = f.v.value_or(ElementFormat::raw_bytes(o.dtype_bytes));
  }
  return g;
}

LayerGroup state_group(const std::string& name, std::uint32_t layers, const Reading& r, const HfConfigOptions& o) {
  if (r.state_tensors.empty()) return LayerGroup::mamba_state(name, layers, r.state_bytes, o.mamba_checkpoint_interval);
  std::vector<StateTensor> t = r.state_tensors;
  const std::uint32_t ssm = o.ssm_state_dtype_bytes != 0 ? o.ssm_state_dtype_bytes
                            : r.ssm_dtype_bytes != 0     ? r.ssm_dtype_bytes
                                                         : o.state_dtype_bytes;
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i].format = ElementFormat::raw_bytes(
        i < r.state_tensor_role.size() && r.state_tensor_role[i] == 1 ? ssm : o.state_dtype_bytes);
  return LayerGroup::recurrent_state(name, layers, std::move(t), o.mamba_checkpoint_interval);
}

std::string slot_name(Slot s, const Reading& r) {
  switch (s) {
    case kFull:
      return r.names[0];
    case kSliding:
      return r.names[1];
    case kChunked:
      return r.chunked_name;
    case kCross:
      return r.names[2];
    case kState:
      return r.names[3];
    default:
      return "indexer";
  }
}

}  // namespace

void check_options(const HfConfigOptions& o) {
  if (o.tokens_per_page == 0) fail("HfConfigOptions.tokens_per_page = 0: must be >= 1");
  if (!is_element_size(o.dtype_bytes)) fail("HfConfigOptions.dtype_bytes = {}: must be 1, 2 or 4", o.dtype_bytes);
  if (!is_element_size(o.state_dtype_bytes))
    fail("HfConfigOptions.state_dtype_bytes = {}: must be 1, 2 or 4", o.state_dtype_bytes);
  if (o.ssm_state_dtype_bytes != 0 && !is_element_size(o.ssm_state_dtype_bytes))
    fail("HfConfigOptions.ssm_state_dtype_bytes = {}: must be 0, 1, 2 or 4", o.ssm_state_dtype_bytes);
  if (o.mamba_checkpoint_interval == 0) fail("HfConfigOptions.mamba_checkpoint_interval = 0: must be >= 1");
  (void)default_formats(o);
  (void)parse_kv_cache_dtype(o.indexer_cache_dtype, "HfConfigOptions.indexer_cache_dtype");
  for (std::size_t i = 0; i < o.layer_kv_cache_dtype.size(); ++i)
    (void)format_or_auto(o.layer_kv_cache_dtype[i].kv_cache_dtype,
                         fmt::format("HfConfigOptions.layer_kv_cache_dtype[{}].kv_cache_dtype", i));
}

// Long by design (lint): slots, formats, shared and auxiliary caches in one pass each.
// NOLINTBEGIN(readability-function-cognitive-complexity)
ModelSpec assemble(std::string model_type, const Reading& r, const HfConfigOptions& o) {
  // NOLINTEND(readability-function-cognitive-complexity)
  const std::size_t n = r.kinds.size();
  auto flag = [](const std::vector<bool>& v, std::size_t i) { return i < v.size() && v[i]; };
  auto owner = [&](std::size_t i) { return i < r.kv_owner.size() ? r.kv_owner[i] : std::int64_t{-1}; };

  // Per-layer KV formats: the options' default, or the layer's override.
  std::vector<KvFormats> formats{default_formats(o)};
  std::vector<std::size_t> fmt_of(n, 0);
  for (std::size_t i = 0; i < o.layer_kv_cache_dtype.size(); ++i) {
    const auto& d = o.layer_kv_cache_dtype[i];
    const std::string field = fmt::format("HfConfigOptions.layer_kv_cache_dtype[{}]", i);
    if (d.layer >= n) fail("{}.layer = {}: the model has {} decoder layers", field, d.layer, n);
    KvFormats f;
    f.k = f.v = format_or_auto(d.kv_cache_dtype, field + ".kv_cache_dtype");
    f.label = d.kv_cache_dtype;
    std::size_t k = 0;
    while (k < formats.size() && !(formats[k] == f)) ++k;
    if (k == formats.size()) formats.push_back(f);
    fmt_of[d.layer] = k;
  }

  // Groups: (slot, format) in slot order, formats in order of first use.
  std::map<std::pair<std::size_t, std::size_t>, std::uint32_t> count;
  auto key_of = [&](std::size_t i) {
    const Slot s = slot_of(r.kinds[i]);
    return std::pair<std::size_t, std::size_t>{s, s == kState ? 0 : fmt_of[i]};
  };
  // The decoder layers each group holds, in model order (a layer with an auxiliary state
  // in the state group as well).
  std::map<std::pair<std::size_t, std::size_t>, std::vector<std::uint32_t>> members;
  for (std::size_t i = 0; i < n; ++i) {
    if (flag(r.no_cache, i)) continue;
    if (owner(i) < 0) {
      ++count[key_of(i)];
      members[key_of(i)].push_back(static_cast<std::uint32_t>(i));
    }
    if (flag(r.aux_state, i)) {
      ++count[{kState, 0}];
      members[{kState, 0}].push_back(static_cast<std::uint32_t>(i));
    }
  }

  ModelSpec m;
  m.model_type = std::move(model_type);
  std::vector<LayerGroup> groups;
  std::map<std::pair<std::size_t, std::size_t>, GroupId> group_of;
  std::array<std::size_t, kNumSlots> formats_in_slot{};
  for (const auto& [key, c] : count) ++formats_in_slot[key.first];
  for (const auto& [key, layers] : count) {
    const auto slot = static_cast<Slot>(key.first);
    std::string name = slot_name(slot, r);
    if (formats_in_slot[slot] > 1 && !formats[key.second].label.empty()) name += "." + formats[key.second].label;
    group_of[key] = static_cast<GroupId>(groups.size());
    groups.push_back(slot == kState ? state_group(name, layers, r, o)
                                    : attention_group(slot, name, layers, r, formats[key.second], o));
    groups.back().layers = members.at(key);
    AttentionParams a = slot == kState ? AttentionParams{} : r.attn;
    if (slot != kSliding) a.sliding_window = 0;
    if (slot != kChunked) a.attention_chunk = 0;
    m.attention.push_back(a);
  }
  // DSA: one indexer group over the MLA layers, tied to their group.
  if (r.indexer) {
    if (formats_in_slot[kFull] != 1)
      fail(
          "HfConfigOptions.layer_kv_cache_dtype: splits the MLA layers of an indexed (DSA) model into {} groups; its "
          "indexer is tied to one group",
          formats_in_slot[kFull]);
    const GroupId mla = group_of.begin()->first.first == kFull ? group_of.begin()->second : kNoAuxGroup;
    if (mla == kNoAuxGroup) fail("{}: an indexer needs full-attention layers", m.model_type);
    groups.push_back(
        LayerGroup::indexer("indexer", groups[mla].num_layers, r.indexer_attn.num_kv_heads, r.indexer_attn.head_dim,
                            parse_kv_cache_dtype(o.indexer_cache_dtype, "HfConfigOptions.indexer_cache_dtype"),
                            o.tokens_per_page, groups[mla].name));
    m.attention.push_back(r.indexer_attn);
  }

  m.layout = KVLayout::plan(std::move(groups), o.layout);
  // Attention parameters per planned group (a sliced group's are its source group's).
  std::vector<AttentionParams> source_attention = std::move(m.attention);
  m.attention.clear();
  for (GroupId g = 0; g < m.layout.num_groups(); ++g) m.attention.push_back(source_attention[m.layout.source_group(g)]);
  // Placements from the layout's layer map (the group first in group order, then the
  // second cache: an indexer, or a hybrid layer's state); shared layers point at their
  // owner's.
  m.layers.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    LayerPlacement& p = m.layers[i];
    if (flag(r.no_cache, i)) {
      p.role = LayerRole::kNoCache;
      continue;
    }
    if (owner(i) >= 0) continue;
    const std::span<const LayerSlot> slots = m.layout.layer_slots(static_cast<std::uint32_t>(i));
    p.group = slots[0].group;
    p.index = slots[0].slot;
    if (slots.size() > 1) {
      p.aux_group = slots[1].group;
      p.aux_index = slots[1].slot;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t own = owner(i);
    if (own < 0 || flag(r.no_cache, i)) continue;
    if (static_cast<std::size_t>(own) >= n || owner(static_cast<std::size_t>(own)) >= 0 ||
        flag(r.no_cache, static_cast<std::size_t>(own)) || slot_of(r.kinds[own]) != slot_of(r.kinds[i]))
      fail("{}: layer {} shares the KV of layer {}, which is not an owning {} layer", m.model_type, i, own,
           to_string(r.kinds[i]));
    LayerPlacement p = m.layers[static_cast<std::size_t>(own)];
    p.role = LayerRole::kSharedKv;
    p.kv_owner = static_cast<std::uint32_t>(own);
    m.layers[i] = p;
  }
  return m;
}

}  // namespace kvmm::hf

namespace kvmm {

void validate_layers(const ModelSpec& spec) {
  const KVLayout& l = spec.layout;
  std::vector<std::vector<bool>> used(l.num_groups());
  for (GroupId g = 0; g < l.num_groups(); ++g) used[g].assign(l.group(g).num_layers, false);
  auto claim = [&](std::size_t i, GroupId g, std::uint32_t index, std::string_view field) {
    if (g >= l.num_groups()) fail("layers[{}].{} = {}: the layout has {} groups", i, field, g, l.num_groups());
    if (index >= used[g].size())
      fail("layers[{}]: index {} in group '{}', which has {} layers", i, index, l.group(g).name, used[g].size());
    if (used[g][index]) fail("layers[{}]: slot {} of group '{}' is already taken", i, index, l.group(g).name);
    if (l.model_layer(g, index) != i)
      fail("layers[{}]: slot {} of group '{}' holds model layer {} in the layout's layer map", i, index,
           l.group(g).name, l.model_layer(g, index));
    used[g][index] = true;
  };
  if (spec.attention.size() != l.num_groups())
    fail("attention: {} entries for {} groups", spec.attention.size(), l.num_groups());
  for (std::size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerPlacement& p = spec.layers[i];
    if (static_cast<unsigned>(p.role) > static_cast<unsigned>(LayerRole::kNoCache))
      fail("layers[{}].role = {}: not a LayerRole", i, static_cast<unsigned>(p.role));
    if (p.role == LayerRole::kOwn) claim(i, p.group, p.index, "group");
    if (p.role == LayerRole::kOwn && p.aux_group != kNoAuxGroup) claim(i, p.aux_group, p.aux_index, "aux_group");
    if (p.role != LayerRole::kSharedKv) continue;
    if (p.kv_owner >= spec.layers.size())
      fail("layers[{}].kv_owner = {}: no such layer (the model has {})", i, p.kv_owner, spec.layers.size());
    const LayerPlacement& o = spec.layers[p.kv_owner];
    if (o.role != LayerRole::kOwn) fail("layers[{}].kv_owner = {}: that layer does not own its KV", i, p.kv_owner);
    if (o.group != p.group || o.index != p.index)
      fail("layers[{}]: group {} index {} differ from its kv_owner {}'s group {} index {}", i, p.group, p.index,
           p.kv_owner, o.group, o.index);
  }
  for (GroupId g = 0; g < l.num_groups(); ++g)
    for (std::uint32_t k = 0; k < used[g].size(); ++k)
      if (!used[g][k]) fail("group '{}': layer slot {} is used by no decoder layer", l.group(g).name, k);
}

}  // namespace kvmm
