// Paged (and contiguous) decode attention on tensor cores (issue 36), one source for sm_80
// and sm_90. One CTA = (request, kv head, up to 16 q heads of its group, split piece), 4
// warps. The q heads of the group are the 16 rows of mma.m16n8k16 (rows past the group
// are zero); each warp takes every 4th 16-token tile of the piece:
//   K and V rows of the tile -> shared memory by 16-byte cp.async (zero fill for null
//   pages and tokens past the piece), a ring of kStages stages per warp, rows swizzled
//   by the 128-byte XOR rule so that ldmatrix reads them conflict-free;
//   S = Q K^T: A = Q (registers, loaded once), B = K through ldmatrix (K rows [token][d]
//   are B's column-major layout), 2 n-tiles x D/16 k-steps;
//   the online softmax on the C fragments (a lane holds rows g and g+8, 4 tokens each;
//   row max and sum over the quad by two xor shuffles), base 2, masked tokens at -inf;
//   O += P V: P re-packed to T in registers as the A operand (two 16x8 C tiles are one
//   16x16 A tile), V through ldmatrix.trans, D/8 n-tiles.
// The warps' states merge through shared memory (reusing the ring) at the end; split
// pieces are written as today's kernel writes them (merge_kernel combines them).
// Page rows are addressed with a multiply-shift division by tokens_per_page (FastDiv),
// never a hardware division. Costs per 16 tokens and warp at D 128: 48 HMMA, 32 LDSM,
// 16 LDGSTS.128 and the softmax; shared memory kWarps x kStages x 2 x 16 x D x 2 bytes.
#pragma once

#include "attention.cuh"
#include "tensor_core.cuh"

#include <cmath>

