// The tensor-core decode attention (kernels/tc_decode.cuh, issue 36) beside the default
// kernel, selectable at run time: same parameters and results as paged_decode_attention /
// contiguous_decode_attention (head dims 64, 128 and 256), so one
// benchmark run times both. Internal to kvmm::cuda until it replaces the default; costs
// one launch (two with split-KV unless the last CTA merges: merge_counters).
#pragma once

#include "kvmm/kernels/attention.hpp"

namespace kvmm::kernels::experimental {

// stages: the cp.async ring's depth per warp, 2 (every head dim), 3 or 4 (head dim 128);
// anything else raises kvmm::Error naming it. Groups of at most 8 q heads at head dims 64
// and 128 run the swapped-operand form (32-token warp tiles at 2 stages), others the
// 16-row form (tc_decode.cuh).
// merge_counters (device memory, tc_merge_counters(rows, q_heads) words, all zero before
// the first launch that uses them, e.g. cudaMemset once after allocation): with split-KV,
// the last CTA of each (request, kv head) merges the pieces inside the kernel (one
// launch) and leaves its counter zero again, so launches, graph replays included, need no
// memset in between; nullptr: a separate merge_kernel launch merges them (the same bits).
// shape: the CTA's work shape (TcDecodeShape; the default is today's), the same results.
struct TcDecodeShape {
  // Tokens per warp tile of the swapped form at 2 stages: 0, the default (32 at head dim
  // 128, 64 at 64: 128 KiB of ring per CTA at 128, one CTA and 4 warps per SM); 16: 16-token
  // tiles (64 KiB at 128, 3 CTAs and 12 warps per SM, 1.4x the loop instructions per byte).
  // Rings of 3 and 4 stages and the 16-row form use 16-token tiles either way.
  std::uint32_t tile_tokens = 0;
  // The grid's order: false, requests along x (today); true, kv heads along x, so the CTAs
  // of one request's kv heads, which read the same token rows, run side by side (the
  // swapped form: groups of at most 8 at head dims 64 and 128; others ignore it).
  bool heads_first = false;
  // Limiter probes (issue 36; 0, the kernel): 1 load-only (the same grid, ring and cp.async,
  // no math: wrong outputs), 2 math-only (the same loop with no K/V loads: wrong outputs), 3
  // the copy lane map shipped before the sector map (K or V's plain layout copied with lanes
  // l and l + 16 on the two halves of row l: 24 L1 sectors per request, not 16; the same
  // bits). Only at bf16, head dim 128, 2 stages,
  // tile_tokens 0, groups of at most 8 and paged caches whose pages hold whole 16-token
  // tiles; anything else with probe != 0 raises kvmm::Error (check_tc_probe).
  std::uint32_t probe = 0;
  // Heads across warps (kernels/tc_decode_hw.cuh): false, today's CTA (one kv head, its
  // tiles dealt to the 4 warps in turn); true, one CTA per (request, 4 consecutive kv heads,
  // split piece), warp w on kv head 4 y + w walking every tile, so the CTA's warps copy the
  // same tokens of 4 adjacent heads together (1 KiB runs of each token row at head dim 128);
  // the same results within roundoff (another summation order). Only the swapped form at 2
  // stages (groups of at most 8, head dims 64 and 128, tile_tokens 0, probe 0); anything
  // else with warp_heads raises kvmm::Error (check_tc_warp_heads). kv_heads need not be a
  // multiple of 4 (the last CTA's extra warps idle). Its CTAs are 4x fewer: pick the split
  // count with tc_choose_num_splits.
  bool warp_heads = false;
};
void paged_decode_attention_tc(const PagedAttentionParams& p, Stream stream, std::uint32_t stages = 2,
                               std::uint32_t* merge_counters = nullptr, TcDecodeShape shape = {});
void contiguous_decode_attention_tc(const ContiguousAttentionParams& p, Stream stream, std::uint32_t stages = 2,
                                    std::uint32_t* merge_counters = nullptr, TcDecodeShape shape = {});

// Arrival counters the in-kernel split merge needs for a batch of `rows` decode rows of
// `q_heads` q heads (one per row, kv head and 16-head chunk; at most rows x q_heads).
inline std::size_t tc_merge_counters(std::uint32_t rows, std::uint32_t q_heads) { return std::size_t{rows} * q_heads; }

// Raises kvmm::Error naming `kernel`, stages and head_dim unless the ring can hold
// `stages` at `head_dim` (src/kernels/tc_decode_check.cpp).
void check_tc_stages(const char* kernel, std::uint32_t stages, std::uint32_t head_dim);

// Raises kvmm::Error naming `kernel` and shape.tile_tokens unless it is 0 or 16, or
// shape.heads_first with more than 65535 kv heads x head chunks or requests (grid y).
void check_tc_shape(const char* kernel, const TcDecodeShape& shape, std::uint32_t rows, std::uint32_t grid_heads);

// Raises kvmm::Error naming `kernel` and shape.probe unless it is 0, or 1-3 where `runs` (the
// launch is one the probes are built for: TcDecodeShape::probe).
void check_tc_probe(const char* kernel, const TcDecodeShape& shape, bool runs);

// Raises kvmm::Error naming `kernel` and shape.warp_heads when it is set and `runs` is false
// (the launch is not one heads across warps is built for: TcDecodeShape::warp_heads).
void check_tc_warp_heads(const char* kernel, const TcDecodeShape& shape, bool runs);

// choose_num_splits (kvmm/kernels/attention.hpp) for the CTAs `shape` launches: with
// warp_heads one CTA per 4 kv heads (groups of at most 8), so about 4x the splits of the
// default shape to fill the same SMs; the default's count otherwise.
std::uint32_t tc_choose_num_splits(std::uint32_t rows, std::uint32_t q_heads, std::uint32_t kv_heads,
                                   std::uint32_t max_kv_len, std::uint32_t num_sms, const TcDecodeShape& shape);

}  // namespace kvmm::kernels::experimental
