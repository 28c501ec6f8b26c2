# mini_engine_lib: the mini engine (model, paged engine, vAttention engine). Included both
# from examples/mini_engine (for the demo) and from tests/ (for kvmm_test_mini_engine), so
# the tests build even with KVMM_BUILD_EXAMPLES=OFF.
if(NOT TARGET mini_engine_lib)
  add_library(mini_engine_lib STATIC
    ${CMAKE_CURRENT_LIST_DIR}/model.cpp
    ${CMAKE_CURRENT_LIST_DIR}/engine.cpp
    ${CMAKE_CURRENT_LIST_DIR}/tier.cpp
    ${CMAKE_CURRENT_LIST_DIR}/vattention.cpp)
  target_include_directories(mini_engine_lib PUBLIC ${CMAKE_CURRENT_LIST_DIR})
  target_link_libraries(mini_engine_lib PUBLIC kvmm::kvmm PRIVATE kvmm_warnings)
endif()
