#include "kvmm/spec/kv_layout.hpp"

#include "kvmm/checked.hpp"
#include "kvmm/error.hpp"
#include "kvmm/spec/layer_slicing.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <utility>

namespace kvmm {

namespace {

constexpr std::uint64_t kOverflow = std::numeric_limits<std::uint64_t>::max();

// lcm of two non-zero sizes that saturates to kOverflow instead of wrapping. The planner
// never uses a saturated value as a page size: every limit is below kOverflow.
std::uint64_t lcm_sat(std::uint64_t a, std::uint64_t b) {
  if (a == kOverflow || b == kOverflow) return kOverflow;
  return try_mul(a / std::gcd(a, b), b).value_or(kOverflow);
}

using Factors = std::map<std::uint64_t, int>;

// Trial division: n <= max_large_page_bytes <= 2^40, so at most 2^20 steps.
Factors factorize(std::uint64_t n) {
  Factors f;
  for (std::uint64_t p = 2; p <= n / p; ++p) {
    while (n % p == 0) {
      ++f[p];
      n /= p;
    }
  }
  if (n > 1) ++f[n];
  return f;
}

void divisors_rec(const std::vector<std::pair<std::uint64_t, int>>& fs, std::size_t i, std::uint64_t cur,
                  std::vector<std::uint64_t>& out) {
  if (i == fs.size()) {
    out.push_back(cur);
    return;
  }
  std::uint64_t v = cur;
  for (int e = 0;; ++e) {  // v = cur * p^e divides the large page: no overflow
    divisors_rec(fs, i + 1, v, out);
    if (e == fs[i].second) break;
    v *= fs[i].first;
  }
}

std::vector<std::uint64_t> sorted_divisors(const Factors& f) {
  std::vector<std::pair<std::uint64_t, int>> fs(f.begin(), f.end());
  std::vector<std::uint64_t> out;
  divisors_rec(fs, 0, 1, out);
  std::sort(out.begin(), out.end());
  return out;
}

// v * p while it stays <= limit, else 0 (which ends a loop), never wrapping.
std::uint64_t times_within(std::uint64_t v, std::uint64_t p, std::uint64_t limit) {
  const std::optional<std::uint64_t> r = try_mul(v, p);
  return r && *r <= limit ? *r : 0;
}

// 7-smooth numbers <= limit: multipliers with many divisors, so that a large page made
// from them can be split into small pages close to any requested size. About 10^4 of
// them below 2^40.
std::vector<std::uint64_t> smooth_numbers(std::uint64_t limit) {
  std::vector<std::uint64_t> out;
  for (std::uint64_t a = 1; a != 0; a = times_within(a, 2, limit))
    for (std::uint64_t b = a; b != 0; b = times_within(b, 3, limit))
      for (std::uint64_t c = b; c != 0; c = times_within(c, 5, limit))
        for (std::uint64_t d = c; d != 0; d = times_within(d, 7, limit)) out.push_back(d);
  return out;
}

struct Candidate {
  std::uint64_t large = 0;
  std::vector<std::uint64_t> padded;
  double max_frac = 2.0;
  double sum_frac = 0.0;

