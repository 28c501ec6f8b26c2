// The sm_90a primitives of kernels/hopper.cuh on a GPU (compute capability 9.0 only):
// the probe of tests/kernels/static/hopper_probe.cu loads A and B by TMA on an mbarrier
// and multiplies them with wgmma; its registers, read through the PTX ISA's wgmma D
// layout (tests/kernels/ptx_layouts.hpp), must equal the integer product exactly: the
// hardware check of the layouts the emulator is tested against.
#include "kernels/kernel_fixture.hpp"
#include "kernels/ptx_layouts.hpp"

#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <random>
#include <string>

namespace kvmm::test {
std::string run_hopper_probe(const std::vector<std::uint16_t>& a, const std::vector<std::uint16_t>& b,
                             std::vector<float>& out);
}

TEST_CASE("wgmma, TMA and mbarrier on the GPU give the integer product in the ISA's layout", "[gpu][hopper]") {
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  if (prop.major != 9) {
    WARN("the probe is built for sm_90a only: not run on compute capability " << prop.major);
    return;
  }
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> small(-6, 6);
  std::vector<float> A(64 * 16), B(16 * 16);
  std::vector<std::uint16_t> a(A.size()), b(B.size());
  for (std::size_t i = 0; i < A.size(); ++i) a[i] = kvmm::kernels::float_to_bf16(A[i] = float(small(rng)));
  for (std::size_t i = 0; i < B.size(); ++i) b[i] = kvmm::kernels::float_to_bf16(B[i] = float(small(rng)));
  std::vector<float> out;
  const std::string err = kvmm::test::run_hopper_probe(a, b, out);
  REQUIRE(err.empty());
  for (unsigned t = 0; t < 128; ++t) {
    for (unsigned i = 0; i < 8; ++i) {  // m64n16k16
      const kvmm::test::ptx::RC e = kvmm::test::ptx::ptx_wgmma_d(t, i);
      double want = 0;
      for (unsigned k = 0; k < 16; ++k) want += double(A[e.row * 16 + k]) * B[e.col * 16 + k];
      INFO("thread " << t << " reg " << i);
      CHECK(out[t * 12 + i] == static_cast<float>(want));
    }
    for (unsigned i = 0; i < 4; ++i) {  // m64n8k16: B's first 8 rows
      const kvmm::test::ptx::RC e = kvmm::test::ptx::ptx_wgmma_d(t, i);
      double want = 0;
      for (unsigned k = 0; k < 16; ++k) want += double(A[e.row * 16 + k]) * B[e.col * 16 + k];
      CHECK(out[t * 12 + 8 + i] == static_cast<float>(want));
    }
  }
}
