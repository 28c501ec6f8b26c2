// Paged (and contiguous) prefill attention on tensor cores (issue 37), FA2-class, one
// source for sm_80 and sm_90 (the Hopper fallback). One CTA = (Q tile, kv head, head
// chunk, split piece), 4 warps. The Q tile is 64 packed rows: tq tokens of one request x
// hc q heads of the kv head's group (hc = min(group, 64), tq = 64 / hc), so every K/V row
// loaded serves the whole group; warp w owns rows 16 w .. 16 w + 15 (the mma's M) over the
// CTA's whole key range, so no cross-warp merge is needed. Per 64-token KV tile:
//   K and V rows -> shared memory by 16-byte cp.async from all 128 threads, two stages
//   (tile i + 1 is issued, page ids looked up, while tile i is computed), rows swizzled
//   by the 128-byte XOR rule (tc_swz) so that ldmatrix reads are conflict-free; null
//   pages and rows outside the piece are zero-filled (source size 0) and masked;
//   S = Q K^T: A = Q in registers (loaded once), B = K by ldmatrix.x4 (two n-tiles per
//   load), 8 n-tiles x D/16 k-steps; the online softmax on the C fragments (quad
//   shuffles), base 2; P re-packed in registers as the A operand of O += P V, V by
//   ldmatrix.x4.trans; O normalised once at the end.
// Masks: the CTA walks the union of its rows' key ranges (causal/window/chunked; its split
// piece); a warp skips tiles none of its rows sees, and masks elements only on tiles not
// wholly visible to all its rows or holding null pages. Ragged q_indptr: request b's Q
// tiles are virtual CTA indices q_indptr[b] / tq + b + j (at most `batch` idle CTAs).
// kSplitP: P is applied as its T-rounded part plus the T-rounded remainder (two P.V
// products, as the decode kernel), keeping the output within a few units of roundoff of
// the exact softmax; without it P is rounded once (FA2's numerics, 1.5x fewer HMMA).
// Costs per 64-token tile and warp at D 128: 64 HMMA (S) + 64 (P.V, 128 with kSplitP),
// 32 + 32 LDSM.x4, 16 LDGSTS.128 per thread; shared memory 2 x 2 x 64 x D x 2 bytes.
#pragma once

#include "tc_decode.cuh"  // FastDiv, TcPagedAddr, tc_swz, the mma/ldmatrix wrappers

