// The sm_90 primitives (kernels/hopper.cuh) under the host emulation, against the PTX ISA
// written independently in tests/kernels/ptx_layouts.hpp: the wgmma accumulator layout as
// a bijection; the descriptor's bit fields; wgmma m64n{8,16,64}k16 on integer data equal
// to a triple loop exactly, with A and B placed by the ISA's K-major layouts (no swizzle
// and 128-byte swizzle, several k-steps), and n64 with A from registers (the ISA's A
// fragment) and B MN-major (the ISA's 128-byte swizzled MN-major layout); accumulators poisoned until wgmma.wait_group,
// chained accumulation in flight; mbarrier phases and parity; the TMA tile load with zero fill outside the tensor and
// the 128-byte swizzle, its data invisible before the barrier's wait (a planted early read fails), a wait nobody
// completes reported; tensor-map checks.
#if defined(__SANITIZE_ADDRESS__)
// Fiber stacks switched with longjmp confuse AddressSanitizer: release CI job only.
#else
#define KVMM_SIMT_HOST 1
#include "../../kernels/hopper.cuh"
#include "kernels/ptx_layouts.hpp"

#include <catch2/catch.hpp>

#include <kvmm/error.hpp>

#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace kvmm;
namespace dev = kvmm::kernels::device;
using namespace kvmm::test::ptx;

namespace {

std::uint16_t to_bits(bool bf16, float f) { return bf16 ? kernels::float_to_bf16(f) : kernels::float_to_f16(f); }

// A wgmma test's operands: A (64 x K) and B (N x K), K = 16 ksteps, small integers
// (exact in both dtypes and in fp32 sums).
struct WgmmaOperands {
  int K;
  std::vector<float> A, B;
};
WgmmaOperands wgmma_operands(int n, int ksteps, std::uint32_t seed) {
  WgmmaOperands o{16 * ksteps, {}, {}};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-6, 6);
  o.A.resize(static_cast<std::size_t>(64 * o.K));
  o.B.resize(static_cast<std::size_t>(n * o.K));
  for (float& x : o.A) x = static_cast<float>(small(rng));
  for (float& x : o.B) x = static_cast<float>(small(rng));
  return o;
}

// Runs one warpgroup (128 emulated threads): accumulators set to garbage the first step
// must ignore, the fence, step(d, s) for each k-step (chained on accumulators still in
// flight), commit, wait; gathers D by the ISA's accumulator layout and checks D = A B^T
// against a triple loop, exactly. `what` names the case in a failure.
template <int N, typename Step>
void check_wgmma(const WgmmaOperands& o, int ksteps, const std::string& what, Step step) {
  std::vector<float> D(64 * N, NAN);
  REQUIRE(simt::launch(dim3(1), 128, [&] {
    float d[N / 2];
    for (float& x : d) x = 1e30f;
    dev::wgmma_fence();
    for (int s = 0; s < ksteps; ++s) step(d, s);
    dev::wgmma_commit();
    dev::wgmma_wait<0>();
    for (unsigned i = 0; i < N / 2; ++i) {
      const RC e = ptx_wgmma_d(threadIdx.x, i);
      D[e.row * N + e.col] = d[i];
    }
  }));
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double want = 0;
      for (int k = 0; k < o.K; ++k) want += double(o.A[m * o.K + k]) * o.B[n * o.K + k];
      INFO("m " << m << " n " << n << " " << what);
      REQUIRE(D[m * N + n] == static_cast<float>(want));
    }
}

