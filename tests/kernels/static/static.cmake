# Static checks of the compiled kernels, as ctest entries (tests/kernels/static): resource
# usage (registers, stack/spills, shared memory) and a SASS census of every kernel for
# sm_80 and sm_90 through cuobjdump (PyPI nvidia-cuda-cuobjdump + nvidia-cuda-nvdisasm,
# pinned, installed by scripts/kernel_tools.sh into KVMM_CUDA_TOOLS_VENV), checked
# against per-kernel limits; then the time model against the committed H100 rows and the
# tensor-core decode's occupancy and pattern limits against the committed H200 rows.
find_package(Python3 COMPONENTS Interpreter REQUIRED)
# The checks themselves on synthetic listings (no CUDA needed): each limit fires.
add_test(NAME kernels_census_selftest COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bench/kernels/census.py --self-test)
if(NOT TARGET kvmm_cuda)
  return()
endif()
set(KVMM_CUDA_TOOLS_VENV /opt/kvmm-venvs/cuobjdump CACHE PATH "venv with cuobjdump/nvdisasm (scripts/kernel_tools.sh)")

add_library(kvmm_census_variants STATIC ${CMAKE_CURRENT_LIST_DIR}/census_variants.cu)
target_include_directories(kvmm_census_variants PRIVATE ${PROJECT_SOURCE_DIR}/kernels)
target_link_libraries(kvmm_census_variants PRIVATE kvmm::kvmm kvmm_warnings)
target_compile_definitions(kvmm_census_variants PRIVATE KVMM_CENSUS_NO_SOFT_CAP=1)
target_compile_options(kvmm_census_variants PRIVATE --expt-relaxed-constexpr)
set_target_properties(kvmm_census_variants PROPERTIES CUDA_ARCHITECTURES "${KVMM_CUDA_ARCHITECTURES}")
# The tensor-core prefill's interior-tile path (the mask block compiled out), likewise.
add_library(kvmm_census_interior STATIC ${CMAKE_CURRENT_LIST_DIR}/census_interior.cu)
target_include_directories(kvmm_census_interior PRIVATE ${PROJECT_SOURCE_DIR}/kernels)
target_link_libraries(kvmm_census_interior PRIVATE kvmm::kvmm kvmm_warnings)
target_compile_definitions(kvmm_census_interior PRIVATE KVMM_CENSUS_NO_SOFT_CAP=1)
target_compile_options(kvmm_census_interior PRIVATE --expt-relaxed-constexpr)
set_target_properties(kvmm_census_interior PROPERTIES CUDA_ARCHITECTURES "${KVMM_CUDA_ARCHITECTURES}")
# The 32-rows-per-warp prefill (both paths), with ptxas -O1 as its launched instances.
foreach(part variants interior)
  add_library(kvmm_census_${part}_m2 STATIC ${CMAKE_CURRENT_LIST_DIR}/census_${part}_m2.cu)
  target_include_directories(kvmm_census_${part}_m2 PRIVATE ${PROJECT_SOURCE_DIR}/kernels)
  target_link_libraries(kvmm_census_${part}_m2 PRIVATE kvmm::kvmm kvmm_warnings)
  target_compile_definitions(kvmm_census_${part}_m2 PRIVATE KVMM_CENSUS_NO_SOFT_CAP=1)
  target_compile_options(kvmm_census_${part}_m2 PRIVATE --expt-relaxed-constexpr --ptxas-options=-O1)
  set_target_properties(kvmm_census_${part}_m2 PROPERTIES CUDA_ARCHITECTURES "${KVMM_CUDA_ARCHITECTURES}")
endforeach()

# The sm_90a probe of kernels/hopper.cuh (wgmma, TMA, mbarrier): built for sm_90a only.
add_library(kvmm_hopper_probe STATIC ${CMAKE_CURRENT_LIST_DIR}/hopper_probe.cu)
target_include_directories(kvmm_hopper_probe PRIVATE ${PROJECT_SOURCE_DIR}/kernels)
target_link_libraries(kvmm_hopper_probe PRIVATE kvmm::kvmm kvmm_warnings PUBLIC CUDA::cudart)
target_compile_options(kvmm_hopper_probe PRIVATE --expt-relaxed-constexpr)
set_target_properties(kvmm_hopper_probe PROPERTIES CUDA_ARCHITECTURES "90a-real")

set(census_json ${CMAKE_BINARY_DIR}/kernels_census.json)
add_test(NAME kernels_static
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bench/kernels/census.py --check --require-probes
    --venv ${KVMM_CUDA_TOOLS_VENV} --json ${census_json}
    $<TARGET_FILE:kvmm_cuda> $<TARGET_FILE:kvmm_census_variants> $<TARGET_FILE:kvmm_census_interior>
    $<TARGET_FILE:kvmm_census_variants_m2> $<TARGET_FILE:kvmm_census_interior_m2>
    $<TARGET_FILE:kvmm_hopper_probe>
    $<$<TARGET_EXISTS:kvmm_test_gpu>:$<TARGET_FILE:kvmm_test_gpu>@_ZN4kvmm4test15tc_probe_kernelEPKNS0_9TcProbeInEPNS0_10TcProbeOutE>)
set_tests_properties(kernels_static PROPERTIES FIXTURES_SETUP kernels_census)
add_test(NAME kernels_model
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bench/kernels/model.py --check
    --census ${census_json} --measured ${PROJECT_SOURCE_DIR}/docs/results/kernels-h100.md
    --measured-tc ${PROJECT_SOURCE_DIR}/docs/results/kernels-h200.md ${PROJECT_SOURCE_DIR}/docs/results/kernels-h200-shapes.md
      ${PROJECT_SOURCE_DIR}/docs/results/kernels-h200-a0cd4c2.md)
set_tests_properties(kernels_model PROPERTIES FIXTURES_REQUIRED kernels_census)

# The GPU tests of the tensor-core decode and prefill (tests/kernels/gpu) join kvmm_test_gpu.
# So does the GPU run of the sm_90a probe (its launcher lives in kvmm_hopper_probe), and
# the sm_90a prefill's (through kvmm_cuda's experimental entry point).
if(TARGET kvmm_test_gpu)
  target_sources(kvmm_test_gpu PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../gpu/tc_decode_gpu_test.cpp
                                       ${CMAKE_CURRENT_LIST_DIR}/../gpu/tc_prefill_gpu_test.cpp
                                       ${CMAKE_CURRENT_LIST_DIR}/../gpu/hopper_gpu_test.cpp
                                       ${CMAKE_CURRENT_LIST_DIR}/../gpu/hopper_prefill_gpu_test.cpp)
  target_link_libraries(kvmm_test_gpu PRIVATE kvmm_hopper_probe)
endif()
