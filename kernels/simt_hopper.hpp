// Host emulation of the sm_90 asynchronous units that hopper.cuh wraps, on the per-warp
// scheduler of simt_host.hpp:
// - mbarrier (init, arrive, arrive.expect_tx, complete_tx, try_wait.parity): the state
//   (expected and pending arrivals, transaction bytes, phase) lives beside the 8-byte
//   shared word, keyed by its address; a phase completes when the pending arrivals reach
//   zero and the transaction count is zero; a wait on parity P blocks (Emulator::
//   wait_until) until the phase with parity P has completed.
// - the TMA tile load (cp.async.bulk.tensor, tile mode, rank 1..5): the box is gathered
//   at issue (coordinates out of the tensor zero-filled, the 128-byte swizzle applied on
//   the destination's address bits as the hardware does), the destination poisoned (all
//   bits set) and written only when the mbarrier phase that its complete_tx belongs to
//   completes: a read not ordered by that barrier's wait sees NaN.
// - wgmma.mma_async m64nNk16 (bf16/fp16, fp32 accumulate, A K-major in shared memory
//   through a matrix descriptor or in registers (mma.sync's A fragment), B K-major (no
//   swizzle or the 128-byte swizzle) or MN-major (128-byte swizzle)): each warp of
//   the warpgroup computes its 16 rows at issue (exact products, correctly rounded sum, as
//   mma_16816); the accumulator registers are poisoned and written at the issuing
//   thread's wgmma.wait_group; a wgmma that accumulates into registers still in flight
//   takes their pending values (the hardware's in-order accumulator chaining).
// Costs: a map lookup per mbarrier operation, one warp rendezvous per wgmma.
#pragma once

#include "simt_host.hpp"
#include "simt_traffic.hpp"
#include "simt_warp.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <stdexcept>
#include <vector>

namespace kvmm::simt {

// What the emulated TMA needs of a tensor map (on the device: the driver's 128 opaque bytes).
struct TensorMapDesc {
  const void* base = nullptr;
  unsigned rank = 0;              // 1..5
  std::uint64_t dims[5] = {};     // elements per dimension, innermost first
  std::uint64_t strides[5] = {};  // byte strides of dimensions 1..rank-1 (strides[0] unused)
  unsigned box[5] = {};           // box extent per dimension, elements
  unsigned elem_bytes = 2;
  bool swizzle128 = false;
};

// The 128-byte swizzle on a shared address: 16-byte chunk bits [4:6] ^= bits [7:9].
inline std::uintptr_t swizzle128(std::uintptr_t addr) { return addr ^ (((addr >> 7) & 7u) << 4); }

class Hopper {
 public:
  static Hopper& get() {
    static Hopper h;
    return h;
  }

  // mbarrier ----------------------------------------------------------------------
  void init(std::uint64_t* bar, unsigned count) {
    *bar = 0;
    Bar& b = bars_[bar];
    b = Bar{};
    b.expected = count;
    b.pending = count;
  }
  void arrive(std::uint64_t* bar, std::int64_t expect_tx) {
    Bar& b = at(bar);
    b.tx += expect_tx;
    if (b.pending == 0) throw std::logic_error("simt: mbarrier arrive past its expected count");
    --b.pending;
    settle(b);
  }
  void complete_tx(std::uint64_t* bar, std::int64_t bytes) {
    Bar& b = at(bar);
    b.tx -= bytes;
    settle(b);
  }
  // try_wait.parity P: true once the phase of parity P has completed.
  bool done(std::uint64_t* bar, unsigned parity) { return (at(bar).phase & 1u) != (parity & 1u); }
  void wait(std::uint64_t* bar, unsigned parity) {
    Emulator::get().wait_until([this, bar, parity] { return done(bar, parity); });
  }

  // TMA tile load --------------------------------------------------------------------
  void tma_load(void* smem, const TensorMapDesc& m, const int* coord, std::uint64_t* bar, std::uint32_t line) {
    unsigned total = 1;
    for (unsigned d = 0; d < m.rank; ++d) total *= m.box[d];
    const unsigned bytes = total * m.elem_bytes;
    std::vector<unsigned char> data(bytes, 0);
    unsigned idx[5] = {};
    for (unsigned e = 0; e < total; ++e) {
      unsigned rest = e;
      for (unsigned d = 0; d < m.rank; ++d) {
        idx[d] = rest % m.box[d];
        rest /= m.box[d];
      }
      std::int64_t off = 0;
      bool inside = true;
      for (unsigned d = 0; d < m.rank; ++d) {
        const std::int64_t c = std::int64_t{coord[d]} + idx[d];
        if (c < 0 || static_cast<std::uint64_t>(c) >= m.dims[d]) inside = false;
        off += c * static_cast<std::int64_t>(d == 0 ? m.elem_bytes : m.strides[d]);
      }
      if (!inside) continue;  // zero fill
      const char* src = static_cast<const char*>(m.base) + off;
      note_access(src, m.elem_bytes, Space::kGlobal, Kind::kLoad, line);
      std::memcpy(&data[std::size_t{e} * m.elem_bytes], src, m.elem_bytes);
    }
    Bar& b = at(bar);
    Pending p{smem, std::move(data), m.swizzle128};
    poison(p);
    b.copies.push_back(std::move(p));
    complete_tx(bar, bytes);  // the bytes count at once; the data lands with the phase
  }

