// Host emulation of the tensor-core and asynchronous-copy instructions that
// tensor_core.cuh and memory.cuh wrap, on the warp rendezvous of simt_host.hpp:
// - mma.sync.m16n8k16 (bf16 or fp16 inputs, fp32 accumulate): each lane's 4 outputs are
//   the exactly rounded sum of the 16 products (exact in double) plus its accumulator;
//   on integer-valued data this equals hardware bit for bit, otherwise hardware's own
//   accumulation order may differ by a few ulp.
// - ldmatrix .m8n8 .x1/.x2/.x4 (.trans) .b16: matrix m takes the row addresses of lanes
//   8m..8m+7; the other lanes' addresses are never read.
// - movmatrix .m8n8 .trans .b16: an 8x8 fragment transposed across the warp.
// - cp.async 4/8/16 bytes with a source size (the rest zero-filled), commit_group and
//   wait_group: the destination is poisoned (all bits set: NaN in fp16/bf16/fp32) at
//   issue and written when the issuing thread's wait_group retires its group, so a read
//   before the wait (or before the barrier that follows it, for another thread's copy)
//   sees NaN. The source is read at issue. Groups left at the end of a CTA are dropped.
// The element owner maps below are written from the PTX ISA's fragment layouts, inverted
// (tests/kernels/tensor_core_test.cpp checks them against the forward layouts). The cost
// is two CTA barriers per instruction: microseconds each.
#pragma once

#include "simt_host.hpp"
#include "simt_traffic.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <vector>