namespace kvmm::kernels::device {

inline constexpr int kPfWarps = 4;
inline constexpr int kPfThreads = 32 * kPfWarps;
inline constexpr int kPfRows = 16 * kPfWarps;  // packed rows per Q tile
inline constexpr int kPfTile = 64;             // tokens per KV tile
inline constexpr int kPfStages = 2;

// Whether every 64-token KV tile lies in one page (one page entry per tile).
inline bool pf_tile_in_page(const TcPagedAddr& kv) { return kv.tpp.d % kPfTile == 0; }
inline bool pf_tile_in_page(const ContiguousAddr&) { return true; }

// q heads per CTA (hc) and tokens per Q tile (tq) for a group.
inline constexpr std::uint32_t pf_heads(std::uint32_t group) { return group < kPfRows ? group : kPfRows; }
inline constexpr std::uint32_t pf_tokens(std::uint32_t group) { return kPfRows / pf_heads(group); }
// CTAs along x: an upper bound of the Q tiles of a batch (virtual tile indices).
inline std::uint32_t pf_grid_x(std::uint32_t rows, std::uint32_t batch, std::uint32_t group) {
  return rows / pf_tokens(group) + batch;
}

// The kernel's arguments from make_args' (attention_dispatch.cuh): head chunks of hc
// heads, tq tokens per Q tile (in rows_per_cta).
inline AttnArgs pf_args(AttnArgs a) {
  a.head_chunks = (a.group + pf_heads(a.group) - 1) / pf_heads(a.group);
  a.rows_per_cta = pf_tokens(a.group);
  return a;
}

template <int D>
inline constexpr std::uint32_t pf_smem_bytes() {
  // K/V stages, the row offsets of the next two tiles (8 bytes each), per-row null flags
  return kPfStages * 2 * kPfTile * D * 2 + kPfStages * kPfTile * 8 + kPfStages * kPfTile + kPfWarps * 16;
}

template <typename T, int D, typename Addr, bool kTileInPage, bool kSplitP>
__global__ void __launch_bounds__(kPfThreads, 2) tc_prefill_kernel(AttnArgs a, Addr kv) {
  static_assert(D == 64 || D == 128);
  constexpr int kChunks = D / 8;                              // 16-byte chunks per K/V row
  constexpr int kPerThread = kPfTile * kChunks / kPfThreads;  // cp.async per thread per tile, K and V each
  constexpr int kNd = D / 8;                                  // n-tiles of O
  constexpr std::uint32_t kTileBytes = kPfTile * D * 2;
#if defined(KVMM_SIMT_HOST)
  unsigned char* smem = simt::dynamic_shared(pf_smem_bytes<D>());
#else
  extern __shared__ __align__(128) unsigned char pf_smem[];
  unsigned char* smem = pf_smem;
#endif
  // [slot][row]: byte offset of a tile's row (head 0), -1 in a null page, -2 outside the piece
  long long* rowoff = reinterpret_cast<long long*>(smem + kPfStages * 2 * kTileBytes);
  unsigned char* flags = reinterpret_cast<unsigned char*>(rowoff + kPfStages * kPfTile);  // [stage][row]: null page

  // The request and Q tile of this CTA: the largest b with q_indptr[b] / tq + b <= x.
  const std::uint32_t tq = a.rows_per_cta;
  const std::uint32_t x = blockIdx.x;
  std::uint32_t lo = 0, hi = a.batch;
  while (hi - lo > 1) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (__ldg(a.q_indptr + mid) / tq + mid <= x)
      lo = mid;
    else
      hi = mid;
  }
  const std::uint32_t b = lo;
  const std::uint32_t q_begin = __ldg(a.q_indptr + b);
  const std::uint32_t q_len = __ldg(a.q_indptr + b + 1) - q_begin;
  const std::uint32_t t0 = (x - (q_begin / tq + b)) * tq;  // first token of the tile in the request
  if (t0 >= q_len) return;                                 // whole CTA: an idle virtual tile
  const std::uint32_t ntok = min(tq, q_len - t0);
  const std::uint32_t kv_len = __ldg(a.kv_lens + b);
  const std::uint32_t hc = min(a.group, static_cast<std::uint32_t>(kPfRows));
  const std::uint32_t h = blockIdx.y / a.head_chunks;
  const std::uint32_t g0 = (blockIdx.y % a.head_chunks) * hc;
  const std::uint32_t hg = min(hc, a.group - g0);
  const std::uint32_t qh0 = h * a.group + g0;
  const bool fits = q_len <= kv_len;             // else no row sees a key (outputs 0, as the references)
  const std::uint32_t p0 = kv_len - q_len + t0;  // position of the tile's first token
  const KeyRange all = fits ? KeyRange{key_range(a.mask, a.window, a.chunk, p0).lo,
                                       key_range(a.mask, a.window, a.chunk, p0 + ntok - 1).hi}
                            : KeyRange{0, 0};
  const KeyRange piece = all.lo < all.hi ? split_range(all, blockIdx.z, a.num_splits) : KeyRange{0, 0};

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int gid = lane / 4, tig = lane % 4;

