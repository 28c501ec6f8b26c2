// One warp tile of the tensor-core decode with swapped operands (tc_decode.cuh, kSwap):
// tokens in the M rows of mma.m16n8k16, the q heads of a group of at most 8 in N. Costs per
// 16 tokens at D 128: 24 HMMA, 16 LDSM.x4, 4 MOVM; O^T in 32 registers, Q^T in 16.
#pragma once

#include "tc_decode_common.cuh"

namespace kvmm::kernels::device {

// One 16-token tile with swapped operands (kSwap: a group of at most 8 q heads, the N of
// the products): S^T = K Q^T (M = 16 tokens, N = 8 q heads; A = K by ldmatrix.x4 from the
// plain layout, B = Q^T from registers), D / 16 HMMA; the online softmax per q head (a
// column: this lane's tokens gid and gid + 8, reduced over the 8 lanes of its column by
// three xor shuffles); P^T packed to T (and its T-rounded remainder) as C tiles, turned into
// the B operand by movmatrix (a C tile of 8 tokens x 8 heads transposed is B's fragment);
// O^T += V^T P^T (M = 16 dims per m-tile, A = V^T by ldmatrix.x4.trans from the exchanged
// layout), 2 D / 16 HMMA. Per 16 tokens at D 128: 24 HMMA, 16 LDSM, 4 MOVM (half of the
// 16-row form's HMMA and two thirds of its LDSM), O in 32 registers, Q in 16.
template <typename T, int D, int kSub, typename Mask>
__device__ __forceinline__ void tc_swap_tile(float (&o)[D / 16][4], SoftmaxState<float> (&st)[2],
                                             const std::uint32_t (&qb)[D / 16][2], const unsigned char* stage,
                                             const std::uint32_t (&soff)[4], Mask tm, int gid, float f,
                                             const AttnArgs& a) {
  constexpr std::uint32_t kTileBytes = kTcTile * D * 2;  // sub-tile u: K at stage + 2 u kTileBytes, V after it
#if defined(KVMM_CENSUS_NO_SOFT_CAP)
  constexpr bool soft_cap = false;
#else
  const bool soft_cap = a.soft_cap;
#endif
  // Sub-tile u: tokens 16 u + gid (s[u][0], s[u][1]) and 16 u + gid + 8 (2, 3) x heads 2 tig + i % 2.
  float s[kSub][4];
  KVMM_UNROLL
  for (int u = 0; u < kSub; ++u) KVMM_UNROLL
  for (int i = 0; i < 4; ++i) s[u][i] = 0.0f;
  KVMM_UNROLL
  for (int u = 0; u < kSub; ++u) KVMM_UNROLL
  for (int j = 0; j < D / 16; ++j) {
    std::uint32_t k4[4];
    ldmatrix<4, false>(k4, tc_at(stage + u * 2 * kTileBytes, soff, j));
    mma_16816<T>(s[u], k4, qb[j], s[u]);
  }
  const Mask lm = tm >> gid;  // bit 16 u + 8 r: token 16 u + 8 r + gid of the tile
  float mx[2];                // from the first sub-tile's first pair (no fmax with -inf)
  KVMM_UNROLL
  for (int u = 0; u < kSub; ++u) KVMM_UNROLL
  for (int i = 0; i < 4; ++i) {
    const bool ok = ((lm >> (16 * u + 8 * (i >> 1))) & 1u) != 0;
    const float x = soft_cap ? a.cap_log2 * tanhf(s[u][i] * a.scale_div_cap) : s[u][i];
    s[u][i] = ok ? x : -INFINITY;
    mx[i & 1] = u == 0 && i < 2 ? s[u][i] : fmaxf(mx[i & 1], s[u][i]);
  }
  float m_new[2], m_sub[2], sum[2];
  KVMM_UNROLL
  for (int h2 = 0; h2 < 2; ++h2) {
    KVMM_UNROLL
    for (int x = 4; x < 32; x *= 2) mx[h2] = fmaxf(mx[h2], __shfl_xor_sync(0xffffffffu, mx[h2], x));
    m_new[h2] = fmaxf(st[h2].m, mx[h2] * f);
    m_sub[h2] = m_new[h2] == -INFINITY ? 0.0f : m_new[h2];  // masked logits stay -inf: weight 0
  }
  KVMM_UNROLL
  for (int u = 0; u < kSub; ++u) KVMM_UNROLL
  for (int i = 0; i < 4; ++i) {
    s[u][i] = tc_exp2(fmaf(s[u][i], f, -m_sub[i & 1]));
    sum[i & 1] = u == 0 && i < 2 ? s[u][i] : sum[i & 1] + s[u][i];
  }
  float corr[2];
  KVMM_UNROLL
  for (int h2 = 0; h2 < 2; ++h2) {
    KVMM_UNROLL
    for (int x = 4; x < 32; x *= 2) sum[h2] += __shfl_xor_sync(0xffffffffu, sum[h2], x);
    corr[h2] = m_new[h2] == -INFINITY ? 1.0f : softmax_absorb(st[h2], m_new[h2], sum[h2], TcExp2{});
  }
  // P^T as B: the C tile of tokens gid (pk[0]) and gid + 8 (pk[1]) x heads 2 tig, 2 tig + 1,
  // transposed by movmatrix, is b0 (tokens 2 tig, 2 tig + 1 x head gid) and b1 (tokens 8 +
  // 2 tig ...). P is split into its T-rounded part and the T-rounded remainder (two products),
  // as in the 16-row form.
  std::uint32_t pa[kSub][2], pl[kSub][2];
  KVMM_UNROLL
  for (int u = 0; u < kSub; ++u) KVMM_UNROLL
  for (int r = 0; r < 2; ++r) {
    const std::uint32_t pk = tc_pack2<T>(s[u][2 * r], s[u][2 * r + 1]);
    const std::uint32_t rem = tc_pack2<T>(s[u][2 * r] - T::lo(pk), s[u][2 * r + 1] - T::hi(pk));
    pa[u][r] = movmatrix_trans(pk);
    pl[u][r] = movmatrix_trans(rem);
  }
  if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
    KVMM_UNROLL
    for (int mt = 0; mt < D / 16; ++mt) KVMM_UNROLL
    for (int i = 0; i < 4; ++i) o[mt][i] *= corr[i & 1];
  }
  // O^T += V^T P^T: per m-tile one ldmatrix.x4.trans gives V^T's A fragment (dims 16 mt ..
  // 16 mt + 15 x the 16 tokens).
  KVMM_UNROLL
  for (int u = 0; u < kSub; ++u) KVMM_UNROLL
  for (int mt = 0; mt < D / 16; ++mt) {
    std::uint32_t v4[4];
    ldmatrix<4, true>(v4, tc_at(stage + u * 2 * kTileBytes + kTileBytes, soff, mt));
    mma_16816<T>(o[mt], v4, pa[u], o[mt]);
    mma_16816<T>(o[mt], v4, pl[u], o[mt]);
  }
}

}  // namespace kvmm::kernels::device