namespace kvmm::simt {

// Owner (lane, 16-bit element index in the lane's registers) of element (row, col) of
// the m16n8k16 operands, and of the 16x8 accumulator (lane, float index).
struct Owner {
  unsigned lane;
  unsigned index;
};
inline Owner a_owner(unsigned row, unsigned col) {  // A: 16x16, four .b32 = 8 halves
  return Owner{(row % 8) * 4 + (col % 8) / 2, (col >= 8 ? 4u : 0u) + (row >= 8 ? 2u : 0u) + (col & 1u)};
}
inline Owner b_owner(unsigned row, unsigned col) {  // B: 16x8 (k x n), two .b32 = 4 halves
  return Owner{col * 4 + (row % 8) / 2, (row >= 8 ? 2u : 0u) + (row & 1u)};
}
inline Owner c_owner(unsigned row, unsigned col) {  // C/D: 16x8 fp32, 4 floats
  return Owner{(row % 8) * 4 + col / 2, (row >= 8 ? 2u : 0u) + (col & 1u)};
}

inline std::uint16_t half_at(const std::uint32_t* regs, unsigned index) {
  return static_cast<std::uint16_t>(regs[index / 2] >> (16 * (index & 1u)));
}
inline double element(bool bf16, std::uint16_t h) {
  return bf16 ? kernels::bf16_to_float(h) : kernels::f16_to_float(h);
}

inline void mma_16816(bool bf16, float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                      const float (&c)[4]) {
  float out[4];
  Emulator::get().warp_collective(
      bf16 ? 3000 : 3002,
      [&](LaneRecord& rec) {
        std::copy(a, a + 4, rec.r);
        rec.r[4] = b[0];
        rec.r[5] = b[1];
      },
      [&](const LaneRecord* warp, unsigned lane) {
        for (unsigned i = 0; i < 4; ++i) {
          const unsigned row = lane / 4 + (i >= 2 ? 8 : 0), col = (lane % 4) * 2 + (i & 1u);
          double acc = c[i];
          for (unsigned k = 0; k < 16; ++k) {
            const Owner oa = a_owner(row, k), ob = b_owner(k, col);
            acc += element(bf16, half_at(warp[oa.lane].r, oa.index)) *
                   element(bf16, half_at(warp[ob.lane].r + 4, ob.index));
          }
          out[i] = static_cast<float>(acc);
        }
      });
  std::copy(out, out + 4, d);
}

template <int N, bool Trans>
inline void ldmatrix(std::uint32_t (&r)[N], const void* row_addr, std::uint32_t line) {
  static_assert(N == 1 || N == 2 || N == 4);
  const unsigned me = threadIdx.x % 32;
  note_access(row_addr, me < 8u * N ? 16 : 0, Space::kShared, Kind::kLdmatrix, line);
  std::uint32_t out[N];
  Emulator::get().warp_collective(
      3100 + 4 * N + (Trans ? 2 : 0), [&](LaneRecord& rec) { rec.p = me < 8u * N ? row_addr : nullptr; },
      [&](const LaneRecord* warp, unsigned lane) {
        for (int m = 0; m < N; ++m) {
          std::uint16_t e[2];
          for (unsigned j = 0; j < 2; ++j) {
            // Lane l holds row l/4, columns 2(l%4)+j; transposed: row 2(l%4)+j, column l/4.
            const unsigned row = Trans ? (lane % 4) * 2 + j : lane / 4;
            const unsigned col = Trans ? lane / 4 : (lane % 4) * 2 + j;
            std::memcpy(&e[j], static_cast<const char*>(warp[8 * m + row].p) + 2 * col, 2);
          }
          out[m] = std::uint32_t{e[0]} | (std::uint32_t{e[1]} << 16);
        }
      });
  std::copy(out, out + N, r);
}

// movmatrix.sync.aligned.m8n8.trans.b16: the 8x8 matrix of 16-bit elements whose row l / 4,
// columns 2 (l % 4) and 2 (l % 4) + 1 lane l holds, transposed, in the same layout.
inline std::uint32_t movmatrix_trans(std::uint32_t x) {
  std::uint32_t out = 0;
  Emulator::get().warp_collective(
      3300, [&](LaneRecord& rec) { rec.r[0] = x; },
      [&](const LaneRecord* warp, unsigned lane) {
        for (unsigned j = 0; j < 2; ++j) {
          // Element (row lane / 4, column 2 (lane % 4) + j) of the result is element (that
          // column, that row) of the source: lane 4 col + row / 2, half row % 2.
          const unsigned row = lane / 4, col = (lane % 4) * 2 + j;
          const std::uint32_t src = warp[col * 4 + row / 2].r[0];
          out |= ((src >> (16 * (row % 2))) & 0xffffu) << (16 * j);
        }
      });
  return out;
}

// The cp.async groups of every thread of the running CTA.
class AsyncCopies {
 public:
  static AsyncCopies& get() {
    static AsyncCopies q;
    return q;
  }
  void issue(void* dst, const void* src, unsigned cp_size, unsigned src_size) {
    if (threads_.size() < blockDim.x) threads_.resize(blockDim.x);  // the first CTA: hooks set mid-CTA
    Thread& t = threads_.at(threadIdx.x);
    Copy c{dst, cp_size, {}};
    const unsigned n = std::min(src_size, cp_size);
    if (n > 0) std::memcpy(c.data, src, n);
    std::memset(dst, 0xff, cp_size);  // poison until the wait
    t.open.push_back(c);
  }
  void commit() {
    if (threads_.size() < blockDim.x) threads_.resize(blockDim.x);
    Thread& t = threads_.at(threadIdx.x);
    t.groups.push_back(std::move(t.open));
    t.open.clear();
  }
  void wait(unsigned pending) {
    if (threads_.size() < blockDim.x) threads_.resize(blockDim.x);
    Thread& t = threads_.at(threadIdx.x);
    while (t.groups.size() > pending) {
      for (const Copy& c : t.groups.front()) std::memcpy(c.dst, c.data, c.bytes);
      t.groups.pop_front();
    }
  }
  static void begin(unsigned threads) { get().threads_.assign(threads, Thread{}); }
  static void end() { get().threads_.clear(); }

 private:
  struct Copy {
    void* dst;
    unsigned bytes;
    unsigned char data[16];
  };
  struct Thread {
    std::vector<Copy> open;
    std::deque<std::vector<Copy>> groups;
  };
  AsyncCopies() { Emulator::get().add_hooks(BlockHooks{&AsyncCopies::begin, &AsyncCopies::end}); }
  std::vector<Thread> threads_;
};

}  // namespace kvmm::simt
