// The sm_90a probe of kernels/hopper.cuh, compiled for sm_90a only: its SASS is read by
// the census (ctest kernels_static: HGMMA, UTMALDG, SYNCS, WARPGROUP, no local memory),
// and run_hopper_probe runs it on a GPU (tests/kernels/gpu/hopper_gpu_test.cpp). One CTA of
// one warpgroup: an mbarrier, two 3-D TMA loads that place A (64 x 16 bf16) and B
// (16 x 16) in wgmma's no-swizzle K-major layout (box {8 k, rows, 2 k-halves}: core
// matrices of 8 rows x 16 bytes, the k-halves LBO apart, 8-row groups 128 bytes apart),
// one wgmma m64n16k16 (bf16) and one m64n8k16 (fp16 path on the same bits), the
// accumulators stored. The tensor maps are encoded through the runtime's driver entry
// point (no link to libcuda: the binary still starts without a driver).
#include "../../../kernels/hopper.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstring>
#include <string>
#include <vector>

namespace kvmm::kernels::device {

__global__ void __launch_bounds__(128, 1)
    hopper_probe_kernel(const __grid_constant__ TensorMap map_a, const __grid_constant__ TensorMap map_b, float* out) {
  __shared__ alignas(1024) std::uint16_t a[64 * 16];
  __shared__ alignas(1024) std::uint16_t b[16 * 16];
  __shared__ std::uint64_t bar;
  if (threadIdx.x == 0) {
    mbar_init(&bar, 1);
    fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(&bar, sizeof a + sizeof b);
    tma_load<3>(a, map_a, {0, 0, 0}, &bar);
    tma_load<3>(b, map_b, {0, 0, 0}, &bar);
  }
  mbar_wait(&bar, 0);
  float d[8] = {}, e[4] = {};
  wgmma_fence();
  wgmma_m64k16<BFloat, 16>(d, make_smem_desc(a, 64 * 16, 128, false), make_smem_desc(b, 16 * 16, 128, false), false);
  wgmma_m64k16<BFloat, 8>(e, make_smem_desc(a, 64 * 16, 128, false), make_smem_desc(b, 16 * 16, 128, false), false);
  wgmma_commit();
  wgmma_wait<0>();
  for (int i = 0; i < 8; ++i) out[threadIdx.x * 12 + i] = d[i];
  for (int i = 0; i < 4; ++i) out[threadIdx.x * 12 + 8 + i] = e[i];
}

}  // namespace kvmm::kernels::device

namespace kvmm::test {

// A (64 x 16) and B (16 x 16, N rows of K) bf16 row-major on the host; out: 128 threads x
// 12 floats (8 of the n16 product, 4 of the n8 one) in the wgmma D register order.
// Returns an empty string on success, else what failed.
std::string run_hopper_probe(const std::vector<std::uint16_t>& a, const std::vector<std::uint16_t>& b,
                             std::vector<float>& out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      fn == nullptr)
    return "cuTensorMapEncodeTiled not found";
  const auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  void *da = nullptr, *db = nullptr, *dout = nullptr;
  cudaMalloc(&da, a.size() * 2);
  cudaMalloc(&db, b.size() * 2);
  cudaMalloc(&dout, 128 * 12 * 4);
  cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
  auto map = [&](void* g, cuuint64_t rows, kernels::device::TensorMap& m) {
    // 3-D view of a [rows][16] row-major matrix: {8 k, rows, 2 k-halves}, strides 32 and 16 bytes.
    const cuuint64_t dims[3] = {8, rows, 2}, strides[2] = {32, 16};
    const cuuint32_t box[3] = {8, static_cast<cuuint32_t>(rows), 2}, elem[3] = {1, 1, 1};
    CUtensorMap t;
    const CUresult r =
        encode(&t, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, g, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    static_assert(sizeof t == sizeof m.opaque);
    std::memcpy(m.opaque, &t, sizeof t);
    return r == CUDA_SUCCESS;
  };
  kernels::device::TensorMap ma, mb;
  std::string err;
  if (!map(da, 64, ma) || !map(db, 16, mb)) err = "cuTensorMapEncodeTiled failed";
  if (err.empty()) {
    kernels::device::hopper_probe_kernel<<<1, 128>>>(ma, mb, static_cast<float*>(dout));
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) err = cudaGetErrorString(e);
  }
  out.assign(128 * 12, 0.0f);
  if (err.empty()) cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dout);
  return err;
}

}  // namespace kvmm::test
