# tests/fuzz: libFuzzer targets, each defining LLVMFuzzerTestOneInput. An ordinary build
# makes each a replayer (replay_main.cpp) that ctest runs over its seed corpus and its
# saved regression inputs (tests/fuzz/regressions/<target>) under the build's own compiler
# and sanitizers. With KVMM_FUZZ=ON (clang: scripts/fuzz.sh) they are libFuzzer binaries
# instead, over kvmm_fuzz_core: the kvmm sources they reach (spec/, the event encoder)
# compiled with coverage instrumentation, so the stage does not build all of kvmm.
option(KVMM_FUZZ "Build tests/fuzz as libFuzzer binaries (clang; scripts/fuzz.sh)" OFF)
if(KVMM_FUZZ)
  file(GLOB fuzz_core_srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/spec/*.cpp)
  add_library(kvmm_fuzz_core STATIC ${fuzz_core_srcs} ${PROJECT_SOURCE_DIR}/src/distributed/kv_event_encoding.cpp)
  target_include_directories(kvmm_fuzz_core PUBLIC ${PROJECT_SOURCE_DIR}/include)
  target_compile_features(kvmm_fuzz_core PUBLIC cxx_std_20)
  target_compile_options(kvmm_fuzz_core PRIVATE -fsanitize=fuzzer-no-link)
  target_link_libraries(kvmm_fuzz_core PUBLIC fmt::fmt kvmm_warnings PRIVATE nlohmann_json::nlohmann_json)
endif()
set(KVMM_FUZZ_SEEDS_hf_config ${PROJECT_SOURCE_DIR}/tests/data)
set(KVMM_FUZZ_SEEDS_kv_events ${PROJECT_SOURCE_DIR}/tests/distributed/golden)
foreach(t hf_config kv_events)
  if(KVMM_FUZZ)
    add_executable(kvmm_fuzz_${t} ${CMAKE_CURRENT_LIST_DIR}/${t}_fuzz.cpp)
    target_compile_options(kvmm_fuzz_${t} PRIVATE -fsanitize=fuzzer)
    target_link_options(kvmm_fuzz_${t} PRIVATE -fsanitize=fuzzer)
    target_link_libraries(kvmm_fuzz_${t} PRIVATE kvmm_fuzz_core)
  else()
    add_executable(kvmm_fuzz_${t} ${CMAKE_CURRENT_LIST_DIR}/${t}_fuzz.cpp ${CMAKE_CURRENT_LIST_DIR}/replay_main.cpp)
    add_test(NAME fuzz_${t}_replay COMMAND kvmm_fuzz_${t} ${KVMM_FUZZ_SEEDS_${t}}
                                           ${CMAKE_CURRENT_LIST_DIR}/regressions/${t})
    target_link_libraries(kvmm_fuzz_${t} PRIVATE kvmm::kvmm)
  endif()
  target_include_directories(kvmm_fuzz_${t} PRIVATE ${CMAKE_CURRENT_LIST_DIR}/..)
  target_link_libraries(kvmm_fuzz_${t} PRIVATE kvmm_warnings)
endforeach()
