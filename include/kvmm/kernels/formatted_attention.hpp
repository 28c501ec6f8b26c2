// CPU reference over pages of any LayerGroup format (issue 32 item 5): K and V stored as
// bf16, fp16, fp32, fp8 e4m3 / e5m2, int8, int4 or fp4 e2m1, with scales per tensor, per
// token-head or per block (inline or in the page's scale region), found through
// KVLayout::part; an MLA group's latent read as K (latent + rope) and as V (its first
// kv_lora_rank elements). write_row quantizes a row into its page (what a cache-write kernel
// does), read_row dequantizes one, formatted_decode_attention runs decode attention for one
// request over its page table. Plain C++, double accumulation; O(kv_len x heads x head_dim).
// GPU kernels for these formats are not here.
#pragma once

#include "kvmm/spec/kv_layout.hpp"
#include "kvmm/types.hpp"

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvmm::kernels {

// One element type's code <-> float (round to nearest, ties to even; saturating at the
// type's largest finite value). Types without a fixed meaning (kRaw8/16/32) raise.
float decode_element(ElementType type, std::uint32_t code);
std::uint32_t encode_element(ElementType type, float value);
// The largest finite value of a type (e4m3: 448, e5m2: 57344, int8: 127, int4: 7, e2m1: 6).
float max_finite(ElementType type);

// One request's pages of one layer of one group.
struct FormattedPages {
  const KVLayout* layout = nullptr;
  GroupId group = 0;
  std::uint32_t layer = 0;
  std::byte* arena = nullptr;          // small page p at arena + p * small_page_bytes(group)
  std::span<const PageId> pages = {};  // the request's page table, in token order
  float k_tensor_scale = 1.0f;         // per-tensor scales (ScaleGranularity::kPerTensor)
  float v_tensor_scale = 1.0f;
};

namespace cpu {

// Row `token` (position in the request), kv head `head` of the K side (`v` false) or the V
// side: K has head_dim (+ rope_dim for a latent) elements, V head_dim. `values` / `out` hold
// that many floats. write_row computes the row's scales from its largest magnitude (per
// token-head or per block) and stores data and scales; read_row inverts it. kvmm::Error
// for a page past the table, a head or layer out of range, an element type without a
// meaning (a plain group's dtype_bytes), or V of an indexer group.
void write_row(const FormattedPages& p, std::uint32_t token, std::uint32_t head, bool v, const float* values);
void read_row(const FormattedPages& p, std::uint32_t token, std::uint32_t head, bool v, float* out);

// Decode attention of one query row over tokens [0, kv_len): q is [q_heads, k_dim]
// (k_dim: head_dim, + rope_dim for a latent, which keeps one KV head), out is
// [q_heads, head_dim]; q head h reads kv head h / (q_heads / kv_heads).
struct FormattedDecode {
  FormattedPages cache;
  std::uint32_t kv_len = 0;
  std::uint32_t q_heads = 0;
  const float* q = nullptr;
  double scale = 1.0;
  float* out = nullptr;
};
void formatted_decode_attention(const FormattedDecode& p);

}  // namespace cpu

}  // namespace kvmm::kernels
