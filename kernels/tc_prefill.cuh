// Paged (and contiguous) prefill attention on tensor cores (issue 37), FA2-class, one
// source for sm_80 and sm_90 (the Hopper fallback). One CTA = (Q tile, kv head, head
// chunk, split piece), 4 warps, kMt m-tiles of 16 rows per warp (1: the first kernel; 2:
// FA2's hdim-128 shape, each K/V fragment loaded by ldmatrix feeding two m-tiles). The Q
// tile is R = 64 kMt packed rows: tq tokens of one request x hc q heads of the kv head's
// group (hc = min(group, R), tq = R / hc), so every K/V row loaded serves the whole group;
// warp w owns rows 16 kMt w .. 16 kMt (w + 1) - 1 over the CTA's whole key range, so no
// cross-warp merge is needed. Q: in registers at kMt 1 (loaded once); at kMt 2 in shared
// memory (swizzled as the stages), read per k-step by ldmatrix.x4. Per 64-token KV tile:
//   K and V rows -> shared memory by 16-byte cp.async from all 128 threads, two stages
//   (tile i + 1 is issued, page ids looked up, while tile i is computed), rows swizzled
//   by the 128-byte XOR rule (tc_swz) so that ldmatrix reads are conflict-free; null
//   pages and rows outside the piece are zero-filled (source size 0) and masked;
//   S = Q K^T: A = Q, B = K by ldmatrix.x4 (two n-tiles per load), 8 n-tiles x D/16
//   k-steps x kMt m-tiles; the online softmax on the C fragments, base 2, ex2.approx
//   (tc_exp2), the scale folded into the exponent's FFMA, lazy references (FA4: moved
//   only when a maximum passes them by more than kPfLazy) and in the steady state no
//   maxima at all (the lanes' partial sums bound the weights; a rare path takes the
//   maxima, quad shuffles, and rescales O); P re-packed in registers as
//   the A operand of O += P V, V by ldmatrix.x4.trans; O normalised once at the end.
//   ldmatrix addresses: one XOR per k-step from the lane's offset (pf_swz_step).
// Masks: the CTA walks the union of its rows' key ranges (causal/window/chunked; its split
// piece); a warp skips tiles none of its rows sees, and masks elements only on tiles not
// wholly visible to all its rows or holding null pages. Ragged q_indptr: request b's Q
// tiles are virtual CTA indices q_indptr[b] / tq + b + j (at most `batch` idle CTAs).
// kSplitP: P is applied as its T-rounded part plus the T-rounded remainder (two P.V
// products, as the decode kernel), keeping the output within a few units of roundoff of
// the exact softmax; without it P is rounded once (FA2's numerics, 1.5x fewer HMMA).
// Costs per 64-token tile and warp at D 128: kMt x (64 HMMA (S) + 64 (P.V, 128 with
// kSplitP)), 32 + 32 LDSM.x4 (+ 16 for Q at kMt 2), 16 LDGSTS.128 per thread; shared
// memory 2 x 2 x 64 x D x 2 bytes (+ 64 kMt x D x 2 for Q at kMt 2).
// Geometry and helpers: tc_prefill_common.cuh. The launchers: kMt 1 in tc_prefill.cu; kMt 2
// (paged, D 128) in tc_prefill_m2.cu, compiled with ptxas -O1, under which it fits in 255
// registers without spills (at -O3 it spills).
#pragma once

#include "tc_prefill_common.cuh"  // kPf*, pf_* helpers, PfLookup, PfTile

