// Argument checks of the tensor-core decode's launchers (kernels/tc_decode.cu), kept out of
// the .cu files so that device code never includes fmt. O(1).
#include "../../kernels/tc_decode_api.hpp"
#include "kvmm/error.hpp"

namespace kvmm::kernels::experimental {

void check_tc_stages(const char* kernel, std::uint32_t stages, std::uint32_t head_dim) {
  if (stages < 2 || stages > 4 || (stages != 2 && head_dim != 128))
    fail("{}: stages = {} with head_dim {}: the ring holds 2 stages, or 3 or 4 at head_dim 128", kernel, stages,
         head_dim);
}

}  // namespace kvmm::kernels::experimental
