// The sm_90a prefill (issue 37 item 2): paged causal prefill attention on warpgroup MMA
// with K/V tiles brought by TMA through a 5-D tensor map of the page-layer layout
// (prefill_tma.hpp's shape) and completed on mbarriers; bf16, head dim 128, GQA rows packed
// as in tc_prefill.cuh (a Q tile is 128 packed rows: tq tokens of one request x hc q heads
// of the kv head's group). One CTA = (Q tile, kv head, head chunk), FA3's structure in
// three warpgroups:
//   warpgroup 0, the producer (setmaxnreg.dec to 24 registers): one thread walks the
//     CTA's 64-token KV tiles, waits for the stage's `empty` barrier, looks the pages up,
//     writes the tile's null-page bit mask, arrives with the tile's bytes (expect_tx) on
//     the stage's `full` barrier, then issues per page chunk of min(tpp, 64) tokens 2 + 2
//     TMA boxes (the two 64-element halves of K and of V, 128-byte swizzled); three stages.
//   warpgroups 1 and 2, the consumers (setmaxnreg.inc to 240), 64 of the tile's rows each,
//     both reading every stage: Q rows -> shared memory (swizzled, K-major) once; per
//     tile i: S_i = Q K_i^T by 8 wgmma m64n64k16 (A = Q, B = K straight from the TMA
//     stage), then O += P_{i-1} V_{i-1} by 16 wgmma m64n64k16 (A = P from registers, B =
//     V straight from the TMA stage as an MN-major operand; 4 k-steps x 2 dim halves x
//     P's two parts), the online softmax of S_i in registers, written to run under that
//     P V (its maxima and exponentials before the wait for P V: census; base 2;
//     causal and null-page masks per element on boundary tiles only), then O rescaled, P_i
//     packed as its bf16-rounded part and the rounded remainder (tc_prefill's kSplitP
//     numerics; kSplitP = false: rounded once, 8 wgmma for P V) in wgmma's A-fragment
//     layout (S's accumulator pairs), and stage i - 1 released on `empty`; O normalised
//     once at the end. The two consumers take turns issuing their wgmma groups (FA3's
//     ping-pong on named barriers 3 and 4), so one's softmax runs under the other's.
//     Q tiles are launched longest (a request's last) first.
// Its costs against FA3: P's remainder doubles P V by default, 64-key tiles (FA3: 128+).
// Supported: causal mask, no soft cap, one split; pages of 8, 16, 32 or a
// multiple of 64 tokens (each TMA box lands on a 1024-byte swizzle atom); null pages.
// Shared memory: kHpSmemBytes (about 129 KiB); 168 registers at launch (census), one CTA
// per SM.
#pragma once

#include "attention_dispatch.cuh"  // make_args
#include "hopper.cuh"
#include "named_barrier.cuh"
#include "tc_prefill_common.cuh"  // AttnArgs, pf_args, pf_grid_x, pf_find_tile, tc_exp2

#include <cstdint>
#include <string>

#if defined(KVMM_SIMT_HOST)
#define KVMM_GRID_CONSTANT
#define KVMM_HP_ROLLED
#else
#define KVMM_GRID_CONSTANT __grid_constant__
#define KVMM_HP_ROLLED _Pragma("unroll 1")
#endif