  bool better_than(const Candidate& o) const {
    if (max_frac != o.max_frac) return max_frac < o.max_frac;
    if (sum_frac != o.sum_frac) return sum_frac < o.sum_frac;
    return large < o.large;
  }
};

// For a large page with the given factorization, pick per group the smallest divisor
// that holds the natural size (aligned when padded); returns false if some group fits
// no divisor.
bool evaluate(std::uint64_t large, const Factors& f, const std::vector<std::uint64_t>& natural, std::uint64_t align,
              Candidate& out) {
  const std::vector<std::uint64_t> divs = sorted_divisors(f);
  out.large = large;
  out.padded.assign(natural.size(), 0);
  out.max_frac = 0.0;
  out.sum_frac = 0.0;
  for (std::size_t g = 0; g < natural.size(); ++g) {
    auto it = std::lower_bound(divs.begin(), divs.end(), natural[g]);
    while (it != divs.end() && *it != natural[g] && *it % align != 0) ++it;
    if (it == divs.end()) return false;
    out.padded[g] = *it;
    const double frac = static_cast<double>(*it - natural[g]) / static_cast<double>(*it);
    out.max_frac = std::max(out.max_frac, frac);
    out.sum_frac += frac;
  }
  return true;
}

// LayoutOptions::fit_tokens_per_page: the token groups (all but recurrent states) with
// tokens_per_page divided by the smallest common divisor d > 1 whose natural LCM fits the
// limit, keeping every one >= min_fitted_tokens_per_page; nullopt when no d does. Each try
// re-validates the groups (a format may need whole blocks of tokens) and costs one LCM.
struct Fitted {
  std::vector<LayerGroup> groups;
  std::vector<std::uint64_t> natural;
  std::uint64_t lcm = 1;
};

std::optional<Fitted> fit_tokens_per_page(const std::vector<LayerGroup>& groups, const LayoutOptions& options,
                                          std::uint64_t limit) {
  std::uint64_t common = 0, smallest = std::numeric_limits<std::uint32_t>::max();
  for (const LayerGroup& g : groups) {
    if (g.is_state()) continue;
    common = std::gcd(common, std::uint64_t{g.tokens_per_page});
    smallest = std::min<std::uint64_t>(smallest, g.tokens_per_page);
  }
  if (common <= 1) return std::nullopt;
  for (const std::uint64_t d : sorted_divisors(factorize(common))) {
    if (d == 1) continue;
    if (smallest / d < options.min_fitted_tokens_per_page) break;
    Fitted f;
    f.groups = groups;
    bool valid = true;
    for (LayerGroup& g : f.groups) {
      if (!g.is_state()) g.tokens_per_page = static_cast<std::uint32_t>(g.tokens_per_page / d);
      try {
        g.validate();
        f.natural.push_back(g.natural_page_bytes());
      } catch (const Error&) {
        valid = false;
        break;
      }
      f.lcm = lcm_sat(f.lcm, f.natural.back());
    }
    if (valid && f.lcm <= limit) return f;
  }
  return std::nullopt;
}

// The line describe() adds under a group that is not plain K/V in whole bytes.
std::string describe_storage(const LayerGroup& g) {
  if (g.is_state()) {
    std::string t;
    for (const StateTensor& s : g.state_tensors)
      t += fmt::format("{}{} [{}] {}", t.empty() ? "" : ", ", s.name, fmt::join(s.shape, ", "), s.format.describe());
    return fmt::format("    state per layer {} B: {}\n", g.state_bytes_per_layer, t);
  }
  switch (g.storage) {
    case KvStorage::kLatent:
      return fmt::format("    latent {} + rope {} per token: {} + {}\n", g.head_dim, g.rope_dim,
                         g.k_element().describe(), g.rope_element().describe());
    case KvStorage::kKeyOnly:
      return fmt::format("    indexer of '{}': {} x {} keys {}\n", g.tied_to, g.kv_heads, g.head_dim,
                         g.k_element().describe());
    default:
      return fmt::format("    K {}  V {}\n", g.k_element().describe(), g.v_element().describe());
  }
}

// What holds a model layer: at most one of each per layer (a hybrid layer's attention and
// state, an MLA layer and its indexer).
int holder_class(const LayerGroup& g) {
  if (g.is_state()) return 1;
  return g.storage == KvStorage::kKeyOnly ? 2 : 0;
}

// LayerGroup::layers: the given ones checked (distinct, at most one holder of each class per
// model layer, an indexer's equal to its attention group's), the empty ones numbered after
// the largest given index in group order (an indexer's copied from its attention group).
void assign_layers(std::vector<LayerGroup>& groups) {
  std::uint64_t next = 0;
  for (const LayerGroup& g : groups)
    for (std::uint32_t l : g.layers) next = std::max<std::uint64_t>(next, std::uint64_t{l} + 1);
  for (LayerGroup& g : groups) {
    if (!g.layers.empty() || g.kind == LayerKind::kVisionEmbedding || g.storage == KvStorage::kKeyOnly) continue;
    if (next + g.num_layers > LayerGroup::kMaxModelLayers)
      fail("LayerGroup '{}': numbering its {} layers from {} passes {} model layers", g.name, g.num_layers, next,
           LayerGroup::kMaxModelLayers);
    for (std::uint32_t k = 0; k < g.num_layers; ++k) g.layers.push_back(static_cast<std::uint32_t>(next + k));
    next += g.num_layers;
  }
  for (LayerGroup& g : groups) {
    if (g.storage != KvStorage::kKeyOnly) continue;
    const auto owner =
        std::find_if(groups.begin(), groups.end(), [&](const LayerGroup& o) { return o.name == g.tied_to; });
    if (g.layers.empty()) g.layers = owner->layers;
    if (g.layers != owner->layers)
      fail("LayerGroup '{}': layers [{}] differ from those of its attention group '{}' [{}]", g.name,
           fmt::join(g.layers, ", "), owner->name, fmt::join(owner->layers, ", "));
  }
  std::map<std::pair<std::uint32_t, int>, const LayerGroup*> holder;
  for (const LayerGroup& g : groups)
    for (std::size_t k = 0; k < g.layers.size(); ++k) {
      const auto [it, fresh] = holder.try_emplace({g.layers[k], holder_class(g)}, &g);
      if (!fresh)
        fail("LayerGroup '{}': layers[{}] = {}: model layer {} is already held by {} '{}'", g.name, k, g.layers[k],
             g.layers[k], it->second == &g ? "this group, at another slot of" : "group", it->second->name);
    }
}

}  // namespace

GroupId KVLayout::check(GroupId g) const {
  if (g >= groups_.size()) fail("group = {}: layout has {} groups", g, groups_.size());
  return g;
}

// Long by design (lint): the planner's checks in the order its error messages are documented, then the LCM.
// NOLINTBEGIN(readability-function-cognitive-complexity)
KVLayout KVLayout::plan_groups(std::vector<LayerGroup> groups, const LayoutOptions& options) {
  // NOLINTEND(readability-function-cognitive-complexity)
  if (groups.empty()) fail("groups: empty, a layout needs at least one layer group");
  if (options.max_large_page_bytes == 0 || options.max_large_page_bytes > LayoutOptions::kMaxLargePageBytes)
    fail(
        "max_large_page_bytes = {}: must be in [1, 2^40]; a large page is carved from one "
        "device's memory, and the padding search must end",
        options.max_large_page_bytes);
  if (options.padded_page_alignment == 0) fail("padded_page_alignment = 0, must be >= 1");
  if (options.fit_tokens_per_page && options.min_fitted_tokens_per_page == 0)
    fail("min_fitted_tokens_per_page = 0, must be >= 1 when fit_tokens_per_page is on");
  if (options.slice_layers != SliceLayers::kOff && options.slice_layers != SliceLayers::kSmallestWhenDense)
    fail("slice_layers = {}: not a SliceLayers", static_cast<unsigned>(options.slice_layers));
  if (options.slice_layers != SliceLayers::kOff && options.slice_above_pages_per_large_page == 0)
    fail("slice_above_pages_per_large_page = 0: must be >= 1 (SliceLayers::kOff turns slicing off)");
  std::set<std::string_view> names;
  for (const LayerGroup& g : groups) {
    g.validate();
    if (!names.insert(g.name).second) fail("LayerGroup.name = '{}': duplicate group name", g.name);
  }
  for (const LayerGroup& g : groups) {
    if (!g.draft) continue;
    const auto target =
        std::find_if(groups.begin(), groups.end(), [&](const LayerGroup& o) { return o.name == g.draft->target; });
    if (target == groups.end())
      fail("LayerGroup '{}': draft.target = '{}': no group of that name", g.name, g.draft->target);
    if (target->draft || !target->is_decoder())
      fail("LayerGroup '{}': draft.target = '{}': a {} group, not a decoder target group", g.name, g.draft->target,
           target->draft ? "draft" : to_string(target->kind));
  }
  for (const LayerGroup& g : groups) {
    if (g.storage != KvStorage::kKeyOnly) continue;
    const auto owner =
        std::find_if(groups.begin(), groups.end(), [&](const LayerGroup& o) { return o.name == g.tied_to; });
    if (owner == groups.end()) fail("LayerGroup '{}': tied_to = '{}': no group of that name", g.name, g.tied_to);
    if (owner->storage == KvStorage::kKeyOnly || owner->is_state() || !owner->is_decoder() ||
        owner->kind == LayerKind::kVisionEmbedding)
      fail("LayerGroup '{}': tied_to = '{}': a {} {} group, not a decoder attention group", g.name, g.tied_to,
           to_string(owner->kind), to_string(owner->storage));
    if (owner->kind != g.kind || owner->window != g.window || owner->chunk != g.chunk ||
        owner->num_layers != g.num_layers)
      fail(
          "LayerGroup '{}': tied_to = '{}': the indexer ({}, window {}, chunk {}, {} layers) must match its "
          "attention group ({}, window {}, chunk {}, {} layers)",
          g.name, g.tied_to, to_string(g.kind), g.window, g.chunk, g.num_layers, to_string(owner->kind), owner->window,
          owner->chunk, owner->num_layers);
  }

  assign_layers(groups);

  KVLayout layout;
  std::vector<std::uint32_t> requested;
  std::vector<std::uint64_t> natural;
  std::uint64_t lcm = 1;
  for (const LayerGroup& g : groups) {
    requested.push_back(g.tokens_per_page);
    natural.push_back(g.natural_page_bytes());
    lcm = lcm_sat(lcm, natural.back());
  }
  // The largest large page that keeps every state group at max_state_pages_per_large_page
  // pages or fewer (no limit when off or without state groups).
  std::uint64_t state_limit = std::numeric_limits<std::uint64_t>::max();
  if (options.max_state_pages_per_large_page > 0)
    for (std::size_t g = 0; g < groups.size(); ++g)
      if (groups[g].is_state()) {
        std::uint64_t most = 0;
        if (__builtin_mul_overflow(natural[g], std::uint64_t{options.max_state_pages_per_large_page}, &most))
          most = std::numeric_limits<std::uint64_t>::max();
        state_limit = std::min(state_limit, most);
      }
  const auto refit = [&](std::uint64_t limit) {
    std::optional<Fitted> f = fit_tokens_per_page(groups, options, limit);
    if (!f) return false;
    groups = std::move(f->groups);
    natural = std::move(f->natural);
    lcm = f->lcm;
    return true;
  };
  if (options.fit_tokens_per_page && lcm > std::min(options.max_large_page_bytes, state_limit)) {
    // The state bound first (within the size limit); else, past the size limit, that alone.
    if (!(state_limit < lcm && refit(std::min(options.max_large_page_bytes, state_limit))) &&
        lcm > options.max_large_page_bytes)
      refit(options.max_large_page_bytes);
  }
  layout.natural_lcm_ = lcm;

  Candidate best;
  if (lcm <= options.max_large_page_bytes) {
    best.large = lcm;
    best.padded = natural;
  } else {
    const std::uint64_t largest = *std::max_element(natural.begin(), natural.end());
    if (largest > options.max_large_page_bytes)
      fail("max_large_page_bytes = {}: smaller than the largest small page ({} bytes)", options.max_large_page_bytes,
           largest);
    // Candidate large pages: s_g * m for each group g (keeps g unpadded) and plain m,
    // m 7-smooth. Each candidate costs one divisor enumeration.
    const std::vector<std::uint64_t> smooth = smooth_numbers(options.max_large_page_bytes);
    std::vector<std::pair<std::uint64_t, Factors>> bases{{1, Factors{}}};
    for (std::uint64_t s : natural) bases.emplace_back(s, factorize(s));
    std::set<std::uint64_t> seen;
    for (const auto& [base, base_f] : bases) {
      for (std::uint64_t m : smooth) {
        std::uint64_t large = 0;
        if (__builtin_mul_overflow(base, m, &large) || large > options.max_large_page_bytes) continue;
        if (large < largest || !seen.insert(large).second) continue;
        Factors f = base_f;
        for (std::uint64_t p : {2u, 3u, 5u, 7u}) {
          for (std::uint64_t x = m; x % p == 0; x /= p) ++f[p];
        }
        Candidate c;
        if (evaluate(large, f, natural, options.padded_page_alignment, c) && c.better_than(best)) best = std::move(c);
      }
    }
    if (best.padded.empty())
      fail("max_large_page_bytes = {}: no padded layout fits (natural LCM {} bytes)", options.max_large_page_bytes,
           lcm);
  }

  layout.large_page_bytes_ = best.large;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    Sizes s;
    s.natural = natural[g];
    s.padded = best.padded[g];
    s.requested_tokens = requested[g];
    const std::uint64_t per = best.large / s.padded;
    if (per > std::numeric_limits<std::uint32_t>::max())
      fail("LayerGroup '{}': {} small pages per large page, over 2^32", groups[g].name, per);
    s.per_large = static_cast<std::uint32_t>(per);
    layout.sizes_.push_back(s);
  }
  layout.groups_ = std::move(groups);
  layout.num_sources_ = layout.groups_.size();
  for (std::size_t g = 0; g < layout.num_sources_; ++g) layout.sources_.push_back(g);
  layout.map_layers();
  return layout;
}

