// Transitional: FaultyMemory moved to kvmm/testing/faulty_memory.hpp (test doubles leave
// the public layers, issue 30 item 6). This forward stays only until the manager's tests
// (tests/manager/page_source_test.cpp) include the new path; then delete it, and its entry
// in scripts/check_layers.py. Nothing else may include it.
#pragma once

#include "kvmm/testing/faulty_memory.hpp"
