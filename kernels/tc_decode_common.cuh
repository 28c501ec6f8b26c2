// The shared pieces of the tensor-core decode (tc_decode.cuh, tc_decode_swap.cuh): CTA
// shape, the multiply-shift page division (FastDiv), paged addressing with the page entry
// read a tile ahead, the 128-byte swizzle and the stage lane map, the softmax's exp2, a
// compile-time loop, and the choice between the 16-row and swapped-operand forms. Device
// helpers only; O(1) each.
#pragma once

#include "attention.cuh"
#include "tensor_core.cuh"

#include <cmath>
#include <type_traits>
#include <utility>

namespace kvmm::kernels::device {

inline constexpr int kTcWarps = 4;
inline constexpr int kTcThreads = 32 * kTcWarps;
inline constexpr int kTcTile = 16;   // tokens per warp tile (the mma's K of P.V)
inline constexpr int kTcStages = 2;  // cp.async ring depth per warp
inline constexpr int kTcRows = 16;   // q heads per CTA (the mma's M)

// n / d for n < 2^32 and 1 <= d < 2^32 by one 64-bit high multiply: m =
// floor(2^64 / d) + 1 (d > 1); the error n (m - 2^64/d) / 2^64 < 2^-32 <= 1/d
// never crosses an integer.
struct FastDiv {
  std::uint32_t d;
  std::uint64_t m;
  static FastDiv make(std::uint32_t d) {
    return FastDiv{d,
                   d > 1 ? ~std::uint64_t{0} / d + 1 : 0};  // (2^64 - 1) / d + 1 = floor(2^64 / d) + 1 unless d | 2^64
  }
  __host__ __device__ __forceinline__ std::uint32_t div(std::uint32_t n) const {
    if (d == 1) return n;
#if defined(KVMM_SIMT_HOST) || !defined(__CUDA_ARCH__)
    const std::uint64_t lo = std::uint64_t{n} * (m & 0xffffffffu), hi = std::uint64_t{n} * (m >> 32);
    return static_cast<std::uint32_t>((hi + (lo >> 32)) >> 32);
#else
    return static_cast<std::uint32_t>(__umul64hi(n, m));
#endif
  }
};

// Paged addressing for the tensor-core kernel: as PagedAddr, the page entry by
// FastDiv; row_bytes is the token stride of the cache's order, kv head h head_stride x h
// further (kv_strides; the kernels form h x head_stride once per CTA).
struct TcPagedAddr {
  const char* k;
  const char* v;
  std::uint64_t page_stride;
  std::uint32_t row_bytes;
  std::uint32_t head_stride;
  const std::uint32_t* indptr;
  const std::uint32_t* pages;
  std::uint32_t dense_stride;
  FastDiv tpp;