namespace kvmm::kernels::device {

inline constexpr int kHpThreads = 384;              // warpgroup 0: producer, 1 and 2: consumers
inline constexpr std::uint32_t kHpRows = 128;       // packed rows per Q tile: 64 per consumer (wgmma M)
inline constexpr std::uint32_t kHpTile = 64;        // tokens per KV tile
inline constexpr std::uint32_t kHpStages = 3;       // K/V stages
inline constexpr std::uint32_t kHpHalf = 64 * 128;  // 64 rows x 128 bytes: one swizzled block
// Shared memory, from a 1024-byte aligned base: K and V stages [stage][d half][64 tokens]
// [128 B], Q [consumer][d half][64 rows][128 B], then full[stage], empty[stage] and the
// stages' null-page masks.
inline constexpr std::uint32_t kHpK = 0;
inline constexpr std::uint32_t kHpV = kHpK + kHpStages * 2 * kHpHalf;
inline constexpr std::uint32_t kHpQ = kHpV + kHpStages * 2 * kHpHalf;
inline constexpr std::uint32_t kHpBar = kHpQ + 4 * kHpHalf;
inline constexpr std::uint32_t kHpNull = kHpBar + 2 * kHpStages * 8;
inline constexpr std::uint32_t kHpSmemBytes = kHpNull + kHpStages * 8 + 1024;  // + alignment slack
// Registers: 168 per thread at launch (384 x 168 fill the register file), then the
// producer gives 144 back (24) and each consumer takes 72 (240): 128 x (24 + 2 x 240).
inline constexpr int kHpProducerRegs = 24;
// The consumers' ping-pong (their turns to issue wgmma groups); false: each issues freely.
inline constexpr bool kHpPingPong = true;
inline constexpr int kHpConsumerRegs = 240;

// The page side of a launch: the request's page table, the page size, and the plane
// (coordinate 3 of the tensor map) of the layer's K; its V is the next plane.
struct HpKV {
  const std::uint32_t* indptr;  // CSR, or nullptr: dense rows of dense_stride
  const std::uint32_t* pages;
  std::uint32_t dense_stride;
  std::uint32_t tpp;
  std::uint32_t box_tokens;  // min(tpp, 64): tokens per TMA box
  std::uint32_t k_plane;
};

// The 128-byte swizzle on an offset from a 1024-byte aligned base.
__host__ __device__ __forceinline__ std::uint32_t hp_swz(std::uint32_t off) { return off ^ (((off >> 7) & 7u) << 4); }

// A K-major operand in 128-byte swizzled rows (8-row atoms of 1024 bytes, packed).
__device__ __forceinline__ SmemDesc hp_desc(const unsigned char* p) { return make_smem_desc(p, 16, 1024, true); }
// V as an MN-major operand: 128-byte swizzled rows of 64 dims, 8-token groups 1024 bytes
// apart (LBO = SBO: either field read for that stride gives the same address at N = 64).
__device__ __forceinline__ SmemDesc hp_vdesc(const unsigned char* p) { return make_smem_desc(p, 1024, 1024, true); }

// mbar_wait with a guard: a phase that has not completed after 2^22 polls (a tile takes
// microseconds; the guard fires after tenths of a second to seconds) traps,
// so a pipeline bug on a GPU fails its launch instead of hanging the process.
__device__ __forceinline__ void hp_wait(std::uint64_t* bar, std::uint32_t parity) {
#if defined(KVMM_SIMT_HOST)
  mbar_wait(bar, parity);  // the emulator reports a wait nothing completes
#else
  for (std::uint32_t n = 0; !mbar_try_wait(bar, parity); ++n)
    if (n == (1u << 22)) __trap();
#endif
}

// S = Q K^T for one tile into sc (wgmma n64's D layout): the tile's 64 keys per wgmma, 8
// k-steps of 16 dims (A = Q, B = K as the TMA landed it: K-major, 128-byte swizzled).
// qd, kd: the descriptors of the Q rows and of the stage's K (hp_desc), advanced per k-step.
template <typename T>
__device__ __forceinline__ void hp_scores(float (&sc)[32], SmemDesc qd, SmemDesc kd) {
  KVMM_UNROLL
  for (int ks = 0; ks < 8; ++ks) {
    const std::uint32_t koff = static_cast<std::uint32_t>(ks / 4) * kHpHalf + static_cast<std::uint32_t>(ks % 4) * 32;
    wgmma_m64k16<T, 64>(sc, desc_advance(qd, koff), desc_advance(kd, koff), ks > 0);
  }
}

// O += P V for one tile: per k-step of 16 keys and 64-dim half, P's two parts (A from
// registers, B = V as the TMA landed it: MN-major, 128-byte swizzled, 8-token groups 1024
// bytes apart; LBO = SBO so either field read for that stride gives the same address).
// vd: the stage's V as an MN-major operand (hp_vdesc), advanced per k-step and dim half.
template <typename T, bool kSplitP>
__device__ __forceinline__ void hp_pv(float (&o)[2][32], const std::uint32_t (&phi)[4][4],
                                      const std::uint32_t (&plo)[4][4], SmemDesc vd) {
  KVMM_UNROLL
  for (int ks = 0; ks < 4; ++ks) {
    KVMM_UNROLL
    for (int hf = 0; hf < 2; ++hf) {
      const SmemDesc dv =
          desc_advance(vd, static_cast<std::uint32_t>(hf) * kHpHalf + static_cast<std::uint32_t>(ks) * 2048);
      wgmma_m64n64k16_rs<T, true>(o[hf], phi[ks], dv, true);
      if constexpr (kSplitP) wgmma_m64n64k16_rs<T, true>(o[hf], plo[ks], dv, true);
    }
  }
}

// What the softmax needs of this thread's two rows: their key limits, the lane, the scale.
struct HpRows {
  std::uint32_t lim0, lim1, lane;
  float scale_log2;
};

// The online softmax (base 2) of tile i's scores, in place: causal and null-page masks,
// the rows' maxima over the quad (of the raw scores: the scale is positive, so the
// scaled maximum is the raw one's product), alpha = the old maximum's rescale (m, in
// scaled units, and l updated; O is the caller's), then sc = exp2(sc x scale -
// reference) by one FFMA each, summed into l. Register r of sc: key 8 (r / 4) + 2 (lane %
// 4) + (r & 1), row + 8 when r % 4 >= 2.
__device__ __forceinline__ void hp_softmax(float (&sc)[32], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                           const HpRows& rows, std::uint32_t i, std::uint64_t nm) {
  float mx[2] = {-INFINITY, -INFINITY};
  // The rows' maxima over the quad, the new references, O's factors, then the weights and
  // this lane's part of the sums; run at the end of each arm of the mask branch below, not
  // after it: ptxas hoists the caller's wgmma.wait_group 0 (of P V_{i-1}) to the top of
  // the block that follows the branch, so exponentials there would wait for that P V.
  const auto weights = [&] {
    float ref[2];
    KVMM_UNROLL
    for (int k = 0; k < 2; ++k) {
      mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 1));
      mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 2));
      mx[k] = fmaxf(m[k], mx[k] * rows.scale_log2);  // -inf stays -inf
      ref[k] = mx[k] == -INFINITY ? 0.0f : mx[k];
      alpha[k] = tc_exp2(m[k] - ref[k]);  // m = -inf: 0 (O and l are 0 then)
      m[k] = mx[k];
      l[k] *= alpha[k];
    }
    KVMM_UNROLL
    for (int r = 0; r < 32; r += 2) {
      const int k = (r & 3) >> 1;
      sc[r] = tc_exp2(fmaf(sc[r], rows.scale_log2, -ref[k]));  // a masked -inf: 0
      sc[r + 1] = tc_exp2(fmaf(sc[r + 1], rows.scale_log2, -ref[k]));
      l[k] += sc[r] + sc[r + 1];
    }
  };
  // A tile with masked keys for a thread of the warp (decided per warp: no divergence).
  if (__any_sync(0xffffffffu, nm != 0 || (i + 1) * kHpTile > min(rows.lim0, rows.lim1))) {
    KVMM_UNROLL
    for (int r = 0; r < 32; ++r) {
      const int k = (r & 3) >> 1;
      const std::uint32_t tl = static_cast<std::uint32_t>(8 * (r >> 2) + (r & 1)) + 2 * (rows.lane % 4);
      if (i * kHpTile + tl >= (k == 0 ? rows.lim0 : rows.lim1) || ((nm >> tl) & 1u) != 0) sc[r] = -INFINITY;
      mx[k] = fmaxf(mx[k], sc[r]);
    }
    weights();
  } else {  // every key of the tile visible to both rows: no per-element mask
    KVMM_UNROLL
    for (int r = 0; r < 32; ++r) mx[(r & 3) >> 1] = fmaxf(mx[(r & 3) >> 1], sc[r]);
    weights();
  }
}