namespace kvmm::kernels::device {

inline constexpr int kTcWarps = 4;
inline constexpr int kTcThreads = 32 * kTcWarps;
inline constexpr int kTcTile = 16;   // tokens per warp tile (the mma's K of P.V)
inline constexpr int kTcStages = 2;  // cp.async ring depth per warp
inline constexpr int kTcRows = 16;   // q heads per CTA (the mma's M)

// n / d for n < 2^32 and 1 <= d < 2^32 by one 64-bit high multiply: m = floor(2^64 / d) + 1
// (d > 1); the error n (m - 2^64/d) / 2^64 < 2^-32 <= 1/d never crosses an integer.
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

// Paged addressing for the tensor-core kernel: as PagedAddr, the page entry by FastDiv.
struct TcPagedAddr {
  const char* k;
  const char* v;
  std::uint64_t page_stride;
  std::uint32_t row_bytes;
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

// Whether every 16-token tile of `kv` lies in one page (picks kTileInPage).
inline bool tc_tile_in_page(const TcPagedAddr& kv) { return kv.tpp.d % kTcTile == 0; }
inline bool tc_tile_in_page(const ContiguousAddr&) { return true; }

// Byte offset of 16-byte chunk c of row r in a swizzled [16][D] tile (rows of D * 2 bytes):
// within each 128-byte span of a row, chunk (c % 8) is stored at (c % 8) ^ (r % 8).
template <int D>
__device__ __forceinline__ std::uint32_t tc_swz(std::uint32_t r, std::uint32_t c) {
  return r * (D * 2) + (((c & ~7u) | ((c & 7u) ^ (r & 7u))) * 16);
}

template <int D>
inline constexpr std::uint32_t tc_smem_bytes() {
  const std::uint32_t ring = kTcWarps * kTcStages * 2 * kTcTile * D * 2;
  const std::uint32_t merge = kTcWarps * kTcRows * (D + 2) * 4;
  return ring > merge ? ring : merge;
}

// kTileInPage: every 16-token tile (tiles start at multiples of 16) lies in one page or
// slot (tokens_per_page a multiple of 16, or contiguous): one page entry per tile, rows at
// base + row x row_bytes; else each row finds its page.
template <typename T, int D, typename Addr, bool kTileInPage>
__global__ void __launch_bounds__(kTcThreads, 3) tc_decode_kernel(AttnArgs a, Addr kv) {
  static_assert(D == 64 || D == 128 || D == 256);
  constexpr int kChunks = D / 8;                    // 16-byte chunks per K/V row
  constexpr int kPerLane = kTcTile * kChunks / 32;  // cp.async per lane per tile, K and V each
  constexpr int kNd = D / 8;                        // n-tiles of O
  constexpr std::uint32_t kTileBytes = kTcTile * D * 2;
#if defined(KVMM_SIMT_HOST)
  unsigned char* smem = simt::dynamic_shared(tc_smem_bytes<D>());
#else
  extern __shared__ __align__(128) unsigned char tc_smem[];
  unsigned char* smem = tc_smem;
#endif
  const std::uint32_t b = blockIdx.x;
  const std::uint32_t h = blockIdx.y / a.head_chunks;
  const std::uint32_t g0 = (blockIdx.y % a.head_chunks) * kTcRows;
  const std::uint32_t hg = min(static_cast<std::uint32_t>(kTcRows), a.group - g0);
  const std::uint32_t qh0 = h * a.group + g0;
  const std::uint32_t kv_len = __ldg(a.kv_lens + b);
  const KeyRange all = kv_len > 0 ? key_range(a.mask, a.window, a.chunk, kv_len - 1) : KeyRange{0, 0};
  const KeyRange piece = all.lo < all.hi ? split_range(all, blockIdx.z, a.num_splits) : KeyRange{0, 0};

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int gid = lane / 4, tig = lane % 4;

  // Q as the A operand of each k-step: rows gid and gid + 8 (q heads), columns 16 s + 2 tig.
  std::uint32_t qa[D / 16][4];
  KVMM_UNROLL
  for (int s = 0; s < D / 16; ++s) {
    KVMM_UNROLL
    for (int i = 0; i < 4; ++i) {
      const std::uint32_t row = gid + ((i & 1) ? 8u : 0u);
      const std::uint32_t col = 16 * s + 2 * tig + ((i & 2) ? 8 : 0);
      // Every lane loads (rows past the group read row 0, then zero): one warp request.
      const std::uint32_t w = ldg(reinterpret_cast<const std::uint32_t*>(
          a.q + (std::uint64_t{b} * a.q_heads + qh0 + (row < hg ? row : 0u)) * D + col));
      qa[s][i] = row < hg ? w : 0u;
    }
  }

  const typename Addr::Row r = kv.row(b);
  const std::uint64_t head_off = std::uint64_t{h} * D * 2;
  // Tiles start at multiples of 16 from below piece.lo; rows outside the piece are copied
  // with source size 0 (no bytes read) and masked.
  const std::uint32_t first = piece.lo / kTcTile * kTcTile;
  const std::uint32_t tiles = piece.hi > first ? (piece.hi - first + kTcTile - 1) / kTcTile : 0u;
  unsigned char* ring = smem + warp * kTcStages * 2 * kTileBytes;

  // Issues the cp.async of tile `t` (this warp's) into stage `st`; tiles past the end
  // issue nothing but still form a group, so the wait counts stay uniform. With
  // kTileInPage the tile's page entry is read once here; bit `st` of `null_stages` says
  // whether the tile lies in a null page (nothing copied, the tile skipped).
  std::uint32_t null_stages = 0;
  auto issue = [&](std::uint32_t t, int st) {
    if (t < tiles) {
      unsigned char* ks = ring + st * 2 * kTileBytes;
      unsigned char* vs = ks + kTileBytes;
      const std::uint32_t tok0 = first + t * kTcTile;
      long long tile_off = 0;
      if constexpr (kTileInPage) {
        tile_off = kv.offset(r, tok0);  // one page entry per tile
        null_stages = (null_stages & ~(1u << st)) | (tile_off < 0 ? 1u << st : 0u);
      }
      if (tile_off < 0) {  // a whole null tile (kTileInPage): nothing to copy
        cp_async_commit();
        return;
      }
      if constexpr (kTileInPage) {
        // Rows r_lo .. r_hi - 1 of the tile lie in the piece; the others are copied with
        // source size 0 from an address inside the same page (nothing is read).
        const char* kb = kv.k + tile_off + head_off;
        const char* vb = kv.v + tile_off + head_off;
        const std::uint32_t r_lo = piece.lo > tok0 ? piece.lo - tok0 : 0u;
        const std::uint32_t r_hi = min(static_cast<std::uint32_t>(kTcTile), piece.hi - tok0);
        KVMM_UNROLL
        for (int j = 0; j < kPerLane; ++j) {
          const std::uint32_t id = static_cast<std::uint32_t>(lane + 32 * j);
          const std::uint32_t row = id / kChunks, c = id % kChunks;
          const std::uint32_t src = row >= r_lo && row < r_hi ? 16u : 0u;
          const std::uint32_t o = row * kv.row_bytes + c * 16;  // < 16 rows x 2^27 bytes
          cp_async<16>(ks + tc_swz<D>(row, c), kb + o, src);
          cp_async<16>(vs + tc_swz<D>(row, c), vb + o, src);
        }
      } else {
        KVMM_UNROLL
        for (int j = 0; j < kPerLane; ++j) {
          const std::uint32_t id = static_cast<std::uint32_t>(lane + 32 * j);
          const std::uint32_t row = id / kChunks, c = id % kChunks;
          const std::uint32_t tok = tok0 + row;
          const bool in = tok >= piece.lo && tok < piece.hi;
          // Every lane looks up (clamped into the piece): one warp request per row group.
          long long off = kv.offset(r, min(tok, piece.hi - 1));
          if (!in) off = -1;
          const std::uint32_t src = off >= 0 ? 16u : 0u;
          const std::uint64_t g = off >= 0 ? static_cast<std::uint64_t>(off) + head_off + c * 16 : 0;
          cp_async<16>(ks + tc_swz<D>(row, c), kv.k + g, src);
          cp_async<16>(vs + tc_swz<D>(row, c), kv.v + g, src);
        }
      }
    }
    cp_async_commit();
  };

  float o[kNd][4];
  KVMM_UNROLL
  for (int n = 0; n < kNd; ++n) KVMM_UNROLL
  for (int i = 0; i < 4; ++i) o[n][i] = 0.0f;
  SoftmaxState<float> st[2] = {{-INFINITY, 0.0f}, {-INFINITY, 0.0f}};  // rows gid, gid + 8

  const std::uint32_t my_tiles = tiles > static_cast<std::uint32_t>(warp)
                                     ? (tiles - static_cast<std::uint32_t>(warp) + kTcWarps - 1) / kTcWarps
                                     : 0u;
  KVMM_UNROLL
  for (int p = 0; p < kTcStages - 1; ++p) issue(static_cast<std::uint32_t>(warp + p * kTcWarps), p);
  for (std::uint32_t it = 0; it < my_tiles; ++it) {
    const std::uint32_t t = static_cast<std::uint32_t>(warp) + it * kTcWarps;
    issue(t + (kTcStages - 1) * kTcWarps, static_cast<int>((it + kTcStages - 1) % kTcStages));
    cp_async_wait<kTcStages - 1>();
    __syncwarp();
    const int stage = static_cast<int>(it % kTcStages);
    if (kTileInPage && ((null_stages >> stage) & 1u) != 0) continue;  // a null tile: all masked
    const unsigned char* ks = ring + (it % kTcStages) * 2 * kTileBytes;
    const unsigned char* vs = ks + kTileBytes;

    // S = Q K^T over two n-tiles of 8 tokens.
    float s[2][4];
    KVMM_UNROLL
    for (int nt = 0; nt < 2; ++nt) {
      KVMM_UNROLL
      for (int i = 0; i < 4; ++i) s[nt][i] = 0.0f;
      KVMM_UNROLL
      for (int ks2 = 0; ks2 < D / 16; ++ks2) {
        // Lanes 0-7: rows (tokens) 8 nt + 0..7 at chunk 2 ks2; lanes 8-15: chunk 2 ks2 + 1.
        const std::uint32_t row = static_cast<std::uint32_t>(8 * nt + (lane & 7));
        const std::uint32_t c = static_cast<std::uint32_t>(2 * ks2 + ((lane >> 3) & 1));
        std::uint32_t kb[2];
        ldmatrix<2, false>(kb, ks + tc_swz<D>(row, c));
        mma_16816<T>(s[nt], qa[ks2], kb, s[nt]);
      }
    }
    // Scale, soft cap, mask: this lane's columns are tokens 8 nt + 2 tig + (i & 1).
    const std::uint32_t tok0 = first + t * kTcTile;
    const bool full = kTileInPage && tok0 >= piece.lo && tok0 + kTcTile <= piece.hi;  // no column masked
    float mx[2] = {st[0].m, st[1].m};
    KVMM_UNROLL
    for (int nt = 0; nt < 2; ++nt) KVMM_UNROLL
    for (int i = 0; i < 4; ++i) {
      const std::uint32_t tok = tok0 + 8 * nt + 2 * tig + (i & 1);
      bool ok = full || (tok >= piece.lo && tok < piece.hi);
      if constexpr (!kTileInPage) ok = kv.offset(r, min(tok, piece.hi - 1)) >= 0 && ok;  // every lane looks up
      const float dot = s[nt][i];
#if defined(KVMM_CENSUS_NO_SOFT_CAP)
      constexpr bool soft_cap = false;  // census builds: the benchmarks' path, without the tanh branch
#else
      const bool soft_cap = a.soft_cap;
#endif
      const float logit = soft_cap ? a.cap_log2 * tanhf(dot * a.scale_div_cap) : dot * a.scale_log2;
      s[nt][i] = ok ? logit : -INFINITY;
      mx[i >> 1] = fmaxf(mx[i >> 1], s[nt][i]);
    }
    float sum[2] = {0.0f, 0.0f};
    KVMM_UNROLL
    for (int h2 = 0; h2 < 2; ++h2) {
      mx[h2] = fmaxf(mx[h2], __shfl_xor_sync(0xffffffffu, mx[h2], 1));
      mx[h2] = fmaxf(mx[h2], __shfl_xor_sync(0xffffffffu, mx[h2], 2));
    }
    KVMM_UNROLL
    for (int nt = 0; nt < 2; ++nt) KVMM_UNROLL
    for (int i = 0; i < 4; ++i) {
      const float m = mx[i >> 1];
      s[nt][i] = m == -INFINITY ? 0.0f : exp2f(s[nt][i] - m);
      sum[i >> 1] += s[nt][i];
    }
    float corr[2];
    KVMM_UNROLL
    for (int h2 = 0; h2 < 2; ++h2) {
      sum[h2] += __shfl_xor_sync(0xffffffffu, sum[h2], 1);
      sum[h2] += __shfl_xor_sync(0xffffffffu, sum[h2], 2);
      corr[h2] = mx[h2] == -INFINITY ? 1.0f : softmax_absorb(st[h2], mx[h2], sum[h2], Exp2{});
    }
    // P (16 x 16 tokens) as the A operand: C tile nt holds k = 8 nt .. 8 nt + 7. P is
    // split into its T-rounded part and the T-rounded remainder (two products), so the
    // weights carry about 16 bits, not T's 8 or 11: the output stays within a few units
    // of roundoff of the exact softmax (one rounded P alone gives 10-15).
    std::uint32_t pa[4], pl[4];
    KVMM_UNROLL
    for (int j = 0; j < 4; ++j) {
      const float x0 = s[j >> 1][2 * (j & 1)], x1 = s[j >> 1][2 * (j & 1) + 1];
      pa[j] = pack2<T>(x0, x1);
      pl[j] = pack2<T>(x0 - T::lo(pa[j]), x1 - T::hi(pa[j]));
    }
    // Rescale O only when some row's maximum moved (corr is exactly 1 otherwise): after
    // the first tiles it rarely does.
    if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
      KVMM_UNROLL
      for (int n = 0; n < kNd; ++n) {
        o[n][0] *= corr[0];
        o[n][1] *= corr[0];
        o[n][2] *= corr[1];
        o[n][3] *= corr[1];
      }
    }
    KVMM_UNROLL
    for (int n = 0; n < kNd; ++n) {
      // V tile rows (tokens) 0-7 from lanes 0-7, 8-15 from lanes 8-15, chunk n; transposed.
      const std::uint32_t row = static_cast<std::uint32_t>(lane & 15);
      std::uint32_t vb[2];
      ldmatrix<2, true>(vb, vs + tc_swz<D>(row, static_cast<std::uint32_t>(n)));
      mma_16816<T>(o[n], pa, vb, o[n]);
      mma_16816<T>(o[n], pl, vb, o[n]);
    }
    __syncwarp();  // every lane read this stage before it is refilled
  }
  cp_async_wait<0>();
  __syncthreads();