  // This lane's rows gid and gid + 8 of the warp: token, head, key range within the piece.
  std::uint32_t rtok[2], rhead[2];
  bool rvalid[2];
  KeyRange rk[2];
  std::uint32_t wlo = 0xffffffffu, whi = 0, flo = 0, fhi = 0xffffffffu;  // warp union / all-visible
  KVMM_UNROLL
  for (int k = 0; k < 2; ++k) {
    const std::uint32_t m = static_cast<std::uint32_t>(16 * warp + gid + 8 * k);
    rtok[k] = m / hc;
    rhead[k] = m % hc;
    rvalid[k] = rtok[k] < ntok && rhead[k] < hg;
    rk[k] = KeyRange{0, 0};
    if (rvalid[k] && fits) {
      const KeyRange r = key_range(a.mask, a.window, a.chunk, p0 + rtok[k]);
      rk[k] = KeyRange{max(r.lo, piece.lo), min(r.hi, piece.hi)};
    }
    if (rvalid[k]) {
      wlo = min(wlo, rk[k].lo);
      whi = max(whi, rk[k].hi);
      flo = max(flo, rk[k].lo);
      fhi = min(fhi, rk[k].hi);
    }
  }
  KVMM_UNROLL
  for (int off = 1; off < 32; off <<= 1) {
    wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, off));
    whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, off));
    flo = max(flo, __shfl_xor_sync(0xffffffffu, flo, off));
    fhi = min(fhi, __shfl_xor_sync(0xffffffffu, fhi, off));
  }
  // Kept in shared memory, read once per tile: four fewer registers live through the loop.
  std::uint32_t* wr = reinterpret_cast<std::uint32_t*>(flags + kPfStages * kPfTile) + 4 * warp;
  if (lane == 0) {
    wr[0] = wlo;
    wr[1] = whi;
    wr[2] = flo;
    wr[3] = fhi;
  }
  __syncwarp();

  // Q as the A operand of each k-step: rows gid and gid + 8, columns 16 s + 2 tig (+8).
  std::uint32_t qa[D / 16][4];
  KVMM_UNROLL
  for (int s = 0; s < D / 16; ++s) {
    KVMM_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int k = i & 1;
      const std::uint32_t col = 16 * s + 2 * tig + ((i & 2) ? 8 : 0);
      const std::uint64_t head =
          std::uint64_t{q_begin + t0 + (rvalid[k] ? rtok[k] : 0u)} * a.q_heads + qh0 + (rvalid[k] ? rhead[k] : 0u);
      const std::uint32_t w = ldg(reinterpret_cast<const std::uint32_t*>(a.q + head * D + col));
      qa[s][i] = rvalid[k] ? w : 0u;
    }
  }

  const typename Addr::Row r = kv.row(b);
  const std::uint64_t head_off = std::uint64_t{h} * D * 2;
  const std::uint32_t first = piece.lo / kPfTile * kPfTile;
  const std::uint32_t tiles = piece.hi > first ? (piece.hi - first + kPfTile - 1) / kPfTile : 0u;

  // Without kTileInPage the page entries of tile t are looked up a tile ahead, one row per
  // thread of warps 0-1, into rowoff slot t % 2 (read by issue(t) after a barrier).
  auto lookup = [&](std::uint32_t t) {
    if constexpr (!kTileInPage) {
      if (t < tiles && threadIdx.x < static_cast<unsigned>(kPfTile)) {
        const std::uint32_t tok = first + t * kPfTile + threadIdx.x;
        const bool in = tok >= piece.lo && tok < piece.hi;
        const long long off = kv.offset(r, min(tok, piece.hi - 1));  // every lane looks up: one warp request
        rowoff[(t % kPfStages) * kPfTile + threadIdx.x] = in ? off : -2;
      }
    }
  };
  // Issues the cp.async of KV tile `t` into stage `st` (all threads) and writes its rows'
  // null flags; a tile past the end issues nothing but still forms a group.
  auto issue = [&](std::uint32_t t, int st) {
    if (t < tiles) {
      unsigned char* ks = smem + st * 2 * kTileBytes;
      unsigned char* vs = ks + kTileBytes;
      const std::uint32_t tok0 = first + t * kPfTile;
      long long tile_off = 0;
      if constexpr (kTileInPage) tile_off = kv.offset(r, tok0);  // one page entry per tile
      // This thread copies chunk c of rows r0 + kStep j: the swizzle term is the same for
      // every j (kStep is a multiple of 8), so the addresses advance by constant strides.
      constexpr std::uint32_t kStep = kPfThreads / kChunks;
      const std::uint32_t r0 = threadIdx.x / kChunks, c = threadIdx.x % kChunks;
      const std::uint32_t s0 = tc_swz<D>(r0, c);
#if !defined(KVMM_SIMT_HOST)
#pragma unroll 2  // not fully: hoisted per-row addresses would cost registers the mma fragments need
#endif
      for (int j = 0; j < kPerThread; ++j) {
        const std::uint32_t row = r0 + kStep * j;
        long long off;
        if constexpr (kTileInPage) {
          const std::uint32_t tok = tok0 + row;
          off = tok < piece.lo || tok >= piece.hi ? -2
                : tile_off < 0                    ? -1
                                                  : tile_off + static_cast<long long>(row) * kv.row_bytes;
        } else {
          off = rowoff[(t % kPfStages) * kPfTile + row];
        }
        const bool copy = off >= 0;
        const std::uint64_t g = copy ? static_cast<std::uint64_t>(off) + head_off + c * 16 : 0;
        const std::uint32_t so = s0 + kStep * j * D * 2;
        cp_async<16>(ks + so, kv.k + g, copy ? 16u : 0u);
        cp_async<16>(vs + so, kv.v + g, copy ? 16u : 0u);
        if (c == 0) flags[st * kPfTile + row] = off == -1 ? 1 : 0;
      }
    }
    cp_async_commit();
  };

  float o[kNd][4];
  KVMM_UNROLL
  for (int n = 0; n < kNd; ++n) KVMM_UNROLL
  for (int i = 0; i < 4; ++i) o[n][i] = 0.0f;
  SoftmaxState<float> st[2] = {{-INFINITY, 0.0f}, {-INFINITY, 0.0f}};  // rows gid, gid + 8 (log2 units)
  float mraw[2] = {-INFINITY, -INFINITY};                              // their maxima before scaling