// P (the softmax's sc) as its T-rounded part and the rounded remainder in wgmma's A
// fragments: k-step ks (keys 16 ks ..) is D registers 8 ks .. 8 ks + 7, fragment register
// j the pair 8 ks + 2 j, + 1 (rows g, g + 8, then keys + 8).
template <typename T, bool kSplitP>
__device__ __forceinline__ void hp_pack(const float (&sc)[32], std::uint32_t (&phi)[4][4], std::uint32_t (&plo)[4][4]) {
  KVMM_UNROLL
  for (int r = 0; r < 32; r += 2) {
    const std::uint32_t hi = pack2<T>(sc[r], sc[r + 1]);
    phi[r / 8][(r % 8) / 2] = hi;
    if constexpr (kSplitP) plo[r / 8][(r % 8) / 2] = pack2<T>(sc[r] - T::lo(hi), sc[r + 1] - T::hi(hi));
  }
}

// kSplitP: P applied as its T-rounded part and the rounded remainder (tc_prefill's default
// numerics, 16 wgmma per tile for P V); false: P rounded once (FA2/FA3's numerics, 8).
template <typename T, bool kSplitP = true>
__global__ void __launch_bounds__(kHpThreads, 1)
    hopper_prefill_kernel(const KVMM_GRID_CONSTANT TensorMap map, AttnArgs a, HpKV kv) {
#if defined(KVMM_SIMT_HOST)
  unsigned char* smem = simt::dynamic_shared(kHpSmemBytes);
#else
  extern __shared__ __align__(1024) unsigned char hp_smem_raw[];
  unsigned char* smem = hp_smem_raw + ((1024u - (smem_u32(hp_smem_raw) & 1023u)) & 1023u);
#endif
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(smem + kHpBar);
  std::uint64_t* empty = full + kHpStages;
  std::uint64_t* nullmask = reinterpret_cast<std::uint64_t*>(smem + kHpNull);

  // The request and Q tile of this CTA, as tc_prefill_kernel.
  const std::uint32_t tq = a.rows_per_cta;
  // Tiles in reverse order: the CTAs launched first hold a request's last tokens, which see
  // the most keys (causal), so the grid's tail is made of short tiles.
  const PfTile tile = pf_find_tile(a, gridDim.x - 1 - blockIdx.x);
  const std::uint32_t b = tile.b, q_begin = tile.q_begin, q_len = tile.q_len, t0 = tile.t0;
  if (t0 >= q_len) return;  // an idle virtual tile: the whole CTA
  const std::uint32_t ntok = min(tq, q_len - t0);
  const std::uint32_t kv_len = __ldg(a.kv_lens + b);
  const std::uint32_t hc = min(a.group, kHpRows);
  const std::uint32_t h = blockIdx.y / a.head_chunks;
  const std::uint32_t g0 = (blockIdx.y % a.head_chunks) * hc;
  const std::uint32_t hg = min(hc, a.group - g0);
  const std::uint32_t qh0 = h * a.group + g0;
  const bool fits = q_len <= kv_len;  // else no row sees a key (outputs 0, as the references)
  const std::uint32_t p0 = kv_len - q_len + t0;
  const std::uint32_t keys = fits ? p0 + ntok : 0;  // causal: the CTA's keys are [0, keys)
  const std::uint32_t ntiles = (keys + kHpTile - 1) / kHpTile;

  if (threadIdx.x == 0) {
    for (std::uint32_t s = 0; s < kHpStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 256);  // both consumers
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {  // the producer warpgroup
    setmaxnreg_dec<kHpProducerRegs>();
    if (threadIdx.x == 0) {
      const std::uint32_t* row_pages =
          kv.indptr != nullptr ? kv.pages + __ldg(kv.indptr + b) : kv.pages + std::uint64_t{b} * kv.dense_stride;
      const std::uint32_t boxes = kHpTile / kv.box_tokens;
      for (std::uint32_t i = 0; i < ntiles; ++i) {
        const std::uint32_t s = i % kHpStages;
        if (i >= kHpStages) hp_wait(&empty[s], (i / kHpStages - 1) & 1u);
        unsigned char* kst = smem + kHpK + s * 2 * kHpHalf;
        unsigned char* vst = smem + kHpV + s * 2 * kHpHalf;
        // Boxes past the CTA's keys load the last page again (masked by causality).
        auto page_of = [&](std::uint32_t c) {
          return __ldg(row_pages + min(i * kHpTile + c * kv.box_tokens, keys - 1) / kv.tpp);
        };
        // The tile's null-page mask first, then the expected bytes, then the loads (the
        // canonical order: the phase cannot complete before its bytes are declared).
        std::uint64_t nulls = 0;
        for (std::uint32_t c = 0; c < boxes; ++c)
          if (page_of(c) == kNull) nulls |= (~std::uint64_t{0} >> (64 - kv.box_tokens)) << (c * kv.box_tokens);
        nullmask[s] = nulls;  // ordered before the consumers' reads by the barrier's phase
        mbar_arrive_expect_tx(&full[s], 4 * kHpHalf);
        // Not unrolled: one thread issues these (the TMA operands' uniformity loops make
        // each copy long), and the census's main loop stays the consumer's.
        KVMM_HP_ROLLED
        for (std::uint32_t c = 0; c < boxes; ++c) {
          const std::uint32_t page = page_of(c);
          // A null page: coordinate -1, outside the tensor, zero-filled (and masked).
          const int pc = page == kNull ? -1 : static_cast<int>(page);
          const int tin = static_cast<int>((i * kHpTile + c * kv.box_tokens) % kv.tpp);
          for (int half = 0; half < 2; ++half) {
            const std::uint32_t dst = static_cast<std::uint32_t>(half) * kHpHalf + c * kv.box_tokens * 128;
            tma_load<5>(kst + dst, map, {64 * half, static_cast<int>(h), tin, static_cast<int>(kv.k_plane), pc},
                        &full[s]);
            tma_load<5>(vst + dst, map, {64 * half, static_cast<int>(h), tin, static_cast<int>(kv.k_plane + 1), pc},
                        &full[s]);
          }
        }
      }
    }
    return;
  }

  // The consumer warpgroups: cw = 0 takes the tile's packed rows 0-63, cw = 1 rows 64-127;
  // both read every K/V stage and both release it.
  setmaxnreg_inc<kHpConsumerRegs>();
  const std::uint32_t ct = threadIdx.x - 128;
  // The consumer index, warp-uniform to the compiler (its descriptors can live in uniform
  // registers).
  const std::uint32_t cw = __shfl_sync(0xffffffffu, ct / 128, 0);
  const std::uint32_t warp = ct / 32, lane = ct % 32;  // warp 0-7: rows 16 warp ..
  unsigned char* qs = smem + kHpQ + cw * 2 * kHpHalf;

  // This consumer's 64 Q rows -> shared memory, K-major, swizzled; rows outside the tile zero.
  for (std::uint32_t e = ct % 128; e < 64 * 16; e += 128) {
    const std::uint32_t rl = e / 16, r = 64 * cw + rl, c = e % 16, tok = r / hc, hd = r % hc;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (tok < ntok && hd < hg)
      val = *reinterpret_cast<const uint4*>(a.q + (std::uint64_t{q_begin + t0 + tok} * a.q_heads + qh0 + hd) * 128 +
                                            c * 8);
    sts(reinterpret_cast<uint4*>(qs + (c / 8) * kHpHalf + hp_swz(rl * 128 + (c % 8) * 16)), val);  // logged: wavefronts
  }
  fence_proxy_async();  // generic writes before wgmma's (async proxy) reads
  if (cw == 0)          // constant ids: ptxas reserves the named barriers it sees
    bar_sync(1, 128);
  else
    bar_sync(2, 128);

  // This thread's two rows (wgmma D layout: lane / 4 and + 8 of the warp's 16): the key
  // limit (keys below it are visible; 0 for rows outside the tile).
  std::uint32_t lim[2];
  for (int k = 0; k < 2; ++k) {
    const std::uint32_t r = 16 * warp + lane / 4 + 8 * static_cast<std::uint32_t>(k), tok = r / hc, hd = r % hc;
    lim[k] = fits && tok < ntok && hd < hg ? p0 + tok + 1 : 0;
  }
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  // O: two 64-dim halves in wgmma n64's D layout (register 4 j + i: dims 8 j + 2 (lane %
  // 4) + (i & 1) of the half, row + 8 for i >= 2).
  float o[2][32];
  for (auto& n : o)
    for (float& v : n) v = 0.0f;

  // The tiles, software-pipelined as FA3's consumer: tile i's S group is issued, then
  // tile i - 1's P V group; the softmax of S_i is written to run while P V_{i-1} is in
  // flight (wgmma.wait_group 1; the exponentials sit inside hp_softmax's mask branch, so
  // ptxas keeps the wait 0 after them: census row ex2_before_pv_wait), O is
  // rescaled and P_i packed once that group retired (wait 0), which also frees tile
  // i - 1's stage.
  float sc[32];
  std::uint32_t phi[4][4], plo[4][4];
  float alpha[2];
  const HpRows rows{lim[0], lim[1], lane, a.scale_log2};
  // The operands' descriptors, built once: Q, stage 0's K and V (advanced per stage and step).
  const SmemDesc qd = hp_desc(qs), kd0 = hp_desc(smem + kHpK), vd0 = hp_vdesc(smem + kHpV);
  // The consumers take turns issuing their wgmma groups (FA3's ping-pong): consumer cw
  // waits on named barrier 3 + cw (its turn: its own 128 threads and the other's 128
  // arrivals), issues, and arrives on the other's; so one's softmax runs under the
  // other's groups. Each consumer issues ntiles + 1 times; consumer 0 goes first (the
  // arrival below), and consumer 1 does not pass its last turn (nobody waits for it).
  const auto my_turn = [cw] {
    if constexpr (!kHpPingPong) return;
    if (cw == 0)  // constant ids: ptxas reserves the named barriers it sees
      bar_sync(3, 256);
    else
      bar_sync(4, 256);
  };
  const auto pass_turn = [cw] {
    if constexpr (!kHpPingPong) return;
    if (cw == 0)
      bar_arrive(4, 256);
    else
      bar_arrive(3, 256);
  };
  if (ntiles > 0) {
    if (cw == 1) pass_turn();
    hp_wait(&full[0], 0);
    my_turn();
    wgmma_fence();
    hp_scores<T>(sc, qd, kd0);
    wgmma_commit();
    pass_turn();
    wgmma_wait<0>();
    hp_softmax(sc, m, l, alpha, rows, 0, nullmask[0]);  // O is 0: no rescale
    hp_pack<T, kSplitP>(sc, phi, plo);
  }
  for (std::uint32_t i = 1; i < ntiles; ++i) {
    const std::uint32_t s = i % kHpStages, sp = (i - 1) % kHpStages;
    hp_wait(&full[s], (i / kHpStages) & 1u);
    my_turn();
    wgmma_fence();
    hp_scores<T>(sc, qd, desc_advance(kd0, s * 2 * kHpHalf));
    wgmma_commit();
    hp_pv<T, kSplitP>(o, phi, plo, desc_advance(vd0, sp * 2 * kHpHalf));
    wgmma_commit();
    pass_turn();
    wgmma_wait<1>();  // S_i retired, P V_{i-1} may still run
    hp_softmax(sc, m, l, alpha, rows, i, nullmask[s]);
    wgmma_wait<0>();
    mbar_arrive(&empty[sp]);  // K_{i-1} (its S group) and V_{i-1} (its P V group) read
    KVMM_UNROLL
    for (auto& n : o) {
      KVMM_UNROLL
      for (int r = 0; r < 32; ++r) n[r] *= alpha[(r & 3) >> 1];
    }
    hp_pack<T, kSplitP>(sc, phi, plo);
  }
  if (ntiles > 0) {
    my_turn();
    wgmma_fence();
    hp_pv<T, kSplitP>(o, phi, plo, desc_advance(vd0, ((ntiles - 1) % kHpStages) * 2 * kHpHalf));
    wgmma_commit();
    if (cw == 0) pass_turn();
    wgmma_wait<0>();  // the last stage is not released: no tile follows
  }

  // O / l, rows of the tile only.
  for (int k = 0; k < 2; ++k) {
    l[k] += __shfl_xor_sync(0xffffffffu, l[k], 1);
    l[k] += __shfl_xor_sync(0xffffffffu, l[k], 2);
  }
  for (int k = 0; k < 2; ++k) {
    const std::uint32_t r = 16 * warp + lane / 4 + 8 * static_cast<std::uint32_t>(k), tok = r / hc, hd = r % hc;
    if (tok >= ntok || hd >= hg) continue;
    const std::uint64_t head = std::uint64_t{q_begin + t0 + tok} * a.q_heads + qh0 + hd;
    const float inv = l[k] > 0.0f ? 1.0f / l[k] : 0.0f;
    KVMM_UNROLL
    for (int hf = 0; hf < 2; ++hf) {
      KVMM_UNROLL
      for (int j = 0; j < 8; ++j) {
        const std::uint32_t col = static_cast<std::uint32_t>(64 * hf + 8 * j) + 2 * (lane % 4);
        *reinterpret_cast<std::uint32_t*>(a.o + head * 128 + col) =
            pack2<T>(o[hf][4 * j + 2 * k] * inv, o[hf][4 * j + 2 * k + 1] * inv);
      }
    }
  }
}

}  // namespace kvmm::kernels::device

