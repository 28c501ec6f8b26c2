# kvmm_test_gpu_cudnn: cuDNN's paged SDPA against the CPU reference on a GPU (issue 37 item
# 3), its own binary so that kvmm_test_gpu never needs libcudnn; built with kvmm_cudnn
# (cmake/cudnn.cmake), skipped (exit 77, tests/gpu/main.cpp) without a device.
if(TARGET kvmm_cudnn)
  add_executable(kvmm_test_gpu_cudnn ${PROJECT_SOURCE_DIR}/tests/gpu/main.cpp
                                     ${CMAKE_CURRENT_LIST_DIR}/cudnn_prefill_gpu_test.cpp)
  target_include_directories(kvmm_test_gpu_cudnn PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(kvmm_test_gpu_cudnn PRIVATE kvmm_cudnn kvmm_warnings Catch2::Catch2)
  add_test(NAME gpu_cudnn COMMAND kvmm_test_gpu_cudnn)
  set_tests_properties(gpu_cudnn PROPERTIES SKIP_RETURN_CODE 77)
endif()