  // Merge the warps' states: per warp and row m, l and the O row, in the freed ring.
  float* mw = reinterpret_cast<float*>(smem);  // [warps][16]
  float* lw = mw + kTcWarps * kTcRows;         // [warps][16]
  float* ow = lw + kTcWarps * kTcRows;         // [warps][16][D]
  if (tig == 0) {
    mw[warp * kTcRows + gid] = st[0].m;
    mw[warp * kTcRows + gid + 8] = st[1].m;
    lw[warp * kTcRows + gid] = st[0].l;
    lw[warp * kTcRows + gid + 8] = st[1].l;
  }
  KVMM_UNROLL
  for (int n = 0; n < kNd; ++n) {
    KVMM_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int row = gid + ((i & 2) ? 8 : 0), col = 8 * n + 2 * tig + (i & 1);
      ow[(warp * kTcRows + row) * D + col] = o[n][i];
    }
  }
  __syncthreads();
  const int ng = static_cast<int>(hg);
  for (int idx = static_cast<int>(threadIdx.x); idx < ng * D; idx += kTcThreads) {
    const int row = idx / D, d = idx % D;
    float big_m = -INFINITY;
    KVMM_UNROLL
    for (int w = 0; w < kTcWarps; ++w) big_m = fmaxf(big_m, mw[w * kTcRows + row]);
    float big_l = 0.0f, out = 0.0f;
    if (big_m != -INFINITY) {
      KVMM_UNROLL
      for (int w = 0; w < kTcWarps; ++w) {
        const SoftmaxState<float> sw{mw[w * kTcRows + row], lw[w * kTcRows + row]};
        const float wt = softmax_weight(sw, big_m, Exp2{});
        big_l = fmaf(sw.l, wt, big_l);
        out = fmaf(ow[(w * kTcRows + row) * D + d], wt, out);
      }
    }
    const float value = big_l > 0.0f ? out / big_l : 0.0f;
    const std::uint64_t head = std::uint64_t{b} * a.q_heads + qh0 + static_cast<std::uint32_t>(row);
    if (a.num_splits == 1) {
      a.o[head * D + d] = T::from_float(value);
    } else {
      a.ws_o[(head * a.num_splits + blockIdx.z) * D + d] = value;
      if (d == 0) a.ws_lse[head * a.num_splits + blockIdx.z] = big_l > 0.0f ? big_m + log2f(big_l) : -INFINITY;
    }
  }
}

}  // namespace kvmm::kernels::device