// Host side -----------------------------------------------------------------------------

namespace kvmm::kernels::device {

// What one launch needs: the 5-D tensor map of the layer's pages (prefill_tma.hpp's
// dimensions with the layer folded into the base: planes 0 = K and 1 = V at v - k bytes,
// num_pages pages page_stride_bytes apart; 0: 2^31 - 1), the kernel's arguments and grid.
struct HpLaunch {
  TensorMapSpec map;
  AttnArgs args;
  HpKV kv;
  dim3 grid;
  bool split_p = true;  // false: the kSplitP = false instance (P rounded once)
};

// Checks what the scaffold supports, raising kvmm::Error (naming the argument and value)
// for anything else; p already passed check_params. O(1).
inline HpLaunch hp_plan(const PagedAttentionParams& p, std::uint64_t num_pages = 0) {
  constexpr const char* kName = "paged_prefill_attention_hopper";
  auto refuse = [&](const std::string& what) { kvmm::kernels::detail::launch_failed(kName, what.c_str()); };
  const PagedKVCache& c = p.cache;
  if (c.dtype != DType::kBF16) refuse("dtype: only bf16 is built");
  if (c.order != KVOrder::kTokenMajor)
    refuse("cache.order = " + std::to_string(static_cast<int>(c.order)) +
           " (head-major): the sm_90a prefill's TMA map reads token-major pages only");
  if (c.head_dim != 128) refuse("head_dim = " + std::to_string(c.head_dim) + ": only 128 is built");
  if (p.query.q_indptr == nullptr) refuse("query.q_indptr = nullptr: a prefill kernel");
  if (p.options.mask != MaskKind::kCausal) refuse("options.mask: only the causal mask is built");
  if (p.options.soft_cap > 0.0f) refuse("options.soft_cap = " + std::to_string(p.options.soft_cap) + ": not built");
  if (p.split.num_splits != 1) refuse("split.num_splits = " + std::to_string(p.split.num_splits) + ": must be 1");
  const std::uint32_t tpp = c.tokens_per_page;
  if (!(tpp % kHpTile == 0 || (tpp % 8 == 0 && kHpTile % tpp == 0)))
    refuse("cache.tokens_per_page = " + std::to_string(tpp) + ": must be 8, 16, 32 or a multiple of 64");
  const auto k = reinterpret_cast<std::uintptr_t>(c.k), v = reinterpret_cast<std::uintptr_t>(c.v);
  if (v <= k || (v - k) % 16 != 0 || (v - k) >= (std::uint64_t{1} << 40))
    refuse("cache.v - cache.k = " + std::to_string(static_cast<long long>(v - k)) +
           " bytes: must be a positive multiple of 16 below 2^40 (V after K, as the page-layer layout)");
  if (c.page_stride_bytes % 16 != 0 || k % 16 != 0)
    refuse("cache.page_stride_bytes = " + std::to_string(c.page_stride_bytes) +
           ": the page stride and cache.k must be multiples of 16 bytes");
  HpLaunch l{};
  const std::uint64_t row = std::uint64_t{c.kv_heads} * c.head_dim * 2;
  l.map.base = c.k;
  l.map.rank = 5;
  if (num_pages > (std::uint64_t{1} << 32)) refuse("num_pages = " + std::to_string(num_pages) + ": at most 2^32");
  const std::uint64_t pages = num_pages != 0 ? num_pages : (std::uint64_t{1} << 31) - 1;
  const std::uint64_t dims[5] = {c.head_dim, c.kv_heads, tpp, 2, pages};
  const std::uint64_t strides[5] = {0, std::uint64_t{c.head_dim} * 2, row, v - k, c.page_stride_bytes};
  const unsigned box[5] = {64, 1, tpp < kHpTile ? tpp : kHpTile, 1, 1};
  for (int d = 0; d < 5; ++d) {
    l.map.dims[d] = dims[d];
    l.map.strides[d] = strides[d];
    l.map.box[d] = box[d];
  }
  l.map.elem_bytes = 2;
  l.map.swizzle128 = true;
  l.args = pf_args(make_args(p.query, p.options, p.split, c.kv_heads, c.head_dim), kHpRows);
  l.kv = HpKV{p.table.indptr, p.table.pages, p.table.dense_stride, tpp, box[2], 0};
  l.grid = dim3(pf_grid_x(p.query.rows, p.query.batch, l.args.group, kHpRows), c.kv_heads * l.args.head_chunks, 1);
  return l;
}

}  // namespace kvmm::kernels::device