KVLayout KVLayout::plan(std::vector<LayerGroup> groups, const LayoutOptions& options) {
  KVLayout layout = plan_groups(std::move(groups), options);
  if (options.slice_layers != SliceLayers::kSmallestWhenDense) return layout;
  const std::uint32_t n = dense_slice_layers(layout, options.slice_above_pages_per_large_page);
  return n == 0 ? layout : slice_layers(layout, n, options);
}

void KVLayout::map_layers() {
  std::uint32_t n = 0;
  for (const LayerGroup& g : groups_)
    for (std::uint32_t l : g.layers) n = std::max(n, l + 1);
  layer_begin_.assign(std::size_t{n} + 2, 0);
  for (const LayerGroup& g : groups_)
    for (std::uint32_t l : g.layers) ++layer_begin_[std::size_t{l} + 2];
  for (std::size_t i = 2; i < layer_begin_.size(); ++i) layer_begin_[i] += layer_begin_[i - 1];
  layer_slots_.assign(layer_begin_.back(), LayerSlot{});
  for (GroupId g = 0; g < groups_.size(); ++g)  // group order within each layer
    for (std::uint32_t k = 0; k < groups_[g].layers.size(); ++k)
      layer_slots_[layer_begin_[std::size_t{groups_[g].layers[k]} + 1]++] = LayerSlot{g, k};
  layer_begin_.pop_back();
}