// wgmma m64nNk16 with A and B K-major in shared memory, without swizzle or under the
// 128-byte swizzle (placed by the ISA's K-major layouts).
template <typename T, int N>
void run_wgmma(bool swizzle, int ksteps, std::uint32_t seed) {
  constexpr bool bf16 = std::is_same_v<T, dev::BFloat>;
  const WgmmaOperands o = wgmma_operands(N, ksteps, seed);
  const int K = o.K;
  alignas(1024) static unsigned char a_smem[64 * 64 * 2], b_smem[64 * 64 * 2];
  std::memset(a_smem, 0xee, sizeof a_smem);
  std::memset(b_smem, 0xee, sizeof b_smem);
  // No swizzle: LBO 128 (the two core matrices of a k-step), SBO 256 (8-row groups), one
  // k-step every 8 * rows * 2 bytes... laid out per k-step block. 128-byte swizzle: K = 64.
  const unsigned lbo = 128, sbo_none = 256, sbo_sw = 1024;
  auto place = [&](unsigned char* smem, const std::vector<float>& M, int rows) {
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < K; ++k) {
        const std::uint16_t h = to_bits(bf16, M[r * K + k]);
        unsigned off;
        if (swizzle) {
          off = ptx_kmajor_sw128(r, k, sbo_sw);
        } else {  // k-step s occupies its own block of rows / 8 core-matrix pairs
          off = static_cast<unsigned>(k / 16) * (rows / 8) * sbo_none + ptx_kmajor_none(r, k % 16, lbo, sbo_none);
        }
        std::memcpy(smem + off, &h, 2);
      }
  };
  place(a_smem, o.A, 64);
  place(b_smem, o.B, N);
  check_wgmma<N>(o, ksteps, "swizzle " + std::to_string(swizzle), [&](float(&d)[N / 2], int s) {
    const unsigned step_a = swizzle ? 32u * s : static_cast<unsigned>(s) * 8 * sbo_none;
    const unsigned step_b = swizzle ? 32u * s : static_cast<unsigned>(s) * (N / 8) * sbo_none;
    const auto da = dev::make_smem_desc(a_smem + step_a, lbo, swizzle ? sbo_sw : sbo_none, swizzle);
    const auto db = dev::make_smem_desc(b_smem + step_b, lbo, swizzle ? sbo_sw : sbo_none, swizzle);
    dev::wgmma_m64k16<T, N>(d, da, db, s > 0);
  });
}

// wgmma m64n64k16 with A from registers (placed by the ISA's register fragment of A) or
// from shared memory (K-major, 128-byte swizzle), B MN-major under the 128-byte swizzle
// (placed by the ISA's MN-major layout; `sbo` between 8-row K groups, packed or not) or
// K-major.
template <typename T>
void run_wgmma_n64(bool reg_a, bool trans_b, int ksteps, unsigned sbo, std::uint32_t seed) {
  constexpr bool bf16 = std::is_same_v<T, dev::BFloat>;
  constexpr int N = 64;
  const WgmmaOperands o = wgmma_operands(N, ksteps, seed);
  const int K = o.K;
  alignas(1024) static unsigned char a_smem[64 * 64 * 2], b_smem[4 * 64 * 64 * 2];
  std::memset(a_smem, 0xee, sizeof a_smem);
  std::memset(b_smem, 0xee, sizeof b_smem);
  for (int r = 0; r < 64; ++r)
    for (int k = 0; k < K; ++k) {
      const std::uint16_t h = to_bits(bf16, o.A[r * K + k]);
      std::memcpy(a_smem + ptx_kmajor_sw128(r, k, 1024), &h, 2);
    }
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      const std::uint16_t h = to_bits(bf16, o.B[n * K + k]);
      // The MN-major panel stride (LBO) is never used at N = 64: 0xee poison at 8192.
      const unsigned off = trans_b ? ptx_mnmajor_sw128(n, k, 8192, sbo) : ptx_kmajor_sw128(n, k, 1024);
      std::memcpy(b_smem + off, &h, 2);
    }
  const std::string what =
      "reg_a " + std::to_string(reg_a) + " trans_b " + std::to_string(trans_b) + " sbo " + std::to_string(sbo);
  check_wgmma<N>(o, ksteps, what, [&](float(&d)[N / 2], int s) {
    const auto db = trans_b ? dev::make_smem_desc(b_smem + 2 * sbo * s, 8192, sbo, true)
                            : dev::make_smem_desc(b_smem + 32u * s, 16, 1024, true);
    if (reg_a) {
      std::uint32_t a[4];
      for (unsigned j = 0; j < 4; ++j) {
        std::uint16_t h2[2];
        for (unsigned e = 0; e < 2; ++e) {
          const RC rc = ptx_wgmma_a(threadIdx.x, 2 * j + e);
          h2[e] = to_bits(bf16, o.A[rc.row * K + 16 * s + rc.col]);
        }
        a[j] = h2[0] | (std::uint32_t{h2[1]} << 16);
      }
      if (trans_b)
        dev::wgmma_m64n64k16_rs<T, true>(d, a, db, s > 0);
      else
        dev::wgmma_m64n64k16_rs<T, false>(d, a, db, s > 0);
    } else {
      const auto da = dev::make_smem_desc(a_smem + 32u * s, 16, 1024, true);
      if (trans_b)
        dev::wgmma_m64k16<T, N, true>(d, da, db, s > 0);
      else
        dev::wgmma_m64k16<T, N>(d, da, db, s > 0);
    }
  });
}

}  // namespace