namespace kvmm::kernels::device {

template <typename T, int D, typename Addr, bool kTileInPage, bool kSplitP, int kMt = 1>
__global__ void __launch_bounds__(kPfThreads, 2) tc_prefill_kernel(AttnArgs a, Addr kv) {
  static_assert(D == 64 || D == 128);
  static_assert(kMt == 1 || kMt == 2, "16 or 32 rows per warp");
  constexpr std::uint32_t kQRows = kPfRows * kMt;             // packed rows per Q tile
  constexpr int kRows = 2 * kMt;                              // rows per lane: gid, gid + 8 of each m-tile
  constexpr int kChunks = D / 8;                              // 16-byte chunks per K/V row
  constexpr int kPerThread = kPfTile * kChunks / kPfThreads;  // cp.async per thread per tile, K and V each
  constexpr int kNd = D / 8;                                  // n-tiles of O
  constexpr std::uint32_t kTileBytes = kPfTile * D * 2;
  // Tokens per online-softmax step: the whole tile. (Two steps of 32 tokens at 32 rows per
  // warp halve S's registers but add an O rescale per tile: 1,272 against 1,086 interior
  // instructions per tile, and ptxas -O1 fits the one-step form in 255 registers.)
  constexpr int kSubTok = kPfTile;
  constexpr int kSubs = kPfTile / kSubTok;
  constexpr int kNt = kSubTok / 8;  // n-tiles of S per step
  // The steady state without maxima (below): not in the 32-row instances with one page
  // entry per tile, where its rare path's second S pushes ptxas -O1 past 255 registers
  // (a stack frame, nvcc 13.0): they take the maxima on every tile.
  constexpr bool kSteady = !(kMt == 2 && kTileInPage);
#if defined(KVMM_SIMT_HOST)
  unsigned char* smem = simt::dynamic_shared(pf_smem_bytes<D, kMt>());
#else
  extern __shared__ __align__(128) unsigned char pf_smem[];
  unsigned char* smem = pf_smem;
#endif
  unsigned char* qs = smem + kPfStages * 2 * kTileBytes;  // Q at kMt 2: [row][D], swizzled
  // [slot][row] (row instance): byte offset of a tile's row at head h (a multiple of 16
  // bytes, as cp.async needs); 1 (offset 0, zero-filled, not read) in a null page or
  // outside the piece
  long long* rowoff = reinterpret_cast<long long*>(qs + (kMt > 1 ? kQRows * D * 2 : 0));
  unsigned char* flags = reinterpret_cast<unsigned char*>(rowoff + kPfSlots * kPfTile);  // [slot][row]: null page
  // [row]: the packed row's key range within the piece (read on boundary tiles only)
  KeyRange* rkey = reinterpret_cast<KeyRange*>(flags + kPfSlots * kPfTile + kPfWarps * 16);
  // The Q tile's first row (q_indptr[b] + t0) and token count, for the epilogue: kept here,
  // not in registers live through the loop.
  std::uint32_t* tile_meta = reinterpret_cast<std::uint32_t*>(rkey + kQRows);
  using Lookup = PfLookup<typename Addr::Row>;
  static_assert(sizeof(Lookup) <= 32);
  Lookup* lk = reinterpret_cast<Lookup*>(tile_meta + 2);

  // The request and Q tile of this CTA.
  const std::uint32_t tq = a.rows_per_cta;
  const PfTile tile = pf_find_tile(a, blockIdx.x);
  const std::uint32_t b = tile.b, q_begin = tile.q_begin, q_len = tile.q_len, t0 = tile.t0;
  if (t0 >= q_len) return;  // whole CTA: an idle virtual tile
  const std::uint32_t ntok = min(tq, q_len - t0);
  const std::uint32_t kv_len = __ldg(a.kv_lens + b);
  const std::uint32_t hc = min(a.group, kQRows);
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

  // This lane's rows (gid and gid + 8 of each m-tile): token, head, key range within the
  // piece; the ranges go to shared memory (read on boundary tiles only), the warp's union
  // and intersection too (read once per tile): fewer registers live through the loop.
  std::uint32_t wlo = 0xffffffffu, whi = 0, flo = 0, fhi = 0xffffffffu;  // warp union / all-visible
  KVMM_UNROLL
  for (int k = 0; k < kRows; ++k) {
    const std::uint32_t m = static_cast<std::uint32_t>(16 * kMt * warp + 16 * (k >> 1) + gid + 8 * (k & 1));
    const std::uint32_t tok = m / hc, hd = m % hc;
    const bool valid = tok < ntok && hd < hg;
    KeyRange rk{0, 0};
    if (valid && fits) {
      const KeyRange kr = key_range(a.mask, a.window, a.chunk, p0 + tok);
      rk = KeyRange{max(kr.lo, piece.lo), min(kr.hi, piece.hi)};
    }
    if (tig == 0) rkey[m] = rk;
    if (threadIdx.x == 0 && k == 0) {
      tile_meta[0] = q_begin + t0;
      tile_meta[1] = ntok;
    }
    if (valid) {
      wlo = min(wlo, rk.lo);
      whi = max(whi, rk.hi);
      flo = max(flo, rk.lo);
      fhi = min(fhi, rk.hi);
    }
  }
  KVMM_UNROLL
  for (int off = 1; off < 32; off <<= 1) {
    wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, off));
    whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, off));
    flo = max(flo, __shfl_xor_sync(0xffffffffu, flo, off));
    fhi = min(fhi, __shfl_xor_sync(0xffffffffu, fhi, off));
  }
  std::uint32_t* wr = reinterpret_cast<std::uint32_t*>(flags + kPfSlots * kPfTile) + 4 * warp;
  if (lane == 0) {
    wr[0] = wlo;
    wr[1] = whi;
    wr[2] = flo;
    wr[3] = fhi;
  }

  // Q, zero in rows past the tile's tokens or the group. kMt 1: as the A operand of each
  // k-step in registers (rows gid and gid + 8, columns 16 s + 2 tig (+8)). kMt 2: the CTA's
  // rows into shared memory in the stages' swizzled layout (one 4-byte load and store per
  // word), read per k-step by ldmatrix.x4 (rows 0-7 / 8-15 at chunk 2 s, then 2 s + 1:
  // a0 .. a3).
  auto q_word = [&](std::uint32_t m, std::uint32_t col) {
    const std::uint32_t tok = m / hc, hd = m % hc;
    const bool valid = tok < ntok && hd < hg;
    const std::uint64_t head = std::uint64_t{q_begin + t0 + (valid ? tok : 0u)} * a.q_heads + qh0 + (valid ? hd : 0u);
    const std::uint32_t w = ldg(reinterpret_cast<const std::uint32_t*>(a.q + head * D + col));
    return valid ? w : 0u;
  };
  std::uint32_t qa[kMt == 1 ? D / 16 : 1][4];
  if constexpr (kMt == 1) {
    KVMM_UNROLL
    for (int s = 0; s < D / 16; ++s) {
      KVMM_UNROLL
      for (int i = 0; i < 4; ++i)
        qa[s][i] = q_word(static_cast<std::uint32_t>(16 * warp + gid + 8 * (i & 1)),
                          static_cast<std::uint32_t>(16 * s + 2 * tig + ((i & 2) ? 8 : 0)));
    }
  } else {
    for (int idx = static_cast<int>(threadIdx.x); idx < static_cast<int>(kQRows) * D / 2; idx += kPfThreads) {
      const std::uint32_t m = static_cast<std::uint32_t>(idx / (D / 2)), w = static_cast<std::uint32_t>(idx % (D / 2));
      sts(reinterpret_cast<std::uint32_t*>(qs + tc_swz<D>(m, w / 4) + (w % 4) * 4), q_word(m, 2 * w));
    }
  }
  const typename Addr::Row r = kv.row(b);
  const std::uint64_t head_off = std::uint64_t{h} * kv.head_stride;  // kv_strides
  const std::uint32_t c16 = (threadIdx.x % kChunks) * 16;            // this thread's chunk in a K/V row, bytes
  const std::uint32_t first = piece.lo / kPfTile * kPfTile;
  const std::uint32_t tiles = piece.hi > first ? (piece.hi - first + kPfTile - 1) / kPfTile : 0u;
  if (threadIdx.x == 0) *lk = Lookup{r, head_off, piece.lo, piece.hi, first};
  __syncthreads();  // Q, the rows' ranges and the lookup's inputs stored

  // Without kTileInPage the page entries of tile t are looked up two tiles ahead (at
  // iteration t - 2), one row per thread of warps 0-1, into slot t % 4 of rowoff (read by
  // issue(t) at iteration t - 1) and of the rows' null flags (read while tile t is
  // computed); slot t % 4 was last used by tile t - 4, done before iteration t - 3 ended.
  // Its inputs are read from shared memory (lk, through an opaque pointer: not hoisted).
  auto lookup = [&](std::uint32_t t) {
    if constexpr (!kTileInPage) {
      if (t < tiles && threadIdx.x < static_cast<unsigned>(kPfTile)) {
        const Lookup* l = reinterpret_cast<const Lookup*>(
            smem + pf_opaque(static_cast<std::uint32_t>(reinterpret_cast<unsigned char*>(lk) - smem)));
        const std::uint32_t tok = l->first + t * kPfTile + threadIdx.x;
        const bool in = tok >= l->lo && tok < l->hi;
        const long long off = kv.offset(l->r, min(tok, l->hi - 1));  // every lane looks up: one warp request
        const std::uint32_t at = (t % kPfSlots) * kPfTile + threadIdx.x;
        rowoff[at] = in && off >= 0 ? static_cast<long long>(l->head_off) + off : 1;
        flags[at] = in && off < 0 ? 1 : 0;
      }
    }
  };
  // Issues the cp.async of KV tile `t` into stage `st` (all threads; with kTileInPage it
  // also writes the rows' null flags); a tile past the end issues nothing but still forms
  // a group.
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
      // Unrolled fully: the census then counts every copy instruction a tile runs (a
      // nested loop's body would be counted once), at no register cost at 16 rows per warp.
      KVMM_UNROLL
      for (int j = 0; j < kPerThread; ++j) {
        const std::uint32_t row = r0 + kStep * j;
        const std::uint32_t so = s0 + kStep * j * D * 2;
        if constexpr (kTileInPage) {
          const std::uint32_t tok = tok0 + row;
          const long long off = tok < piece.lo || tok >= piece.hi ? -2
                                : tile_off < 0                    ? -1
                                               : tile_off + static_cast<long long>(row) * kv.row_bytes;
          const bool copy = off >= 0;
          const std::uint64_t g = copy ? static_cast<std::uint64_t>(off) + head_off + c * 16 : 0;
          cp_async<16>(ks + so, kv.k + g, copy ? 16u : 0u);
          cp_async<16>(vs + so, kv.v + g, copy ? 16u : 0u);
          if (c == 0) flags[(t % kPfSlots) * kPfTile + row] = off == -1 ? 1 : 0;
        } else {
          // The looked-up entry: the row's offset (head added; a multiple of 16 bytes), or
          // 1: zero-filled from offset 0 (not read).
          const long long e = rowoff[(t % kPfSlots) * kPfTile + row];
          const std::uint32_t n = (e & 1) != 0 ? 0u : 16u;
          const std::uint64_t g = static_cast<std::uint64_t>(e & ~1ll) + c16;
          cp_async<16>(ks + so, kv.k + g, n);
          cp_async<16>(vs + so, kv.v + g, n);
        }
      }
    }
    cp_async_commit();
  };

  float o[kMt][kNd][4];
  KVMM_UNROLL
  for (int mt = 0; mt < kMt; ++mt) KVMM_UNROLL
  for (int n = 0; n < kNd; ++n) KVMM_UNROLL
  for (int i = 0; i < 4; ++i) o[mt][n][i] = 0.0f;
  // Row k: m-tile k / 2, row gid + 8 (k % 2); log2 units. A row with no key in the piece
  // (a padding row past the tile's tokens or the group, or an empty range) starts at
  // reference 0, not -inf: it never sends the warp to the rare path (its weights are 0 on
  // the boundary tiles that mask it, and it is on no other: every tile of the warp is a
  // boundary tile then, but for padding rows, whose Q is 0: weights 1 against 0).
  SoftmaxState<float> st[kRows];
  KVMM_UNROLL
  for (int k = 0; k < kRows; ++k) {
    const KeyRange rk = rkey[16 * kMt * warp + 16 * (k >> 1) + gid + 8 * (k & 1)];
    st[k] = SoftmaxState<float>{rk.lo < rk.hi ? -INFINITY : 0.0f, 0.0f};
  }
