// CPU reference over formatted pages (kvmm/kernels/formatted_attention.hpp): element codes,
// row addressing through LayerGroup::part, scales, and decode attention in double.
#include "kvmm/kernels/formatted_attention.hpp"

#include "kvmm/checked.hpp"
#include "kvmm/error.hpp"
#include "kvmm/kernels/dtype.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace kvmm::kernels {

namespace {

double pow2(int e) { return std::ldexp(1.0, e); }

// A small float (1 sign, `eb` exponent, `mb` mantissa bits, bias) without inf/NaN codes
// handled by the caller.
double minifloat(std::uint32_t code, int eb, int mb, int bias) {
  const bool neg = (code >> (eb + mb)) & 1u;
  const int exp = static_cast<int>((code >> mb) & ((1u << eb) - 1));
  const double mant = static_cast<double>(code & ((1u << mb) - 1)) / (1u << mb);
  const double v = exp == 0 ? mant * pow2(1 - bias) : (1.0 + mant) * pow2(exp - bias);
  return neg ? -v : v;
}

bool is_nan_or_inf(ElementType t, std::uint32_t code) {
  switch (t) {
    case ElementType::kFp8E4M3:
      return (code & 0x7fu) == 0x7fu;
    case ElementType::kFp8E5M2:
      return ((code >> 2) & 0x1fu) == 0x1fu;
    case ElementType::kE8M0:
      return code == 0xffu;
    default:
      return false;
  }
}

[[noreturn]] void untyped(ElementType t) {
  fail("element type {}: a plain group's dtype_bytes does not say which type it is; set the group's format",
       to_string(t));
}

// The stored code of `bits` bits at element `index` of a region (little-endian nibbles:
// element 2i in the low half of byte i).
std::uint32_t load_code(const std::byte* base, std::uint64_t index, std::uint32_t bits) {
  if (bits == 4) {
    const auto b = static_cast<std::uint8_t>(base[index / 2]);
    return index % 2 == 0 ? (b & 0xfu) : (b >> 4);
  }
  std::uint32_t v = 0;
  std::memcpy(&v, base + index * (bits / 8), bits / 8);  // little-endian host
  return v;
}

void store_code(std::byte* base, std::uint64_t index, std::uint32_t bits, std::uint32_t code) {
  if (bits == 4) {
    auto b = static_cast<std::uint8_t>(base[index / 2]);
    b = index % 2 == 0 ? static_cast<std::uint8_t>((b & 0xf0u) | (code & 0xfu))
                       : static_cast<std::uint8_t>((b & 0x0fu) | ((code & 0xfu) << 4));
    base[index / 2] = static_cast<std::byte>(b);
    return;
  }
  std::memcpy(base + index * (bits / 8), &code, bits / 8);
}

// Where one side (K or V, or the latent's rope part) of a row lives.
struct Side {
  KvPart data;
  KvPart scale;
  ElementFormat format;
  std::uint32_t elems;
  float tensor_scale;
};

// The sides a K or V row is made of: K of a latent is latent + rope; V of a latent is its
// first head_dim elements (the latent's data, read without the rope part).
std::vector<Side> sides_of(const FormattedPages& p, bool v) {
  const LayerGroup& g = p.layout->group(p.group);
  if (g.is_state() || g.kind == LayerKind::kVisionEmbedding)
    fail("group = {} ('{}'): kind {} has no K/V rows", p.group, g.name, to_string(g.kind));
  if (p.layer >= g.num_layers) fail("layer = {}: group '{}' has {} layers", p.layer, g.name, g.num_layers);
  switch (g.storage) {
    case KvStorage::kLatent:
      if (v) return {Side{KvPart::kK, KvPart::kKScale, g.k_element(), g.head_dim, p.k_tensor_scale}};
      if (g.rope_dim == 0) return {Side{KvPart::kK, KvPart::kKScale, g.k_element(), g.head_dim, p.k_tensor_scale}};
      return {Side{KvPart::kK, KvPart::kKScale, g.k_element(), g.head_dim, p.k_tensor_scale},
              Side{KvPart::kRope, KvPart::kRopeScale, g.rope_element(), g.rope_dim, p.k_tensor_scale}};
    case KvStorage::kKeyOnly:
      if (v) fail("group '{}': an indexer (key_only) group has no V rows", g.name);
      return {Side{KvPart::kK, KvPart::kKScale, g.k_element(), g.head_dim, p.k_tensor_scale}};
    default:
      if (v) return {Side{KvPart::kV, KvPart::kVScale, g.v_element(), g.head_dim, p.v_tensor_scale}};
      return {Side{KvPart::kK, KvPart::kKScale, g.k_element(), g.head_dim, p.k_tensor_scale}};
  }
}

// The page holding `token` and the token's row (token-in-page x kv_heads + head).
std::byte* page_of(const FormattedPages& p, std::uint32_t token, std::uint32_t head, std::uint64_t& row) {
  const LayerGroup& g = p.layout->group(p.group);
  if (head >= g.kv_heads) fail("head = {}: group '{}' has {} KV heads", head, g.name, g.kv_heads);
  const std::uint32_t idx = token / g.tokens_per_page;
  if (idx >= p.pages.size()) fail("token = {}: page {} of a table of {} pages", token, idx, p.pages.size());
  const PageId id = p.pages[idx];
  if (id == kNullPage) fail("token = {}: its page is the null page", token);
  row = std::uint64_t{token % g.tokens_per_page} * g.kv_heads + head;
  return p.arena + std::uint64_t{id} * p.layout->small_page_bytes(p.group);
}

// The scale of block `block` of `row` (1 without in-page scales).
std::uint64_t scale_index(const ElementFormat& f, std::uint64_t row, std::uint32_t elems, std::uint32_t block) {
  if (f.scale.granularity == ScaleGranularity::kPerBlock) return row * (elems / f.scale.block) + block;
  return row;
}

std::uint32_t block_of(const ElementFormat& f, std::uint32_t i) {
  return f.scale.granularity == ScaleGranularity::kPerBlock ? i / f.scale.block : 0;
}

// A scale for a block whose largest magnitude is `amax`, as the scale type can hold it.
std::uint32_t scale_code(const ElementFormat& f, double amax) {
  double s = amax / max_finite(f.type);
  if (!(s > 0)) s = 1.0;
  if (f.scale.type == ElementType::kE8M0)  // a power of two at least s, so no element saturates
    return static_cast<std::uint32_t>(std::clamp(static_cast<int>(std::ceil(std::log2(s))) + 127, 0, 254));
  std::uint32_t code = encode_element(f.scale.type, static_cast<float>(s));
  // A rounded-down scale would saturate the largest element: step up while it does.
  const std::uint64_t last = (std::uint64_t{1} << bits_of(f.scale.type)) - 1;  // fp32: 2^32 - 1
  while (decode_element(f.scale.type, code) * max_finite(f.type) < amax && code < last) ++code;
  return code;
}

}  // namespace