  struct Row {
    const std::uint32_t* pages;
  };
  __device__ __forceinline__ Row row(std::uint32_t b) const {
    return Row{indptr != nullptr ? pages + __ldg(indptr + b) : pages + std::uint64_t{b} * dense_stride};
  }
  __device__ __forceinline__ long long offset(const Row& r, std::uint32_t tok) const {
    const std::uint32_t entry = tpp.div(tok);
    const std::uint32_t page = ldg(r.pages + entry);
    return page_row_offset(page, tok - entry * tpp.d, page_stride, row_bytes);
  }
};

// The tensor-core addressing of a launch's paged cache (host; contiguous caches take
// contiguous_addr, attention.cuh).
inline TcPagedAddr tc_paged_addr(const PagedAttentionParams& p) {
  const KVStrides st = kv_strides(p.cache);
  return TcPagedAddr{static_cast<const char*>(p.cache.k),
                     static_cast<const char*>(p.cache.v),
                     p.cache.page_stride_bytes,
                     static_cast<std::uint32_t>(st.token),
                     static_cast<std::uint32_t>(st.head),
                     p.table.indptr,
                     p.table.pages,
                     p.table.dense_stride,
                     FastDiv::make(p.cache.tokens_per_page)};
}

// Whether every 16-token tile of `kv` lies in one page (picks kTileInPage).
inline bool tc_tile_in_page(const TcPagedAddr& kv) { return kv.tpp.d % kTcTile == 0; }
inline bool tc_tile_in_page(const ContiguousAddr&) { return true; }

// A row's page entry read ahead of its use (tc_pre), and the row's byte offset from it
// (tc_off, -1 for a null page): the page id of the next tile a warp copies is loaded one
// tile early, so the copy never waits on it. Contiguous caches read nothing ahead.
struct TcPre {
  std::uint32_t page;  // paged: the page id; contiguous: unused
  std::uint32_t row;   // paged: the row in the page; contiguous: the position
};
__device__ __forceinline__ TcPre tc_pre(const TcPagedAddr& kv, const TcPagedAddr::Row& r, std::uint32_t tok) {
  const std::uint32_t entry = kv.tpp.div(tok);
  return TcPre{ldg(r.pages + entry), tok - entry * kv.tpp.d};
}
__device__ __forceinline__ long long tc_off(const TcPagedAddr& kv, const TcPagedAddr::Row&, TcPre p) {
  return page_row_offset(p.page, p.row, kv.page_stride, kv.row_bytes);
}
__device__ __forceinline__ TcPre tc_pre(const ContiguousAddr&, const ContiguousAddr::Row&, std::uint32_t tok) {
  return TcPre{0u, tok};
}
__device__ __forceinline__ long long tc_off(const ContiguousAddr& kv, const ContiguousAddr::Row& r, TcPre p) {
  return kv.offset(r, p.row);
}

// Whether the launchers run the swapped-operand form (kSwap): groups of at most 8 q heads
// (the N of the products) at head dims 64 and 128.
inline bool tc_swap(const AttnArgs& a, std::uint32_t head_dim) { return a.group <= 8 && head_dim <= 128; }

// The swapped form's sub-tiles per warp tile (kSub) that the launchers run: at 2 stages
// 32-token warp tiles at head dim 128 and 64-token ones at 64 (one softmax, rescale and
// wait per 4 sub-tiles: 0.03 main-loop instructions per K/V byte, not 0.044 with 2); one
// 16-token tile at 3 and 4 stages.
constexpr int tc_sub(int head_dim, int stages) { return stages == 2 ? (head_dim == 64 ? 4 : 2) : 1; }

// f(std::integral_constant<int, i>{}) for i = 0 .. N - 1, in order.
template <int N, typename F, int... I>
__device__ __forceinline__ void static_for_impl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, typename F>
__device__ __forceinline__ void static_for(F&& f) {
  static_for_impl<N>(f, std::make_integer_sequence<int, N>{});
}

// Byte offset of 16-byte chunk c of row r in a swizzled [16][D] tile (rows of D
// * 2 bytes): within each 128-byte span of a row, chunk (c % 8) is stored at (c
// % 8) ^ (r % 8).
template <int D>
__device__ __forceinline__ std::uint32_t tc_swz(std::uint32_t r, std::uint32_t c) {
  return r * (D * 2) + (((c & ~7u) | ((c & 7u) ^ (r & 7u))) * 16);
}

// The per-lane offset q (0-3) of the stage lane map: row `row` (0-15), chunk 2
// j + hb for every j with j % 4 == q, at tc_swz<D>(row, 2 j + hb) = (offset q)
// + 128 (j / 4): the XOR of (2 j + hb) % 8 with row % 8 is (hb ^ row % 8) ^ 2
// (j % 4), and a row's span starts at a multiple of 128 bytes.
template <int D>
__host__ __device__ __forceinline__ std::uint32_t tc_lane_offset(std::uint32_t row, std::uint32_t hb, int q) {
  return (row * (D * 2) + ((hb ^ (row & 7u)) << 4)) ^ (static_cast<std::uint32_t>(q) << 5);
}

// x + y by an add the compiler cannot move out of a loop (the device's IADD, recomputed where
// it stands instead of held in a register).
__device__ __forceinline__ std::uint32_t tc_opaque_add(std::uint32_t x, std::uint32_t y) {
#if defined(KVMM_SIMT_HOST) || !defined(__CUDA_ARCH__)
  return x + y;
#else
  std::uint32_t r;
  asm volatile("add.u32 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(y));
  return r;
#endif
}

// Chunk 2 j + hb of this lane's row in a stage at `base` (j a compile-time
// constant after unrolling: one register plus an immediate).
template <typename P>
__device__ __forceinline__ P* tc_at(P* base, const std::uint32_t (&soff)[4], int j) {
  return base + soff[j & 3] + 128 * (j >> 2);
}

// pack2<T> (tensor_core.cuh) as one cvt.rn.{bf16x2,f16x2}.f32 on the device: the same
// round-to-nearest-even of each half in one instruction per pair (nvcc emits two
// conversions and a permute for pack2 when the packed word is unpacked again, as the split
// P's remainder does).
template <typename T>
__device__ __forceinline__ std::uint32_t tc_pack2(float lo, float hi) {
#if defined(KVMM_SIMT_HOST) || !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 800
  return pack2<T>(lo, hi);
#else
  std::uint32_t w;
  if constexpr (std::is_same_v<T, BFloat>)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
  return w;
#endif
}

// 2^x for the softmax weights: ex2.approx.ftz on the device (results below
// 2^-126 flush to 0, weights that small vanish beside the row maximum's 1),
// exp2f in the emulation.
__device__ __forceinline__ float tc_exp2(float x) {
#if defined(KVMM_SIMT_HOST) || !defined(__CUDA_ARCH__)
  return exp2f(x);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}
struct TcExp2 {
  __device__ __forceinline__ float operator()(float x) const { return tc_exp2(x); }
};

// Where the lanes' sector-map slots start (16 bytes per thread, tc_decode_body): after the
// ring, Q (16-row form) and, kSub 4, per warp the 16-byte slots of the sub-tiles' offsets
// (kSpread) or 64 8-byte row offsets (kRowSpread).
template <int D, int kStages, bool kSwap, int kSub>
inline constexpr std::uint32_t tc_sect_at() {
  return kTcWarps * kStages * 2 * kSub * kTcTile * D * 2 + (kSwap ? 0 : kTcRows * D * 2) +
         (kSub == 4 ? kTcWarps * kTcTile * kSub * 8 : 0);
}

// Whether a decode instance copies K/V by the sector lane map (each half-warp of a K/V
// cp.async request copies whole 32-byte sectors: 16 L1 sectors per request, not the plain
// map's 24; the same bits; tc_decode_body): all but the 16-row form at 3 stages, which the
// map's per-tile LDS and adds push past 128 registers on sm_80 (an 8-byte frame, nvcc 13.0;
// docs/kernels.md). There the plain map (kTcProbePlainMap) stays.
template <int kStages, bool kSwap>
inline constexpr bool tc_sector_map() {
  return kSwap || kStages != 3;
}

// The decode's dynamic shared memory (tc_decode.cuh): ring, Q, kSub 4's slots, the sector
// map's slots; or the warps' merge, whichever is larger.
template <int D, int kStages = kTcStages, bool kSwap = false, int kSub = 1>
inline constexpr std::uint32_t tc_smem_bytes() {
  const std::uint32_t ring = tc_sect_at<D, kStages, kSwap, kSub>() + kTcThreads * 16;
  const std::uint32_t merge = kTcWarps * kTcRows * (D + 2) * 4;
  return ring > merge ? ring : merge;
}

}  // namespace kvmm::kernels::device
