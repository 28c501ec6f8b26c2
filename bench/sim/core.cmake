# kvmm_sim_core: the simulator library (model config reader, workloads, policies,
# scheduler, metrics). Included both from bench/sim (for the kvmm-sim executable) and
# from tests/ (for kvmm_test_sim), so the tests build even with KVMM_BUILD_BENCH=OFF.
if(NOT TARGET kvmm_sim_core)
  find_package(nlohmann_json REQUIRED)
  add_library(kvmm_sim_core STATIC
    ${CMAKE_CURRENT_LIST_DIR}/model_config.cpp
    ${CMAKE_CURRENT_LIST_DIR}/workload.cpp
    ${CMAKE_CURRENT_LIST_DIR}/block_policy.cpp
    ${CMAKE_CURRENT_LIST_DIR}/block_rules.cpp
    ${CMAKE_CURRENT_LIST_DIR}/block_accounting.cpp
    ${CMAKE_CURRENT_LIST_DIR}/block_engines.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvmm_policy.cpp
    ${CMAKE_CURRENT_LIST_DIR}/speculative.cpp
    ${CMAKE_CURRENT_LIST_DIR}/synthetic_ids.cpp
    ${CMAKE_CURRENT_LIST_DIR}/policy.cpp
    ${CMAKE_CURRENT_LIST_DIR}/scheduler.cpp)
  target_include_directories(kvmm_sim_core PUBLIC ${CMAKE_CURRENT_LIST_DIR}/..)
  target_link_libraries(kvmm_sim_core PUBLIC kvmm::kvmm PRIVATE nlohmann_json::nlohmann_json kvmm_warnings)
endif()