float max_finite(ElementType type) {
  switch (type) {
    case ElementType::kFp8E4M3:
      return 448.0f;
    case ElementType::kFp8E5M2:
      return 57344.0f;
    case ElementType::kInt8:
      return 127.0f;
    case ElementType::kInt4:
      return 7.0f;
    case ElementType::kFp4E2M1:
      return 6.0f;
    case ElementType::kBf16:
      return bf16_to_float(0x7f7f);
    case ElementType::kFp16:
      return 65504.0f;
    case ElementType::kFp32:
      return std::numeric_limits<float>::max();
    case ElementType::kE8M0:
      return static_cast<float>(pow2(127));
    default:
      untyped(type);
  }
}

float decode_element(ElementType type, std::uint32_t code) {
  switch (type) {
    case ElementType::kBf16:
      return bf16_to_float(static_cast<std::uint16_t>(code));
    case ElementType::kFp16:
      return f16_to_float(static_cast<std::uint16_t>(code));
    case ElementType::kFp32:
      return detail::as_float(code);
    case ElementType::kFp8E4M3:  // OCP e4m3fn: no infinities, S.1111.111 is NaN
      if (is_nan_or_inf(type, code)) return std::numeric_limits<float>::quiet_NaN();
      return static_cast<float>(minifloat(code & 0xffu, 4, 3, 7));
    case ElementType::kFp8E5M2:
      if (is_nan_or_inf(type, code))
        return (code & 3u) != 0 ? std::numeric_limits<float>::quiet_NaN()
                                : ((code & 0x80u) ? -std::numeric_limits<float>::infinity()
                                                  : std::numeric_limits<float>::infinity());
      return static_cast<float>(minifloat(code & 0xffu, 5, 2, 15));
    case ElementType::kInt8:
      return static_cast<float>(static_cast<std::int8_t>(code & 0xffu));
    case ElementType::kInt4:
      return static_cast<float>((code & 8u) ? static_cast<int>(code & 0xfu) - 16 : static_cast<int>(code & 0xfu));
    case ElementType::kFp4E2M1:
      return static_cast<float>(minifloat(code & 0xfu, 2, 1, 1));
    case ElementType::kE8M0:
      if (is_nan_or_inf(type, code)) return std::numeric_limits<float>::quiet_NaN();
      return static_cast<float>(pow2(static_cast<int>(code & 0xffu) - 127));
    default:
      untyped(type);
  }
}