LayerSlot KVLayout::layer_group(std::uint32_t model_layer) const {
  const std::span<const LayerSlot> s = layer_slots(model_layer);
  if (s.empty())
    fail("model_layer = {}: {}", model_layer,
         model_layer >= num_model_layers() ? fmt::format("the layout maps {} model layers", num_model_layers())
                                           : std::string("no group holds it (a layer without pages of its own)"));
  return s.front();
}

std::span<const LayerSlot> KVLayout::layer_slots(std::uint32_t model_layer) const {
  if (model_layer >= num_model_layers()) return {};
  return {layer_slots_.data() + layer_begin_[model_layer], layer_slots_.data() + layer_begin_[model_layer + 1]};
}

std::uint32_t KVLayout::model_layer(GroupId g, std::uint32_t slot) const {
  const LayerGroup& grp = group(g);
  if (slot >= grp.layers.size()) fail("slot = {}: group '{}' holds {} model layers", slot, grp.name, grp.layers.size());
  return grp.layers[slot];
}

std::optional<GroupId> KVLayout::find_group(std::string_view name) const {
  for (GroupId g = 0; g < groups_.size(); ++g)
    if (groups_[g].name == name) return g;
  return std::nullopt;
}

double KVLayout::padding_fraction(GroupId g) const {
  const Sizes& s = sizes_[check(g)];
  return static_cast<double>(s.padded - s.natural) / static_cast<double>(s.padded);
}