#if defined(KVMM_CENSUS_NO_SOFT_CAP)
  constexpr bool soft_cap = false;  // census builds: the benchmarks' path, without the tanh branch
#else
  const bool soft_cap = a.soft_cap;
#endif
  const float sc = soft_cap ? 1.0f : a.scale_log2;  // raw logit -> log2 units

  // The lanes' ldmatrix offsets at k-step (K, Q) or n-pair (V) 0 in a stage or the Q tile:
  // K rows 8 (lane / 16) + lane % 8 at chunk (lane / 8) % 2; Q rows 16 kMt warp + lane % 16
  // and V rows lane % 16 at chunk lane / 16.
  const std::uint32_t k_off =
      tc_swz<D>(static_cast<std::uint32_t>(8 * (lane >> 4) + (lane & 7)), static_cast<std::uint32_t>((lane >> 3) & 1));
  const std::uint32_t q_off =
      tc_swz<D>(static_cast<std::uint32_t>(16 * kMt * warp + (lane & 15)), static_cast<std::uint32_t>(lane >> 4));
  const std::uint32_t v_off = tc_swz<D>(static_cast<std::uint32_t>(lane & 15), static_cast<std::uint32_t>(lane >> 4));

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
    const std::uint32_t k_off_t = pf_opaque(k_off), q_off_t = pf_opaque(q_off), v_off_t = pf_opaque(v_off);
    const unsigned char* fl = flags + (it % kPfSlots) * kPfTile;
    const bool n0 = fl[lane] != 0, n1 = fl[lane + 32] != 0;
    if (!__any_sync(0xffffffffu, !(n0 && n1))) continue;  // a whole null tile
    const bool nulls = __any_sync(0xffffffffu, n0 || n1);
