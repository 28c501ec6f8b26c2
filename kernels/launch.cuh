// Host-side launch helpers of the kvmm kernels (device build only): the stream cast and
// the launch check that turns a failed launch into kvmm::Error. Used by the dispatch
// units (attention_dispatch.cuh, cache_ops.cu), never by device code. Costs one
// cudaGetLastError per launch.
#pragma once

#include "common.cuh"

#if !defined(KVMM_SIMT_HOST)
namespace kvmm::kernels::device {

// Raises kvmm::Error (through the host library) when the last launch failed.
inline void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) detail::launch_failed(kernel, cudaGetErrorString(e));
}

inline cudaStream_t to_cuda(Stream s) { return static_cast<cudaStream_t>(s); }

}  // namespace kvmm::kernels::device
#endif