  // wgmma ------------------------------------------------------------------------------
  struct Result {
    float* d;
    std::vector<float> v;
  };
  void wgmma_issue(Result r) {
    auto& t = thread();
    for (std::size_t i = 0; i < r.v.size(); ++i) r.d[i] = std::numeric_limits<float>::quiet_NaN();
    t.open.push_back(std::move(r));
  }
  // The value register d[i] will have once every wgmma of this thread in flight retired.
  float pending_value(const float* d, unsigned i) {
    auto& t = thread();
    for (auto it = t.open.rbegin(); it != t.open.rend(); ++it)
      if (it->d == d) return it->v[i];
    for (auto g = t.groups.rbegin(); g != t.groups.rend(); ++g)
      for (auto it = g->rbegin(); it != g->rend(); ++it)
        if (it->d == d) return it->v[i];
    return d[i];
  }
  void wgmma_commit() {
    auto& t = thread();
    t.groups.push_back(std::move(t.open));
    t.open.clear();
  }
  void wgmma_wait(unsigned pending) {
    auto& t = thread();
    while (t.groups.size() > pending) {
      for (const Result& r : t.groups.front()) std::copy(r.v.begin(), r.v.end(), r.d);
      t.groups.pop_front();
    }
  }

  static void begin(unsigned threads) {
    Hopper& h = get();
    h.bars_.clear();
    h.threads_.assign(threads, Thread{});
  }
  static void end() {
    Hopper& h = get();
    h.bars_.clear();
    h.threads_.clear();
  }