#if defined(KVMM_CENSUS_INTERIOR)
    constexpr bool full = true;  // census builds: an interior tile's path (no element masked)
    (void)nulls;
#else
    const bool full = !nulls && tok0 >= wr[2] && tok0 + kPfTile <= wr[3];  // no element masked
#endif

    // The tile in kSubs sub-tiles of kSubTok tokens (one at 16 rows per warp; two of 32 at
    // 32 rows per warp, so that S (kMt x kNt x 4 floats) and P stay small beside O's 128
    // registers), each an online-softmax step: S, its softmax, P packed, O rescaled, O +=
    // P V over the sub-tile's rows of V.
    KVMM_UNROLL
    for (int u = 0; u < kSubs; ++u) {
      // S = Q K^T: kNt n-tiles of 8 tokens; ldmatrix.x4 gives two n-tiles' B fragments,
      // each used by kMt m-tiles; then the soft cap and the element mask. A lambda: the
      // rare path below computes S again (its registers die in P's packing).
      float s[kMt][kNt][4];
      auto scores = [&] {
        KVMM_UNROLL
        for (int mt = 0; mt < kMt; ++mt) KVMM_UNROLL
        for (int nt = 0; nt < kNt; ++nt) KVMM_UNROLL
        for (int i = 0; i < 4; ++i) s[mt][nt][i] = 0.0f;
        KVMM_UNROLL
        for (int kst = 0; kst < D / 16; ++kst) {
          std::uint32_t qf[kMt][4];
          KVMM_UNROLL
          for (int mt = 0; mt < kMt; ++mt) {
            if constexpr (kMt == 1) {
              KVMM_UNROLL
              for (int i = 0; i < 4; ++i) qf[mt][i] = qa[kst][i];
            } else {
              // Row 16 kMt warp + 16 mt + lane % 16, chunk 2 kst + lane / 16 (pf_swz_step).
              ldmatrix<4, false>(qf[mt], qs + pf_swz_step(q_off_t, kst) + mt * 16 * D * 2);
            }
          }
          const std::uint32_t k_at = pf_swz_step(k_off_t, kst);
          KVMM_UNROLL
          for (int np = 0; np < kNt / 2; ++np) {
            // Lanes 8m .. 8m + 7 address matrix m: tokens kSubTok u + 8 (2 np + m / 2) + 0..7,
            // chunk 2 kst + m % 2.
            std::uint32_t kb[4];
            ldmatrix<4, false>(kb, ks + k_at + (u * kNt / 2 + np) * 16 * D * 2);
            const std::uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
            KVMM_UNROLL
            for (int mt = 0; mt < kMt; ++mt) {
              mma_16816<T>(s[mt][2 * np], qf[mt], b0, s[mt][2 * np]);
              mma_16816<T>(s[mt][2 * np + 1], qf[mt], b1, s[mt][2 * np + 1]);
            }
          }
        }
        // Soft cap and mask: this lane's columns are tokens kSubTok u + 8 nt + 2 tig + (i &
        // 1), rows 2 mt + (i >> 1). Without a soft cap the scale is applied inside the
        // exponent (one FFMA, FA2's trick): the maximum is taken over raw dots (scale > 0
        // keeps the order).
        if (soft_cap) {
          KVMM_UNROLL
          for (int mt = 0; mt < kMt; ++mt) KVMM_UNROLL
          for (int nt = 0; nt < kNt; ++nt) KVMM_UNROLL
          for (int i = 0; i < 4; ++i) s[mt][nt][i] = a.cap_log2 * tanhf(s[mt][nt][i] * a.scale_div_cap);
        }
        if (!full) {  // a boundary tile (its own block, so interior tiles run none of it)
          KVMM_UNROLL
          for (int mt = 0; mt < kMt; ++mt) {
            const KeyRange kr[2] = {rkey[16 * kMt * warp + 16 * mt + gid], rkey[16 * kMt * warp + 16 * mt + gid + 8]};
            KVMM_UNROLL
            for (int nt = 0; nt < kNt; ++nt) KVMM_UNROLL
            for (int i = 0; i < 4; ++i) {
              const std::uint32_t col = static_cast<std::uint32_t>(kSubTok * u + 8 * nt + 2 * tig + (i & 1));
              const std::uint32_t tok = tok0 + col;
              // one predicate, no branch per element
              if ((tok < kr[i >> 1].lo) | (tok >= kr[i >> 1].hi) | (fl[col] != 0)) s[mt][nt][i] = -INFINITY;
            }
          }
        }
      };
      // The weights against the rows' references m0 (a row with no key yet: 0), packed at
      // once as P's A fragments (k-step nt / 2, word 2 (nt % 2) + row half) with the split
      // P's remainders, and this lane's part of each row's sum: S's registers die here.
      float m0[kRows], sum[kRows];
      std::uint32_t pa[kMt][kNt / 2][4], pl[kMt][kNt / 2][4];  // [m-tile][k-step kk][word]
      auto weights = [&] {
        KVMM_UNROLL
        for (int k = 0; k < kRows; ++k) sum[k] = 0.0f;
        KVMM_UNROLL
        for (int mt = 0; mt < kMt; ++mt) KVMM_UNROLL
        for (int nt = 0; nt < kNt; ++nt) KVMM_UNROLL
        for (int hf = 0; hf < 2; ++hf) {
          const int k = 2 * mt + hf;
          const float x0 = tc_exp2(fmaf(s[mt][nt][2 * hf], sc, -m0[k]));
          const float x1 = tc_exp2(fmaf(s[mt][nt][2 * hf + 1], sc, -m0[k]));
          sum[k] += x0 + x1;
          const std::uint32_t w = tc_pack2<T>(x0, x1);
          pa[mt][nt >> 1][2 * (nt & 1) + hf] = w;
          if constexpr (kSplitP) pl[mt][nt >> 1][2 * (nt & 1) + hf] = tc_pack2<T>(x0 - T::lo(w), x1 - T::hi(w));
        }
      };
      // The steady state: no maximum taken. The weights against the rows' lazy references
      // (FA4: a reference moves only when a tile's maximum passes it by more than kPfLazy
      // in log2 units); a lane's part of a row's sum at most 2^kPfLazy bounds each of its
      // weights by it, so the reference holds. A row over it (or NaN), or one with no key
      // yet (-inf reference), sends the warp to the rare path.
      bool rare = true;
      if constexpr (kSteady) {
        scores();
        rare = false;
        KVMM_UNROLL
        for (int k = 0; k < kRows; ++k) {
          m0[k] = st[k].m;
          rare = rare || st[k].m == -INFINITY;
        }
        weights();
        KVMM_UNROLL
        for (int k = 0; k < kRows; ++k) rare = rare || !(sum[k] <= kPfLazyBound);
        rare = __any_sync(0xffffffffu, rare);
#if defined(KVMM_CENSUS_INTERIOR)
        // Census builds: an interior tile's path in the steady state, where no row's maximum
        // passes its reference (the checks and the vote stay; the rare path is compiled out).
        rare = false;
#endif
      }
      if (rare) {
        // The rare path: S again, the rows' maxima, the references moved where a maximum
        // passes them by more than kPfLazy (to it: the same product as when it was the
        // sub-tile's), the weights again, and O and the sums rescaled. A row with no key yet
        // (-inf) is exponentiated against 0 (its weights are exp2(-inf) = 0); its O and sum
        // are 0, so its factor (0 or 1) changes nothing.
        scores();
        float mx[kRows];
        KVMM_UNROLL
        for (int k = 0; k < kRows; ++k) mx[k] = -INFINITY;
        KVMM_UNROLL
        for (int mt = 0; mt < kMt; ++mt) KVMM_UNROLL
        for (int nt = 0; nt < kNt; ++nt) KVMM_UNROLL
        for (int i = 0; i < 4; ++i) mx[2 * mt + (i >> 1)] = fmaxf(mx[2 * mt + (i >> 1)], s[mt][nt][i]);
        float corr[kRows];
        bool rescale = false;
        KVMM_UNROLL
        for (int k = 0; k < kRows; ++k) {
          mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 1));
          mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 2));
          const float ms = mx[k] * sc;
          const float msc = ms > st[k].m + kPfLazy ? ms : st[k].m;
          m0[k] = msc == -INFINITY ? 0.0f : msc;
          corr[k] = tc_exp2(st[k].m - m0[k]);
          st[k].l *= corr[k];
          rescale = rescale || (msc != st[k].m && st[k].m != -INFINITY);
          st[k].m = msc;
        }
        weights();
        if (__any_sync(0xffffffffu, rescale)) {
          KVMM_UNROLL
          for (int mt = 0; mt < kMt; ++mt) KVMM_UNROLL
          for (int n = 0; n < kNd; ++n) {
            o[mt][n][0] *= corr[2 * mt];
            o[mt][n][1] *= corr[2 * mt];
            o[mt][n][2] *= corr[2 * mt + 1];
            o[mt][n][3] *= corr[2 * mt + 1];
          }
        }
      }
      // st[k].l is this lane's part of the row's sum (its columns), reduced over the quad
      // once after the loop: the sum is linear in the rescales, so no shuffle per tile.
      KVMM_UNROLL
      for (int k = 0; k < kRows; ++k) st[k].l += sum[k];
      // fragment; each V fragment serves kMt m-tiles.
      KVMM_UNROLL
      for (int kk = 0; kk < kNt / 2; ++kk) {
        KVMM_UNROLL
        for (int np = 0; np < kNd / 2; ++np) {
          // Lanes 0-15: tokens kSubTok u + 16 kk + 0..15 at chunk 2 np; lanes 16-31: chunk
          // 2 np + 1; transposed.
          std::uint32_t vb[4];
          ldmatrix<4, true>(vb, vs + pf_swz_step(v_off_t, np) + (u * kNt / 2 + kk) * 16 * D * 2);
          const std::uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
          KVMM_UNROLL
          for (int mt = 0; mt < kMt; ++mt) {
            mma_16816<T>(o[mt][2 * np], pa[mt][kk], b0, o[mt][2 * np]);
            mma_16816<T>(o[mt][2 * np + 1], pa[mt][kk], b1, o[mt][2 * np + 1]);
            if constexpr (kSplitP) {
              mma_16816<T>(o[mt][2 * np], pl[mt][kk], b0, o[mt][2 * np]);
              mma_16816<T>(o[mt][2 * np + 1], pl[mt][kk], b1, o[mt][2 * np + 1]);
            }
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  // O normalised once; each lane writes its rows' columns 8 n + 2 tig, + 1. The tile's
  // rows and heads, recomputed or read back (fewer registers live through the loop).
  const std::uint32_t row0 = tile_meta[0], ntok_e = tile_meta[1];
  const std::uint32_t hc_e = min(a.group, kQRows);
  const std::uint32_t g0_e = (blockIdx.y % a.head_chunks) * hc_e;
  const std::uint32_t hg_e = min(hc_e, a.group - g0_e);
  const std::uint32_t qh0_e = blockIdx.y / a.head_chunks * a.group + g0_e;
  KVMM_UNROLL
  for (int k = 0; k < kRows; ++k) {
    st[k].l += __shfl_xor_sync(0xffffffffu, st[k].l, 1);  // the lanes' parts of the row's sum
    st[k].l += __shfl_xor_sync(0xffffffffu, st[k].l, 2);
  }
  KVMM_UNROLL
  for (int k = 0; k < kRows; ++k) {
    // The row's token and head, recomputed (fewer registers live through the loop).
    const int mt = k >> 1, half = k & 1;
    const std::uint32_t m = static_cast<std::uint32_t>(16 * kMt * warp + 16 * mt + gid + 8 * half);
    const std::uint32_t tk = m / hc_e, hd = m % hc_e;
    if (tk >= ntok_e || hd >= hg_e) continue;
    const std::uint64_t head = std::uint64_t{row0 + tk} * a.q_heads + qh0_e + hd;
    const float inv = st[k].l > 0.0f ? 1.0f / st[k].l : 0.0f;
    if (a.num_splits == 1) {
      KVMM_UNROLL
      for (int n = 0; n < kNd; ++n) {
        const std::uint32_t col = static_cast<std::uint32_t>(8 * n + 2 * tig);
        *reinterpret_cast<std::uint32_t*>(a.o + head * D + col) =
            pack2<T>(o[mt][n][2 * half] * inv, o[mt][n][2 * half + 1] * inv);
      }
    } else {
      float* wo = a.ws_o + (head * a.num_splits + blockIdx.z) * D;
      KVMM_UNROLL
      for (int n = 0; n < kNd; ++n) {
        const std::uint32_t col = static_cast<std::uint32_t>(8 * n + 2 * tig);
        wo[col] = o[mt][n][2 * half] * inv;
        wo[col + 1] = o[mt][n][2 * half + 1] * inv;
      }
      if (tig == 0) a.ws_lse[head * a.num_splits + blockIdx.z] = st[k].l > 0.0f ? st[k].m + log2f(st[k].l) : -INFINITY;
    }
  }
}

}  // namespace kvmm::kernels::device
