// The geometry and helpers shared by the tensor-core prefill kernels (issue 37): the
// mma.sync kernel's CTA shape, KV tile, stages and lazy-rescale bounds (tc_prefill.cuh,
// 16 and 32 rows per warp), the packed-GQA Q tile (heads x tokens per CTA) and the ragged
// batch's virtual Q tiles (pf_args, pf_grid_x, pf_find_tile, also used by the sm_90a
// kernel, hopper_prefill.cuh), the swizzled ldmatrix offsets' step, the shared-memory
// budget. Constants and O(1) device helpers; pf_find_tile: a binary search over the batch
// (log2(batch) loads per CTA, once).
#pragma once

#include "tc_decode_common.cuh"  // FastDiv, TcPagedAddr, tc_swz, tc_exp2, the mma/ldmatrix wrappers

#include <cstdint>

namespace kvmm::kernels::device {

inline constexpr int kPfWarps = 4;
inline constexpr int kPfThreads = 32 * kPfWarps;
inline constexpr int kPfRows = 16 * kPfWarps;  // packed rows per Q tile at one m-tile per warp
inline constexpr int kPfTile = 64;             // tokens per KV tile
inline constexpr int kPfStages = 2;
inline constexpr int kPfSlots = 4;  // page-entry and null-flag slots: tile t's are slot t % 4
// Lazy rescale (FA4): a row's reference maximum moves only when a tile's maximum passes it
// by more than this (log2 units), so P's weights stay below 2^8 (no overflow in fp32 O and
// the sum; bf16/fp16 P keeps its relative precision) and O is rescaled only on such jumps.
inline constexpr float kPfLazy = 8.0f;
// The steady state's check: a lane's part of a row's sum over a tile (16 weights at most)
// at most 2^kPfLazy bounds each weight by it, so the row's reference holds; over it, the
// warp takes the rare path (the maxima, then the rule above).
inline constexpr float kPfLazyBound = 256.0f;

// Whether every 64-token KV tile lies in one page (one page entry per tile).
inline bool pf_tile_in_page(const TcPagedAddr& kv) { return kv.tpp.d % kPfTile == 0; }
inline bool pf_tile_in_page(const ContiguousAddr&) { return true; }

// q heads per CTA (hc) and tokens per Q tile (tq) for a group, at `rows` packed rows per
// Q tile (kPfRows x kMt).
inline constexpr std::uint32_t pf_heads(std::uint32_t group, std::uint32_t rows = kPfRows) {
  return group < rows ? group : rows;
}
inline constexpr std::uint32_t pf_tokens(std::uint32_t group, std::uint32_t rows = kPfRows) {
  return rows / pf_heads(group, rows);
}
// CTAs along x: an upper bound of the Q tiles of a batch (virtual tile indices).
inline std::uint32_t pf_grid_x(std::uint32_t rows, std::uint32_t batch, std::uint32_t group,
                               std::uint32_t qrows = kPfRows) {
  return rows / pf_tokens(group, qrows) + batch;
}

// The kernel's arguments from make_args' (attention_dispatch.cuh): head chunks of hc
// heads, tq tokens per Q tile (in rows_per_cta).
inline AttnArgs pf_args(AttnArgs a, std::uint32_t qrows = kPfRows) {
  a.head_chunks = (a.group + pf_heads(a.group, qrows) - 1) / pf_heads(a.group, qrows);
  a.rows_per_cta = pf_tokens(a.group, qrows);
  return a;
}

// tc_swz<D>(row, c + 2 j) from off = tc_swz<D>(row, c), c in {0, 1}, 2 j < D / 8: chunk
// bits 4-6 of the offset take the XOR of 2 j mod 8 (c and 2 j share no bit), bit 7 (D
// 128: chunk 8 and up) is 0 in `off` (a row starts at a multiple of 128 bytes and c < 8),
// so one XOR per step; the row's other offsets (multiples of 16 rows) add as immediates.
// Bit 7 being 0, its XOR is an addition: steps j and j + 4 differ by an immediate (128),
// so a tile needs 4 XORed offsets per operand, not D / 16.
__host__ __device__ __forceinline__ std::uint32_t pf_swz_step(std::uint32_t off, int j) {
  return (off ^ (static_cast<std::uint32_t>(j & 3) << 5)) + (static_cast<std::uint32_t>(j >> 2) << 7);
}
// x, opaque to the compiler on the device (one MOV per use): offsets the main loop XORs
// are taken through it once per tile, so that the compiler does not hoist the D / 16
// XORed offsets out of the loop (registers it would then spill at 32 rows per warp).
__device__ __forceinline__ std::uint32_t pf_opaque(std::uint32_t x) {
#if !defined(KVMM_SIMT_HOST) && defined(__CUDA_ARCH__)
  asm volatile("mov.b32 %0, %0;" : "+r"(x));
#endif
  return x;
}

// The page lookup's inputs, kept in shared memory (read by warps 0-1 once per tile) rather
// than in registers live through the main loop: the request's page-table row, the kv
// head's byte offset in a K/V row, the piece's key range and first tile's first key.
template <typename Row>
struct PfLookup {
  Row r;
  std::uint64_t head_off;
  std::uint32_t lo, hi, first;
};

template <int D, int kMt = 1>
inline constexpr std::uint32_t pf_smem_bytes() {
  // K/V stages, Q (kMt 2), the row offsets of four tiles (8 bytes each), their per-row null
  // flags, the warps' key ranges, the rows' key ranges, the tile's first row and tokens,
  // the page lookup's inputs (PfLookup)
  return kPfStages * 2 * kPfTile * D * 2 + (kMt > 1 ? kPfRows * kMt * D * 2 : 0) + kPfSlots * kPfTile * 8 +
         kPfSlots * kPfTile + kPfWarps * 16 + kPfRows * kMt * 8 + 8 + 32;
}

// The request b of virtual Q tile x (ragged q_indptr: request b's tiles are x =
// q_indptr[b] / tq + b + j, tq = a.rows_per_cta tokens each), its rows and the tile's
// first token t0 in it (t0 >= q_len: an idle tile). A binary search over the batch.
struct PfTile {
  std::uint32_t b, q_begin, q_len, t0;
};
__device__ __forceinline__ PfTile pf_find_tile(const AttnArgs& a, std::uint32_t x) {
  const std::uint32_t tq = a.rows_per_cta;
  std::uint32_t lo = 0, hi = a.batch;
  while (hi - lo > 1) {  // the largest b with q_indptr[b] / tq + b <= x
    const std::uint32_t mid = (lo + hi) / 2;
    if (__ldg(a.q_indptr + mid) / tq + mid <= x)
      lo = mid;
    else
      hi = mid;
  }
  const std::uint32_t q_begin = __ldg(a.q_indptr + lo);
  return PfTile{lo, q_begin, __ldg(a.q_indptr + lo + 1) - q_begin, (x - (q_begin / tq + lo)) * tq};
}

}  // namespace kvmm::kernels::device