 private:
  struct Pending {
    void* dst;
    std::vector<unsigned char> data;
    bool swizzle;
  };
  struct Bar {
    unsigned expected = 0, pending = 0, phase = 0;
    std::int64_t tx = 0;
    std::vector<Pending> copies;
  };
  struct Thread {
    std::vector<Result> open;
    std::deque<std::vector<Result>> groups;
  };
  static void place(const Pending& p, const unsigned char* bytes) {
    for (std::size_t i = 0; i < p.data.size(); i += 16) {
      const auto a = reinterpret_cast<std::uintptr_t>(p.dst) + i;
      const std::size_t n = std::min<std::size_t>(16, p.data.size() - i);
      std::memcpy(reinterpret_cast<void*>(p.swizzle ? swizzle128(a) : a), bytes + i, n);
    }
  }
  static void poison(const Pending& p) {
    const std::vector<unsigned char> ones(p.data.size(), 0xff);
    place(p, ones.data());
  }
  Bar& at(std::uint64_t* bar) {
    auto it = bars_.find(bar);
    if (it == bars_.end()) throw std::logic_error("simt: mbarrier used before mbarrier.init");
    return it->second;
  }
  void settle(Bar& b) {
    if (b.pending != 0 || b.tx != 0) return;
    for (const Pending& p : b.copies) place(p, p.data.data());
    b.copies.clear();
    ++b.phase;
    b.pending = b.expected;
  }
  Thread& thread() {
    if (threads_.size() < blockDim.x) threads_.resize(blockDim.x);
    return threads_.at(threadIdx.x);
  }
  Hopper() { Emulator::get().add_hooks(BlockHooks{&Hopper::begin, &Hopper::end}); }
  std::map<std::uint64_t*, Bar> bars_;
  std::vector<Thread> threads_;
};

// A shared-memory matrix descriptor of wgmma, decoded (PTX ISA "Matrix Descriptor
// Format": start address >> 4 in bits 0-13, leading-dimension byte offset >> 4 in
// 16-29, stride-dimension byte offset >> 4 in 32-45, swizzle mode in 62-63: 0 none,
// 1 = 128 B). On the host the descriptor also carries the full start pointer.
struct DescView {
  const unsigned char* start;
  std::uint64_t lbo, sbo;
  bool swizzle128;
};

// Byte address of element (row, k) of a K-major operand (rows = M or N, k < 16 of this
// k-step): no swizzle: 8x8 core matrices of 8 rows x 16 contiguous bytes, core (row/8,
// k/8) at start + (row/8) * SBO + (k/8) * LBO; 128-byte swizzle: rows of 128 bytes in
// 1024-byte atoms of 8 rows, atoms SBO apart, the swizzle applied on the address bits.
inline const unsigned char* desc_element(const DescView& v, unsigned row, unsigned k) {
  if (!v.swizzle128) {
    return v.start + (row / 8) * v.sbo + (k / 8) * v.lbo + (row % 8) * 16 + (k % 8) * 2;
  }
  const auto a = reinterpret_cast<std::uintptr_t>(v.start) + (row / 8) * v.sbo + (row % 8) * 128 + k * 2;
  return reinterpret_cast<const unsigned char*>(swizzle128(a));
}

// Byte address of element (k, n) of an MN-major operand (PTX ISA: the transposed
// layouts, wgmma's imm-trans = 1) under the 128-byte swizzle: K rows of 64 contiguous
// two-byte elements (128 bytes), 8 K rows per 1024-byte atom, atoms SBO apart along K,
// 64-element panels LBO apart along N (M), the swizzle applied on the address bits.
inline const unsigned char* desc_element_mn(const DescView& v, unsigned n, unsigned k) {
  if (!v.swizzle128) throw std::logic_error("simt: an MN-major wgmma operand without the 128-byte swizzle");
  const auto a =
      reinterpret_cast<std::uintptr_t>(v.start) + (n / 64) * v.lbo + (k / 8) * v.sbo + (k % 8) * 128 + (n % 64) * 2;
  return reinterpret_cast<const unsigned char*>(swizzle128(a));
}

// One warp's part of wgmma m64nNk16: rows 16 (warp % 4) .. + 15 of D (N / 2 floats per
// lane). A from shared memory (`a`, K-major) or, when a_regs is set, from the warp's
// registers (four .b32 per lane in mma.m16n8k16's A layout: the rendezvous gathers them);
// B K-major or, with b_mn_major, MN-major.
inline void wgmma_warp(bool bf16, int n, float* d, const DescView& a, const std::uint32_t* a_regs, const DescView& b,
                       bool b_mn_major, bool accumulate, std::uint32_t line) {
  const unsigned lane = threadIdx.x % 32, w = (threadIdx.x / 32) % 4;
  std::uint16_t areg[16][16];  // the warp's 16 x 16 A from registers
  Emulator::get().warp_collective((bf16 ? 3200 : 3202) + (a_regs != nullptr ? 4 : 0),
                                  [&](LaneRecord& rec) {
                                    if (a_regs != nullptr) std::copy(a_regs, a_regs + 4, rec.r);
                                  },
                                  [&](const LaneRecord* warp, unsigned) {
                                    if (a_regs == nullptr) return;
                                    for (unsigned r = 0; r < 16; ++r)
                                      for (unsigned k = 0; k < 16; ++k) {
                                        const Owner o = a_owner(r, k);
                                        areg[r][k] = half_at(warp[o.lane].r, o.index);
                                      }
                                  });
  Hopper& h = Hopper::get();
  Hopper::Result r{d, std::vector<float>(static_cast<std::size_t>(n / 2))};
  for (int j = 0; j < n / 8; ++j) {
    for (unsigned i = 0; i < 4; ++i) {
      const unsigned row = 16 * w + lane / 4 + (i >= 2 ? 8 : 0), col = 8 * j + (lane % 4) * 2 + (i & 1u);
      const unsigned reg = 4 * j + i;
      double acc = accumulate ? h.pending_value(d, reg) : 0.0;
      for (unsigned k = 0; k < 16; ++k) {
        std::uint16_t ea, eb;
        if (a_regs != nullptr) {
          ea = areg[row % 16][k];
        } else {
          std::memcpy(&ea, desc_element(a, row, k), 2);
        }
        std::memcpy(&eb, b_mn_major ? desc_element_mn(b, col, k) : desc_element(b, col, k), 2);
        acc += (bf16 ? kernels::bf16_to_float(ea) : kernels::f16_to_float(ea)) *
               static_cast<double>(bf16 ? kernels::bf16_to_float(eb) : kernels::f16_to_float(eb));
      }
      r.v[reg] = static_cast<float>(acc);
    }
  }
  (void)line;
  h.wgmma_issue(std::move(r));
}

}  // namespace kvmm::simt
