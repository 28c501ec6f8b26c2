// Links kvmm::cuda from an installed package (find_package(kvmm COMPONENTS cuda)) without
// needing a GPU: a launcher called with nothing to do launches nothing, the CUDA runtime
// answers its version without a driver, and kvmm::cuda's KVMM_HAVE_CUDA reaches the consumer.
#include <kvmm/kernels/cache_ops.hpp>

#include <cuda_runtime.h>

#include <cstdio>

#ifndef KVMM_HAVE_CUDA
#error "kvmm::cuda should define KVMM_HAVE_CUDA for its consumers"
#endif

int main() {
  kvmm::kernels::PageCopyParams none;  // num_pages = 0: a valid call that launches nothing
  kvmm::kernels::copy_pages(none, nullptr);
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess || runtime <= 0) return 1;
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  std::printf("kvmm::cuda consumer: CUDA runtime %d, %s\n", runtime,
              e == cudaSuccess ? "a driver answered" : "no driver (fine: nothing was launched)");
  return 0;
}