TEST_CASE("wgmma accumulator layout and descriptor fields per the PTX ISA", "[kernels][simt][hopper]") {
  for (unsigned n : {8u, 16u, 64u}) {
    std::set<std::pair<unsigned, unsigned> > seen;
    for (unsigned t = 0; t < 128; ++t)
      for (unsigned i = 0; i < n / 2; ++i) {
        const RC e = ptx_wgmma_d(t, i);
        REQUIRE(e.row < 64);
        REQUIRE(e.col < n);
        seen.insert({e.row, e.col});
      }
    CHECK(seen.size() == 64 * n);  // 128 threads x N/2 registers cover 64 x N once
  }
  alignas(4096) static unsigned char smem[4096];  // within one 2^18-byte window (the start field's)
  const auto d = dev::make_smem_desc(smem + 1024 + 32, 128, 1024, true);
  const DescFields f = ptx_desc(d.bits);
  CHECK(f.start == ((reinterpret_cast<std::uintptr_t>(smem) + 1024 + 32) & 0x3ffff));
  CHECK(f.lbo == 128);
  CHECK(f.sbo == 1024);
  CHECK(f.base_offset == 0);
  CHECK(f.swizzle == 1);
  CHECK(ptx_desc(dev::make_smem_desc(smem, 256, 512, false).bits).swizzle == 0);
  // desc_advance: the descriptor of the address `bytes` further on, as built from it.
  for (std::uint32_t bytes : {0u, 16u, 32u, 96u, 1024u, 2048u + 32u, 3056u})
    CHECK(dev::desc_advance(dev::make_smem_desc(smem, 1024, 1024, true), bytes).bits ==
          dev::make_smem_desc(smem + bytes, 1024, 1024, true).bits);
}

TEST_CASE("emulated wgmma m64nNk16 equals a triple loop on the ISA's K-major layouts", "[kernels][simt][hopper]") {
  run_wgmma<dev::BFloat, 16>(false, 1, 1);
  run_wgmma<dev::BFloat, 8>(false, 3, 2);
  run_wgmma<dev::Half, 16>(false, 2, 3);
  run_wgmma<dev::BFloat, 16>(true, 4, 4);  // 128-byte swizzle, 4 k-steps in one 128-byte row
  run_wgmma<dev::Half, 8>(true, 4, 5);
  run_wgmma<dev::BFloat, 64>(true, 4, 6);  // n64: the S = Q K^T form of hopper_prefill.cuh
}

TEST_CASE("wgmma n64 with A from registers and an MN-major B equals a triple loop", "[kernels][simt][hopper]") {
  // The A register fragment is a bijection onto 64 x 16 (one element per thread and slot).
  std::set<std::pair<unsigned, unsigned> > seen;
  for (unsigned t = 0; t < 128; ++t)
    for (unsigned i = 0; i < 8; ++i) {
      const RC e = ptx_wgmma_a(t, i);
      REQUIRE(e.row < 64);
      REQUIRE(e.col < 16);
      seen.insert({e.row, e.col});
    }
  CHECK(seen.size() == 64 * 16);
  run_wgmma_n64<dev::BFloat>(true, true, 4, 1024, 11);   // the P V form of hopper_prefill.cuh
  run_wgmma_n64<dev::BFloat>(true, true, 2, 2048, 12);   // K groups not packed: SBO is the K stride
  run_wgmma_n64<dev::Half>(false, true, 3, 1024, 13);    // shared A, MN-major B
  run_wgmma_n64<dev::BFloat>(true, false, 4, 1024, 14);  // register A, K-major B
}

TEST_CASE("wgmma accumulators are poisoned until wgmma.wait_group", "[kernels][simt][hopper]") {
  alignas(1024) static unsigned char a[64 * 32], b[16 * 32];
  for (unsigned i = 0; i < sizeof a / 2; ++i) reinterpret_cast<std::uint16_t*>(a)[i] = kernels::float_to_bf16(1.0f);
  for (unsigned i = 0; i < sizeof b / 2; ++i) reinterpret_cast<std::uint16_t*>(b)[i] = kernels::float_to_bf16(2.0f);
  std::vector<int> early_nan(128, 0), late(128, 0);
  REQUIRE(simt::launch(dim3(1), 128, [&] {
    float d[8] = {};
    dev::wgmma_m64k16<dev::BFloat, 16>(d, dev::make_smem_desc(a, 128, 256, false),
                                       dev::make_smem_desc(b, 128, 256, false), false);
    dev::wgmma_commit();
    early_nan[threadIdx.x] = std::isnan(d[0]);  // the planted early read
    dev::wgmma_wait<0>();
    late[threadIdx.x] = d[0] == 32.0f && d[7] == 32.0f;  // 16 products of 1 x 2
  }));
  for (unsigned t = 0; t < 128; ++t) {
    CHECK(early_nan[t] == 1);
    CHECK(late[t] == 1);
  }
}

