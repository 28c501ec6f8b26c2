// The tensor-core wrappers on hardware (tc_probe.cu) against the PTX ISA layouts of
// tests/kernels/ptx_layouts.hpp, the same tables the emulator is checked against: mma on
// integer data bit-exact with a triple loop (bf16 and fp16), every ldmatrix form, and
// cp.async staging. Closes the loop emulator == PTX ISA == hardware.
#include "gpu/tc_probe.hpp"
#include "kernels/ptx_layouts.hpp"

#include <kvmm/kernels/dtype.hpp>

#include <catch2/catch.hpp>

#include <random>

using namespace kvmm;
using namespace kvmm::test;
using namespace kvmm::test::ptx;

TEST_CASE("tensor-core wrappers on the device follow the PTX ISA layouts", "[gpu][tc][sanitize]") {
  float A[16][16], B[16][8], C[16][8];
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-8, 8), acc(-1000, 1000);
  for (auto& r : A)
    for (float& x : r) x = static_cast<float>(small(rng));
  for (auto& r : B)
    for (float& x : r) x = static_cast<float>(small(rng));
  for (auto& r : C)
    for (float& x : r) x = static_cast<float>(acc(rng));
  static TcProbeIn in{};
  static TcProbeOut out{};
  for (unsigned lane = 0; lane < 32; ++lane) {
    for (unsigned i = 0; i < 8; ++i) {
      const RC e = ptx_a(lane, i);
      in.a[lane][i / 2] |= std::uint32_t{kernels::float_to_bf16(A[e.row][e.col])} << (16 * (i & 1));
      in.a16[lane][i / 2] |= std::uint32_t{kernels::float_to_f16(A[e.row][e.col])} << (16 * (i & 1));
    }
    for (unsigned i = 0; i < 4; ++i) {
      const RC e = ptx_b(lane, i);
      in.b[lane][i / 2] |= std::uint32_t{kernels::float_to_bf16(B[e.row][e.col])} << (16 * (i & 1));
      in.b16[lane][i / 2] |= std::uint32_t{kernels::float_to_f16(B[e.row][e.col])} << (16 * (i & 1));
      const RC c = ptx_c(lane, i);
      in.c[lane][i] = C[c.row][c.col];
    }
  }
  for (int m = 0; m < 4; ++m)
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 8; ++c) in.tile[m][r][c] = static_cast<std::uint16_t>(1000 * m + 10 * r + c);
  const char* error = "";
  INFO(error);
  REQUIRE(run_tc_probe(in, out, &error));
  for (unsigned lane = 0; lane < 32; ++lane)
    for (unsigned i = 0; i < 4; ++i) {
      const RC e = ptx_c(lane, i);
      float want = C[e.row][e.col];
      for (int k = 0; k < 16; ++k) want += A[e.row][k] * B[k][e.col];
      CHECK(out.d_bf16[lane][i] == want);
      CHECK(out.d_f16[lane][i] == want);
    }
  auto check = [&](const std::uint32_t* regs, unsigned lane, int n, bool trans) {
    for (int m = 0; m < n; ++m)
      for (unsigned j = 0; j < 2; ++j) {
        const RC e = ptx_ldmatrix(lane, j, trans);
        CHECK(static_cast<std::uint16_t>(regs[m] >> (16 * j)) == in.tile[m][e.row][e.col]);
      }
  };
  for (unsigned lane = 0; lane < 32; ++lane) {
    check(out.x1[lane], lane, 1, false);
    check(out.x2[lane], lane, 2, false);
    check(out.x4[lane], lane, 4, false);
    check(out.x1t[lane], lane, 1, true);
    check(out.x2t[lane], lane, 2, true);
    check(out.x4t[lane], lane, 4, true);
  }
}
