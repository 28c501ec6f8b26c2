# cuDNN 9 + the cuDNN frontend (header-only C++ API), for the cuDNN paged-SDPA prefill
# (kernels/cudnn_prefill.*, issue 37 item 3): the library kvmm_cudnn, its GPU test
# kvmm_test_gpu_cudnn and bench_kernels' prefill_paged_cudnn rows. Never a dependency of
# kvmm or kvmm::cuda.
#   KVMM_CUDNN                       AUTO (built when both are found) / ON (required) / OFF
#   KVMM_CUDNN_FRONTEND_INCLUDE_DIR  cudnn_frontend.h's folder; default: the pinned PyPI
#                                    nvidia-cudnn-frontend venv of scripts/cudnn_frontend.sh
#   KVMM_CUDNN_ROOT                  a folder with include/cudnn.h and lib/ or lib64/libcudnn.so[.9]
#                                    (the CUDA toolkit here; on the GPU machine torch's
#                                    nvidia-cudnn pip package, which scripts/gpu_kernels.sh finds)
set(KVMM_CUDNN AUTO CACHE STRING "Build the cuDNN paged-SDPA prefill, its GPU test and bench rows (AUTO/ON/OFF)")
set_property(CACHE KVMM_CUDNN PROPERTY STRINGS AUTO ON OFF)
set(KVMM_CUDNN_ROOT "" CACHE PATH "cuDNN 9 install (include/cudnn.h, lib/libcudnn.so.9); empty: the CUDA toolkit")
set(KVMM_CUDNN_FRONTEND_VENV /opt/kvmm-venvs/cudnn-frontend-1.32.0 CACHE PATH
  "venv of the pinned nvidia-cudnn-frontend (scripts/cudnn_frontend.sh)")
# AUTO builds it in kvmm's own build tree only, not when kvmm is embedded in an engine's.
if(NOT TARGET kvmm_cuda OR KVMM_CUDNN STREQUAL "OFF" OR (KVMM_CUDNN STREQUAL "AUTO" AND NOT PROJECT_IS_TOP_LEVEL))
  return()
endif()
file(GLOB kvmm_fe_hints ${KVMM_CUDNN_FRONTEND_VENV}/lib/python3*/site-packages/include)
find_path(KVMM_CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h HINTS ${kvmm_fe_hints} NO_DEFAULT_PATH)
# cudnn.h: KVMM_CUDNN_ROOT's, the toolkit's, else the copy scripts/cudnn_frontend.sh --kit
# puts beside the frontend headers (cuDNN 9's backend API is stable across 9.x; the
# frontend checks the loaded library's version at run time).
find_path(KVMM_CUDNN_INCLUDE_DIR cudnn.h
  HINTS ${KVMM_CUDNN_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS} ${KVMM_CUDNN_FRONTEND_INCLUDE_DIR}/../cudnn-include)
# NAMES_PER_DIR: KVMM_CUDNN_ROOT's library first, versioned (pip's) or not.
find_library(KVMM_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 NAMES_PER_DIR
  HINTS ${KVMM_CUDNN_ROOT}/lib ${KVMM_CUDNN_ROOT}/lib64 ${CUDAToolkit_LIBRARY_DIR})
if(NOT KVMM_CUDNN_FRONTEND_INCLUDE_DIR OR NOT KVMM_CUDNN_INCLUDE_DIR OR NOT KVMM_CUDNN_LIBRARY)
  set(kvmm_cudnn_msg "kvmm: cuDNN prefill OFF: frontend headers '${KVMM_CUDNN_FRONTEND_INCLUDE_DIR}', cudnn.h "
    "'${KVMM_CUDNN_INCLUDE_DIR}', libcudnn '${KVMM_CUDNN_LIBRARY}' (scripts/cudnn_frontend.sh installs the frontend)")
  if(KVMM_CUDNN STREQUAL "ON")
    message(FATAL_ERROR "${kvmm_cudnn_msg}")
  endif()
  message(STATUS "${kvmm_cudnn_msg}")
  return()
endif()
message(STATUS "kvmm: cuDNN prefill ON: frontend ${KVMM_CUDNN_FRONTEND_INCLUDE_DIR}, cudnn.h ${KVMM_CUDNN_INCLUDE_DIR}, "
  "${KVMM_CUDNN_LIBRARY}")
add_library(kvmm_cudnn STATIC ${PROJECT_SOURCE_DIR}/kernels/cudnn_prefill.cpp)
target_include_directories(kvmm_cudnn PUBLIC ${PROJECT_SOURCE_DIR}/kernels)
# SYSTEM: the frontend's own warnings are not kvmm's (-Werror).
target_include_directories(kvmm_cudnn SYSTEM PRIVATE ${KVMM_CUDNN_FRONTEND_INCLUDE_DIR} ${KVMM_CUDNN_INCLUDE_DIR})
# The frontend also compiles its own engines at run time through NVRTC.
target_link_libraries(kvmm_cudnn PUBLIC kvmm CUDA::cudart CUDA::nvrtc ${KVMM_CUDNN_LIBRARY} ${CMAKE_DL_LIBS}
  PRIVATE kvmm_warnings)
# -O1: the frontend's templates are host-side graph building, not the attention itself;
# its one translation unit took 2:14 CPU here at -O2 -g, 1:10 at -O1 (the GPU run builds it).
target_compile_options(kvmm_cudnn PRIVATE -O1)
set_target_properties(kvmm_cudnn PROPERTIES POSITION_INDEPENDENT_CODE ON)