bool KVLayout::tokens_per_page_fitted() const {
  for (GroupId g = 0; g < groups_.size(); ++g)
    if (groups_[g].tokens_per_page != sizes_[g].requested_tokens) return true;
  return false;
}

double KVLayout::padding_fraction() const {
  double m = 0.0;
  for (GroupId g = 0; g < groups_.size(); ++g) m = std::max(m, padding_fraction(g));
  return m;
}

bool KVLayout::padded() const {
  return std::any_of(sizes_.begin(), sizes_.end(), [](const Sizes& s) { return s.padded != s.natural; });
}

std::uint64_t KVLayout::k_offset(GroupId g, std::uint32_t layer) const {
  const LayerGroup& grp = group(g);
  if (grp.is_state() || grp.kind == LayerKind::kVisionEmbedding)
    fail("group = {} ('{}'): kind {} has no K/V layout", g, grp.name, to_string(grp.kind));
  if (layer >= grp.num_layers) fail("layer = {}: group '{}' has {} layers", layer, grp.name, grp.num_layers);
  if (!grp.is_plain()) return grp.part(KvPart::kK, layer).offset;
  return std::uint64_t{layer} * 2 * grp.tokens_per_page * grp.head_bytes_per_token();
}

std::uint64_t KVLayout::v_offset(GroupId g, std::uint32_t layer) const {
  const LayerGroup& grp = group(g);
  if (!grp.is_plain()) {
    if (grp.storage != KvStorage::kKeyValue) return k_offset(g, layer);
    (void)k_offset(g, layer);  // the kind and layer checks
    return grp.part(KvPart::kV, layer).offset;
  }
  return k_offset(g, layer) + std::uint64_t{grp.tokens_per_page} * grp.head_bytes_per_token();
}

