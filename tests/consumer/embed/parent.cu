// The parent's own CUDA code (KVMM_PARENT_CUDA): it builds for the parent's architectures.
__global__ void parent_kernel(int* x) { *x = 1; }
