// The experimental entry point of the sm_90a prefill (hopper_prefill_api.hpp): the
// parameter checks of every build, the device check (compute capability 9.0), then the
// launcher of kernels/sm90a/hopper_prefill.cu, present when the build targets sm_90
// (KVMM_HOPPER_PREFILL). Costs a device-attribute query per call.
#include "hopper_prefill.cuh"
#include "hopper_prefill_api.hpp"
#include "launch.cuh"

#include <string>

namespace kvmm::kernels {
namespace detail_hp {
#if defined(KVMM_HOPPER_PREFILL)
void launch(const device::HpLaunch& l, cudaStream_t stream);  // kernels/sm90a/hopper_prefill.cu
#endif
}  // namespace detail_hp

namespace experimental {

bool hopper_prefill_built() {
#if defined(KVMM_HOPPER_PREFILL)
  return true;
#else
  return false;
#endif
}

void paged_prefill_attention_hopper(const PagedAttentionParams& p, Stream stream, std::uint64_t num_pages,
                                    bool round_p_once) {
  constexpr const char* kName = "paged_prefill_attention_hopper";
  check_params(p, true, true);
  device::HpLaunch l = device::hp_plan(p, num_pages);
  l.split_p = !round_p_once;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    cudaGetLastError();
    detail::launch_failed(kName, "no CUDA device: the sm_90a prefill needs compute capability 9.0");
  }
  if (major != 9 || minor != 0) {
    const std::string what = "device compute capability " + std::to_string(major) + "." + std::to_string(minor) +
                             ": the sm_90a prefill runs on 9.0 only";
    detail::launch_failed(kName, what.c_str());
  }
#if defined(KVMM_HOPPER_PREFILL)
  if (p.query.rows == 0) return;
  detail_hp::launch(l, device::to_cuda(stream));
  device::check_launch(kName);
#else
  (void)l;
  (void)stream;
  detail::launch_failed(kName, "this build has no sm_90a kernel (KVMM_CUDA_ARCHITECTURES lacks 90)");
#endif
}

}  // namespace experimental
}  // namespace kvmm::kernels