std::uint32_t encode_element(ElementType type, float value) {
  switch (type) {
    case ElementType::kBf16:
      return float_to_bf16(value);
    case ElementType::kFp16:
      return float_to_f16(value);
    case ElementType::kFp32:
      return detail::as_u32(value);
    case ElementType::kInt8:
    case ElementType::kInt4: {
      const double m = max_finite(type);
      const double r = std::clamp(std::nearbyint(static_cast<double>(value)), -m - 1, m);  // ties to even
      const auto v = static_cast<int>(r);
      return static_cast<std::uint32_t>(v) & (type == ElementType::kInt8 ? 0xffu : 0xfu);
    }
    case ElementType::kFp8E4M3:
    case ElementType::kFp8E5M2:
    case ElementType::kFp4E2M1:
    case ElementType::kE8M0: {
      // Nearest finite code (ties to the even code) after saturating: 2^bits candidates.
      const double m = max_finite(type);
      const double x = std::clamp(static_cast<double>(value), type == ElementType::kE8M0 ? 0.0 : -m, m);
      std::uint32_t best = 0;
      double best_err = std::numeric_limits<double>::infinity();
      for (std::uint32_t c = 0; c < (1u << bits_of(type)); ++c) {
        if (is_nan_or_inf(type, c)) continue;
        const double err = std::abs(static_cast<double>(decode_element(type, c)) - x);
        if (err < best_err || (err == best_err && (c & 1u) == 0 && (best & 1u) != 0)) {
          best = c;
          best_err = err;
        }
      }
      return best;
    }
    default:
      untyped(type);
  }
}

