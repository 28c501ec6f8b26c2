// KVOrder: the order of (token, kv head) inside one layer's K (or V) region of a page or a
// contiguous slot; the region's size is the same in both orders, only the order inside
// differs. One enum shared by the layout planner (LayerGroup::kv_order, which the layout
// fingerprint covers) and the kernels (kvmm::kernels::KVOrder is this type; the strides are
// kvmm/kernels/addressing.hpp's kv_strides). A one-byte enum; nothing here costs anything.
// Also compiled by nvcc in C++17 mode.
#pragma once

#include <cstdint>

namespace kvmm {

//   kTokenMajor (NHD, the default): [tokens][kv_heads][head_dim]. A token's K row for all
//     heads is contiguous (what write_kv appends in one piece); a kernel working on one kv
//     head reads head_dim x 2 bytes out of every kv_heads x head_dim x 2 byte row (256 B of
//     2 KiB at 8 kv heads, D 128): many DRAM rows opened for a little each.
//   kHeadMajor (HND, TensorRT-LLM's and FlashInfer's kv_layout="HND"): [kv_heads][tokens]
//     [head_dim]. One head's tokens of a page are one contiguous run (a 16-token page tile
//     at D 128 is 4 KiB), as torch SDPA reads [batch, head, token, dim]; write_kv scatters a
//     token's heads to kv_heads places instead of one. Read by the default decode and
//     prefill, the tensor-core decode and mma.sync prefill, and the CPU references; the
//     sm_90a (TMA) prefill refuses it. The formatted-page reference (quantized and MLA
//     formats) reads token-major pages only, so LayerGroup::validate refuses a head-major
//     group with element formats.
enum class KVOrder : std::uint8_t { kTokenMajor, kHeadMajor };

// "token_major", "head_major"; "?" for a value out of range.
inline constexpr const char* to_string(KVOrder order) {
  return order == KVOrder::kTokenMajor ? "token_major" : order == KVOrder::kHeadMajor ? "head_major" : "?";
}

}  // namespace kvmm