TEST_CASE("mbarrier phases, TMA tile loads with zero fill and swizzle, visible after the wait",
          "[kernels][simt][hopper]") {
  // A 2-D bf16 tensor of 20 rows x 70 columns, rows 160 bytes apart; box 64 x 8 at (8, 16):
  // columns 8..71 (70, 71 outside) and rows 16..23 (20..23 outside) zero-filled.
  std::vector<std::uint16_t> g(20 * 80);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<std::uint16_t>(i + 1);
  dev::TensorMapSpec spec;
  spec.base = g.data();
  spec.rank = 2;
  spec.dims[0] = 70;
  spec.dims[1] = 20;
  spec.strides[1] = 160;
  spec.box[0] = 64;
  spec.box[1] = 8;
  spec.swizzle128 = true;
  const dev::TensorMap map = dev::host_tensor_map(spec);
  alignas(1024) static std::uint16_t tile[8 * 64];
  static std::uint64_t bar;
  std::vector<int> phases(128, 0);
  int early_poison = 0, early_try = -1;
  bool bad = false;
  REQUIRE(simt::launch(dim3(1), 128, [&] {
    if (threadIdx.x == 0) {
      dev::mbar_init(&bar, 2);  // two arrivals: thread 0 (with the bytes) and thread 32
      dev::fence_mbarrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      dev::tma_load<2>(tile, map, {8, 16}, &bar);  // bytes complete before the expect: allowed
      dev::mbar_arrive_expect_tx(&bar, sizeof tile);
    }
    // Thread 1 runs after thread 0 issued the load, before thread 32's arrival completes
    // the phase: its read is not ordered by the barrier and sees the poison.
    if (threadIdx.x == 1) early_poison = tile[0] == 0xffff;
    if (threadIdx.x == 32) {
      early_try = dev::mbar_try_wait(&bar, 0);  // one arrival of two: phase 0 still open
      dev::mbar_arrive(&bar);
    }
    dev::mbar_wait(&bar, 0);
    phases[threadIdx.x] = dev::mbar_try_wait(&bar, 0) && !dev::mbar_try_wait(&bar, 1);
    for (unsigned r = threadIdx.x / 16; r < 8; r += 8)
      for (unsigned c = 0; c < 64; ++c) {
        const unsigned gr = 16 + r, gc = 8 + c;
        const std::uint16_t want = gr < 20 && gc < 70 ? g[gr * 80 + gc] : 0;
        const unsigned off = r * 128 + ((c * 2 / 16) ^ (r % 8)) * 16 + (c * 2) % 16;  // the ISA's 128-byte swizzle
        if (tile[off / 2] != want) bad = true;
      }
  }));
  CHECK_FALSE(bad);
  CHECK(early_poison == 1);
  CHECK(early_try == 0);
  for (int p : phases) CHECK(p == 1);  // phase 0 completed, phase 1 open, for every thread
}

