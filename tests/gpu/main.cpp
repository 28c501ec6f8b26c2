// Entry point of kvmm_test_gpu: exits 77 (ctest: skipped) when no CUDA device or
// driver is present, otherwise runs the Catch2 session.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cstdio>

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("kvmm_test_gpu: no CUDA device (%s): skipped\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