namespace cpu {

void write_row(const FormattedPages& p, std::uint32_t token, std::uint32_t head, bool v, const float* values) {
  std::uint64_t row = 0;
  std::byte* page = page_of(p, token, head, row);
  for (const Side& s : sides_of(p, v)) {
    const ElementFormat& f = s.format;
    const std::uint32_t bits = f.bits();
    std::byte* data = page + p.layout->part(p.group, p.layer, s.data).offset;
    std::byte* scales = page + p.layout->part(p.group, p.layer, s.scale).offset;
    const std::uint32_t blocks = f.scale.granularity == ScaleGranularity::kPerBlock ? s.elems / f.scale.block : 1;
    for (std::uint32_t b = 0; b < blocks; ++b) {
      const std::uint32_t lo = b * (s.elems / blocks), hi = lo + s.elems / blocks;
      double scale = s.tensor_scale;
      if (f.scale.in_pages()) {
        double amax = 0;
        for (std::uint32_t i = lo; i < hi; ++i) amax = std::max(amax, std::abs(static_cast<double>(values[i])));
        const std::uint32_t code = scale_code(f, amax);
        store_code(scales, scale_index(f, row, s.elems, b), bits_of(f.scale.type), code);
        scale = decode_element(f.scale.type, code);
      }
      for (std::uint32_t i = lo; i < hi; ++i)
        store_code(data, row * s.elems + i, bits, encode_element(f.type, static_cast<float>(values[i] / scale)));
    }
    values += s.elems;
  }
}

void read_row(const FormattedPages& p, std::uint32_t token, std::uint32_t head, bool v, float* out) {
  std::uint64_t row = 0;
  const std::byte* page = page_of(p, token, head, row);
  for (const Side& s : sides_of(p, v)) {
    const ElementFormat& f = s.format;
    const std::byte* data = page + p.layout->part(p.group, p.layer, s.data).offset;
    const std::byte* scales = page + p.layout->part(p.group, p.layer, s.scale).offset;
    for (std::uint32_t i = 0; i < s.elems; ++i) {
      double scale = s.tensor_scale;
      if (f.scale.in_pages())
        scale = decode_element(f.scale.type,
                               load_code(scales, scale_index(f, row, s.elems, block_of(f, i)), bits_of(f.scale.type)));
      out[i] = static_cast<float>(decode_element(f.type, load_code(data, row * s.elems + i, f.bits())) * scale);
    }
    out += s.elems;
  }
}

void formatted_decode_attention(const FormattedDecode& p) {
  if (p.cache.layout == nullptr || p.q == nullptr || p.out == nullptr || p.cache.arena == nullptr)
    fail("formatted_decode_attention: layout, arena, q and out must be set");
  const LayerGroup& g = p.cache.layout->group(p.cache.group);
  if (p.q_heads == 0 || g.kv_heads == 0 || p.q_heads % g.kv_heads != 0)
    fail("q_heads = {}: must be a positive multiple of the group's kv_heads {}", p.q_heads, g.kv_heads);
  if (p.kv_len == 0) fail("kv_len = 0: decode attends to at least one token");
  const std::uint32_t k_dim = g.head_dim + (g.storage == KvStorage::kLatent ? g.rope_dim : 0);
  const std::uint32_t v_dim = g.head_dim;
  const std::uint32_t group = p.q_heads / g.kv_heads;
  std::vector<float> k(k_dim), v(v_dim);
  std::vector<double> logits(p.kv_len);
  std::vector<double> acc(v_dim);
  for (std::uint32_t h = 0; h < p.q_heads; ++h) {
    const std::uint32_t kvh = h / group;
    const float* q = p.q + std::uint64_t{h} * k_dim;
    double m = -std::numeric_limits<double>::infinity();
    for (std::uint32_t t = 0; t < p.kv_len; ++t) {
      read_row(p.cache, t, kvh, false, k.data());
      double dot = 0;
      for (std::uint32_t i = 0; i < k_dim; ++i) dot += static_cast<double>(q[i]) * k[i];
      logits[t] = dot * p.scale;
      m = std::max(m, logits[t]);
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    double l = 0;
    for (std::uint32_t t = 0; t < p.kv_len; ++t) {
      const double w = std::exp(logits[t] - m);
      l += w;
      read_row(p.cache, t, kvh, true, v.data());
      for (std::uint32_t i = 0; i < v_dim; ++i) acc[i] += w * v[i];
    }
    for (std::uint32_t i = 0; i < v_dim; ++i) p.out[std::uint64_t{h} * v_dim + i] = static_cast<float>(acc[i] / l);
  }
}

}  // namespace cpu

}  // namespace kvmm::kernels