TEST_CASE("the GPU probe's pipeline under the emulator: 3-D TMA boxes into wgmma's layout", "[kernels][simt][hopper]") {
  // As tests/kernels/static/hopper_probe.cu: A [64][16] and B [16][16] bf16 row-major in
  // global memory, viewed as {8 k, rows, 2 k-halves} (strides 32 and 16 bytes): the box
  // lands as [k-half][row][8], i.e. core matrices of 8 rows x 16 bytes, k-halves
  // rows x 16 bytes apart (LBO), 8-row groups 128 bytes apart (SBO).
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> small(-6, 6);
  std::vector<float> A(64 * 16), B(16 * 16);
  std::vector<std::uint16_t> a(A.size()), b(B.size());
  for (std::size_t i = 0; i < A.size(); ++i) a[i] = kernels::float_to_bf16(A[i] = float(small(rng)));
  for (std::size_t i = 0; i < B.size(); ++i) b[i] = kernels::float_to_bf16(B[i] = float(small(rng)));
  auto spec = [](const void* base, unsigned rows) {
    dev::TensorMapSpec s;
    s.base = base;
    s.rank = 3;
    s.dims[0] = 8;
    s.dims[1] = rows;
    s.dims[2] = 2;
    s.strides[1] = 32;
    s.strides[2] = 16;
    s.box[0] = 8;
    s.box[1] = rows;
    s.box[2] = 2;
    return s;
  };
  const dev::TensorMap ma = dev::host_tensor_map(spec(a.data(), 64)), mb = dev::host_tensor_map(spec(b.data(), 16));
  alignas(1024) static std::uint16_t sa[64 * 16], sb[16 * 16];
  static std::uint64_t bar;
  std::vector<float> out(128 * 8, NAN);
  REQUIRE(simt::launch(dim3(1), 128, [&] {
    if (threadIdx.x == 0) dev::mbar_init(&bar, 1);
    __syncthreads();
    if (threadIdx.x == 0) {
      dev::mbar_arrive_expect_tx(&bar, sizeof sa + sizeof sb);
      dev::tma_load<3>(sa, ma, {0, 0, 0}, &bar);
      dev::tma_load<3>(sb, mb, {0, 0, 0}, &bar);
    }
    dev::mbar_wait(&bar, 0);
    float d[8] = {};
    dev::wgmma_fence();
    dev::wgmma_m64k16<dev::BFloat, 16>(d, dev::make_smem_desc(sa, 64 * 16, 128, false),
                                       dev::make_smem_desc(sb, 16 * 16, 128, false), false);
    dev::wgmma_commit();
    dev::wgmma_wait<0>();
    for (unsigned i = 0; i < 8; ++i) out[threadIdx.x * 8 + i] = d[i];
  }));
  for (unsigned t = 0; t < 128; ++t)
    for (unsigned i = 0; i < 8; ++i) {
      const RC e = ptx_wgmma_d(t, i);
      double want = 0;
      for (unsigned k = 0; k < 16; ++k) want += double(A[e.row * 16 + k]) * B[e.col * 16 + k];
      REQUIRE(out[t * 8 + i] == static_cast<float>(want));
    }
}

TEST_CASE("an mbarrier wait that nothing completes is reported", "[kernels][simt][hopper]") {
  static std::uint64_t bar;
  CHECK_FALSE(simt::launch(dim3(1), 32, [&] {
    if (threadIdx.x == 0) dev::mbar_init(&bar, 33);  // 33 arrivals expected, 32 come
    __syncthreads();
    dev::mbar_arrive(&bar);
    dev::mbar_wait(&bar, 0);
  }));
}

TEST_CASE("tensor map specs the hardware refuses raise kvmm::Error", "[kernels][hopper]") {
  alignas(16) static std::uint16_t g[1024];
  dev::TensorMapSpec ok;
  ok.base = g;
  ok.rank = 2;
  ok.dims[0] = 64;
  ok.dims[1] = 16;
  ok.strides[1] = 128;
  ok.box[0] = 64;
  ok.box[1] = 16;
  ok.swizzle128 = true;
  CHECK_NOTHROW(dev::check_tensor_map(ok));
  auto bad = [&](auto mutate, const char* needle) {
    dev::TensorMapSpec s = ok;
    mutate(s);
    CHECK_THROWS_WITH(dev::check_tensor_map(s), Catch::Contains(needle));
  };
  bad([](dev::TensorMapSpec& s) { s.base = reinterpret_cast<const char*>(g) + 8; }, "16-byte aligned");
  bad([](dev::TensorMapSpec& s) { s.rank = 6; }, "rank = 6");
  bad([](dev::TensorMapSpec& s) { s.strides[1] = 136; }, "strides[1] = 136");
  bad([](dev::TensorMapSpec& s) { s.strides[1] = std::uint64_t{1} << 40; }, "strides[1]");
  bad([](dev::TensorMapSpec& s) { s.box[1] = 257; }, "box[1] = 257");
  bad([](dev::TensorMapSpec& s) { s.box[0] = 72; }, "over the 128-byte swizzle span");
  bad([](dev::TensorMapSpec& s) { s.box[0] = 4; }, "not a multiple of 16");
  bad([](dev::TensorMapSpec& s) { s.dims[1] = 0; }, "dims[1] = 0");
}

#endif
