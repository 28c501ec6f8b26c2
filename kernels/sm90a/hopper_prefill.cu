// The sm_90a prefill's two instances (P split or rounded once) and launcher (kernels/hopper_prefill.cuh),
// compiled for sm_90a only (CMakeLists: the kvmm_hopper_prefill objects join kvmm_cuda
// when KVMM_CUDA_ARCHITECTURES holds 90); called by hopper_prefill_api.cu after its
// checks. The tensor map is encoded through the runtime's driver entry point (no link to
// libcuda), its function looked up once. Costs one launch plus the encode (host, ~us).
#include "../hopper_prefill.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstring>

namespace kvmm::kernels::detail_hp {

void launch(const device::HpLaunch& l, cudaStream_t stream) {
  constexpr const char* kName = "paged_prefill_attention_hopper";
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) detail::launch_failed(kName, "cuTensorMapEncodeTiled not found in the driver");
  cuuint64_t dims[5], strides[4];
  cuuint32_t box[5], elem[5];
  for (int d = 0; d < 5; ++d) {
    dims[d] = l.map.dims[d];
    box[d] = l.map.box[d];
    elem[d] = 1;
    if (d >= 1) strides[d - 1] = l.map.strides[d];
  }
  CUtensorMap t;
  const CUresult r = encode(&t, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, const_cast<void*>(l.map.base), dims, strides, box,
                            elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) detail::launch_failed(kName, "cuTensorMapEncodeTiled refused the page layout's map");
  device::TensorMap map;
  static_assert(sizeof t == sizeof map.opaque);
  std::memcpy(map.opaque, &t, sizeof t);
  auto* kernel = l.split_p ? device::hopper_prefill_kernel<device::BFloat, true>
                           : device::hopper_prefill_kernel<device::BFloat, false>;
  static const bool raised = [] {
    for (auto* k :
         {device::hopper_prefill_kernel<device::BFloat, true>, device::hopper_prefill_kernel<device::BFloat, false>}) {
      cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(device::kHpSmemBytes));
      cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    }
    return true;
  }();
  (void)raised;
  kernel<<<l.grid, device::kHpThreads, device::kHpSmemBytes, stream>>>(map, l.args, l.kv);
}

}  // namespace kvmm::kernels::detail_hp
