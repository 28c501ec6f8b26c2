// Device side of tc_probe.hpp: the kvmm tensor-core wrappers compiled by nvcc (inline
// PTX for sm_80/sm_90) and run once by tests/gpu/tc_probe_test.cpp.
#include "../../kernels/named_barrier.cuh"
#include "../../kernels/tensor_core.cuh"
#include "tc_probe.hpp"

namespace kvmm::test {

namespace dev = kvmm::kernels::device;

// Outside an anonymous namespace: its mangled name is fixed, so the census can select it
// (_ZN4kvmm4test15tc_probe_kernelEPKNS0_9TcProbeInEPNS0_10TcProbeOutE).
__global__ void tc_probe_kernel(const TcProbeIn* in, TcProbeOut* out) {
  const unsigned lane = threadIdx.x;
  float d[4];
  dev::mma_16816<dev::BFloat>(d, in->a[lane], in->b[lane], in->c[lane]);
  for (int i = 0; i < 4; ++i) out->d_bf16[lane][i] = d[i];
  dev::mma_16816<dev::Half>(d, in->a16[lane], in->b16[lane], in->c[lane]);
  for (int i = 0; i < 4; ++i) out->d_f16[lane][i] = d[i];

  __shared__ alignas(16) std::uint16_t tile[4][8][8];
  // 32 lanes x 16 bytes = the four matrices; lane l copies row l % 8 of matrix l / 8.
  dev::cp_async<16>(&tile[lane / 8][lane % 8][0], &in->tile[lane / 8][lane % 8][0]);
  dev::cp_async_commit();
  dev::cp_async_wait<0>();
  dev::bar_sync(1, 32);  // the one warp: a named barrier in place of __syncthreads
  const void* row = &tile[lane / 8][lane % 8][0];
  dev::ldmatrix<1>(out->x1[lane], row);
  dev::ldmatrix<2>(out->x2[lane], row);
  dev::ldmatrix<4>(out->x4[lane], row);
  dev::ldmatrix<1, true>(out->x1t[lane], row);
  dev::ldmatrix<2, true>(out->x2t[lane], row);
  dev::ldmatrix<4, true>(out->x4t[lane], row);
}

bool run_tc_probe(const TcProbeIn& in, TcProbeOut& out, const char** error) {
  TcProbeIn* din = nullptr;
  TcProbeOut* dout = nullptr;
  cudaError_t e = cudaMalloc(&din, sizeof in);
  if (e == cudaSuccess) e = cudaMalloc(&dout, sizeof out);
  if (e == cudaSuccess) e = cudaMemcpy(din, &in, sizeof in, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) {
    tc_probe_kernel<<<1, 32>>>(din, dout);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(&out, dout, sizeof out, cudaMemcpyDeviceToHost);
  cudaFree(din);
  cudaFree(dout);
  if (e != cudaSuccess && error != nullptr) *error = cudaGetErrorString(e);
  return e == cudaSuccess;
}

}  // namespace kvmm::test