LayerGroup::Span KVLayout::part(GroupId g, std::uint32_t layer, KvPart which) const {
  return group(g).part(which, layer);
}

std::uint64_t KVLayout::layer_stride_bytes(GroupId g) const {
  const LayerGroup& grp = group(g);
  if (grp.is_plain() && !grp.is_state() && grp.kind != LayerKind::kVisionEmbedding)
    return std::uint64_t{2} * grp.tokens_per_page * grp.head_bytes_per_token();
  return grp.layer_stride_bytes();
}

std::uint64_t KVLayout::state_tensor_offset(GroupId g, std::uint32_t layer, std::size_t tensor) const {
  const LayerGroup& grp = group(g);
  std::uint64_t off = state_offset(g, layer);
  if (tensor >= grp.state_tensors.size())
    fail("tensor = {}: group '{}' has {} state tensors", tensor, grp.name, grp.state_tensors.size());
  for (std::size_t t = 0; t < tensor; ++t) off += grp.state_tensors[t].bytes();
  return off;
}

std::uint64_t KVLayout::alignment_bytes(GroupId g) const {
  const LayerGroup& grp = group(g);
  if (grp.is_plain() || grp.is_state() || grp.kind == LayerKind::kVisionEmbedding) return 0;
  std::uint64_t parts = 0;
  for (std::uint32_t l = 0; l < grp.num_layers; ++l)
    for (std::size_t p = 0; p < kNumKvParts; ++p) parts += grp.part(static_cast<KvPart>(p), l).bytes;
  return natural_page_bytes(g) - parts;
}

std::uint64_t KVLayout::state_offset(GroupId g, std::uint32_t layer) const {
  const LayerGroup& grp = group(g);
  if (!grp.is_state()) fail("group = {} ('{}'): not a state group", g, grp.name);
  if (layer >= grp.num_layers) fail("layer = {}: group '{}' has {} layers", layer, grp.name, grp.num_layers);
  return std::uint64_t{layer} * grp.state_bytes_per_layer;
}

std::string KVLayout::describe() const {
  std::string out = fmt::format("large page {} bytes ({:.2f} MiB){}\n", large_page_bytes_,
                                static_cast<double>(large_page_bytes_) / (1 << 20),
                                padded() ? fmt::format(", padded from LCM {}", natural_lcm_) : "");
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const LayerGroup& grp = groups_[g];
    out += fmt::format(
        "  {:<14} {:<16} layers {:>3}  tokens/page {:>4}  small page {:>10} B  "
        "x{:<5} padding {:.2f}%{}\n",
        grp.name, to_string(grp.kind), grp.num_layers, grp.tokens_per_page, sizes_[g].padded, sizes_[g].per_large,
        100.0 * padding_fraction(g),
        grp.tokens_per_page != sizes_[g].requested_tokens
            ? fmt::format("  (fitted from {} tokens/page)", sizes_[g].requested_tokens)
            : "");
    if (!grp.is_plain()) out += describe_storage(grp);
  }
  return out;
}

}  // namespace kvmm