#if defined(KVMM_CENSUS_NO_SOFT_CAP)
  constexpr bool soft_cap = false;  // census builds: the benchmarks' path, without the tanh branch
#else
  const bool soft_cap = a.soft_cap;
#endif
  const float sc = soft_cap ? 1.0f : a.scale_log2;  // raw logit -> log2 units

  lookup(0);
  if constexpr (!kTileInPage) __syncthreads();
  issue(0, 0);
  lookup(1);
  for (std::uint32_t it = 0; it < tiles; ++it) {
    cp_async_wait<0>();
    __syncthreads();  // tile `it` landed for every thread; every warp is done with tile it - 1
    issue(it + 1, static_cast<int>((it + 1) % kPfStages));
    lookup(it + 2);  // its slot was last read by issue(it), before the barrier
    const std::uint32_t tok0 = first + it * kPfTile;
    if (tok0 >= wr[1] || tok0 + kPfTile <= wr[0]) continue;  // none of this warp's rows sees the tile
    const int stage = static_cast<int>(it % kPfStages);
    const unsigned char* ks = smem + stage * 2 * kTileBytes;
    const unsigned char* vs = ks + kTileBytes;
    const unsigned char* fl = flags + stage * kPfTile;
    const bool n0 = fl[lane] != 0, n1 = fl[lane + 32] != 0;
    if (!__any_sync(0xffffffffu, !(n0 && n1))) continue;  // a whole null tile
    const bool nulls = __any_sync(0xffffffffu, n0 || n1);
    const bool full = !nulls && tok0 >= wr[2] && tok0 + kPfTile <= wr[3];  // no element masked

    // S = Q K^T: 8 n-tiles of 8 tokens; ldmatrix.x4 gives two n-tiles' B fragments.
    float s[8][4];
    KVMM_UNROLL
    for (int nt = 0; nt < 8; ++nt) KVMM_UNROLL
    for (int i = 0; i < 4; ++i) s[nt][i] = 0.0f;
    KVMM_UNROLL
    for (int kst = 0; kst < D / 16; ++kst) {
      KVMM_UNROLL
      for (int np = 0; np < 4; ++np) {
        // Lanes 8m .. 8m + 7 address matrix m: tokens 8 (2 np + m / 2) + 0..7, chunk 2 kst + m % 2.
        const std::uint32_t row = static_cast<std::uint32_t>(8 * (2 * np + (lane >> 4)) + (lane & 7));
        const std::uint32_t c = static_cast<std::uint32_t>(2 * kst + ((lane >> 3) & 1));
        std::uint32_t kb[4];
        ldmatrix<4, false>(kb, ks + tc_swz<D>(row, c));
        const std::uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
        mma_16816<T>(s[2 * np], qa[kst], b0, s[2 * np]);
        mma_16816<T>(s[2 * np + 1], qa[kst], b1, s[2 * np + 1]);
      }
    }
    // Soft cap and mask: this lane's columns are tokens 8 nt + 2 tig + (i & 1), rows i >> 1.
    // Without a soft cap the scale is applied inside the exponent (one FFMA, FA2's trick):
    // the maximum is taken over raw dots (scale > 0 keeps the order).
    float mx[2] = {mraw[0], mraw[1]};
    if (soft_cap) {
      KVMM_UNROLL
      for (int nt = 0; nt < 8; ++nt) KVMM_UNROLL
      for (int i = 0; i < 4; ++i) s[nt][i] = a.cap_log2 * tanhf(s[nt][i] * a.scale_div_cap);
    }
    if (!full) {  // a boundary tile (its own block, so full tiles run none of it)
      KVMM_UNROLL
      for (int nt = 0; nt < 8; ++nt) KVMM_UNROLL
      for (int i = 0; i < 4; ++i) {
        const std::uint32_t col = static_cast<std::uint32_t>(8 * nt + 2 * tig + (i & 1));
        const std::uint32_t tok = tok0 + col;
        const KeyRange& kr = rk[i >> 1];
        if (tok < kr.lo || tok >= kr.hi || fl[col] != 0) s[nt][i] = -INFINITY;
      }
    }
    KVMM_UNROLL
    for (int nt = 0; nt < 8; ++nt) KVMM_UNROLL
    for (int i = 0; i < 4; ++i) mx[i >> 1] = fmaxf(mx[i >> 1], s[nt][i]);
    KVMM_UNROLL
    for (int k = 0; k < 2; ++k) {
      mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 1));
      mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 2));
    }
    const float msc[2] = {mx[0] * sc, mx[1] * sc};  // the maxima in log2 units
    float sum[2] = {0.0f, 0.0f};
    KVMM_UNROLL
    for (int nt = 0; nt < 8; ++nt) KVMM_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int k = i >> 1;
      s[nt][i] = mx[k] == -INFINITY ? 0.0f : exp2f(fmaf(s[nt][i], sc, -msc[k]));
      sum[k] += s[nt][i];
    }
    float corr[2];
    KVMM_UNROLL
    for (int k = 0; k < 2; ++k) {
      sum[k] += __shfl_xor_sync(0xffffffffu, sum[k], 1);
      sum[k] += __shfl_xor_sync(0xffffffffu, sum[k], 2);
      corr[k] = mx[k] == -INFINITY ? 1.0f : softmax_absorb(st[k], msc[k], sum[k], Exp2{});
      mraw[k] = mx[k];
    }
    if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
      KVMM_UNROLL
      for (int n = 0; n < kNd; ++n) {
        o[n][0] *= corr[0];
        o[n][1] *= corr[0];
        o[n][2] *= corr[1];
        o[n][3] *= corr[1];
      }
    }
    // O += P V over 4 k-steps of 16 tokens: C tiles 2 kk and 2 kk + 1 form P's A fragment.
    KVMM_UNROLL
    for (int kk = 0; kk < 4; ++kk) {
      std::uint32_t pa[4], pl[4];
      KVMM_UNROLL
      for (int j = 0; j < 4; ++j) {
        const float x0 = s[2 * kk + (j >> 1)][2 * (j & 1)], x1 = s[2 * kk + (j >> 1)][2 * (j & 1) + 1];
        pa[j] = pack2<T>(x0, x1);
        if constexpr (kSplitP) pl[j] = pack2<T>(x0 - T::lo(pa[j]), x1 - T::hi(pa[j]));
      }
      KVMM_UNROLL
      for (int np = 0; np < kNd / 2; ++np) {
        // Lanes 0-15: tokens 16 kk + 0..15 at chunk 2 np; lanes 16-31: chunk 2 np + 1; transposed.
        const std::uint32_t row = static_cast<std::uint32_t>(16 * kk + (lane & 15));
        const std::uint32_t c = static_cast<std::uint32_t>(2 * np + (lane >> 4));
        std::uint32_t vb[4];
        ldmatrix<4, true>(vb, vs + tc_swz<D>(row, c));
        const std::uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
        mma_16816<T>(o[2 * np], pa, b0, o[2 * np]);
        mma_16816<T>(o[2 * np + 1], pa, b1, o[2 * np + 1]);
        if constexpr (kSplitP) {
          mma_16816<T>(o[2 * np], pl, b0, o[2 * np]);
          mma_16816<T>(o[2 * np + 1], pl, b1, o[2 * np + 1]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // O normalised once; each lane writes its two rows' columns 8 n + 2 tig, + 1.
  KVMM_UNROLL
  for (int k = 0; k < 2; ++k) {
    // The row's token and head, recomputed (fewer registers live through the loop).
    const std::uint32_t m = static_cast<std::uint32_t>(16 * warp + gid + 8 * k);
    const std::uint32_t tk = m / hc, hd = m % hc;
    if (tk >= ntok || hd >= hg) continue;
    const std::uint64_t head = std::uint64_t{q_begin + t0 + tk} * a.q_heads + qh0 + hd;
    const float inv = st[k].l > 0.0f ? 1.0f / st[k].l : 0.0f;
    if (a.num_splits == 1) {
      KVMM_UNROLL
      for (int n = 0; n < kNd; ++n) {
        const std::uint32_t col = static_cast<std::uint32_t>(8 * n + 2 * tig);
        *reinterpret_cast<std::uint32_t*>(a.o + head * D + col) = pack2<T>(o[n][2 * k] * inv, o[n][2 * k + 1] * inv);
      }
    } else {
      float* wo = a.ws_o + (head * a.num_splits + blockIdx.z) * D;
      KVMM_UNROLL
      for (int n = 0; n < kNd; ++n) {
        const std::uint32_t col = static_cast<std::uint32_t>(8 * n + 2 * tig);
        wo[col] = o[n][2 * k] * inv;
        wo[col + 1] = o[n][2 * k + 1] * inv;
      }
      if (tig == 0) a.ws_lse[head * a.num_splits + blockIdx.z] = st[k].l > 0.0f ? st[k].m + log2f(st[k].l) : -INFINITY;
    }
  }
}

}  // namespace kvmm::kernels::device
