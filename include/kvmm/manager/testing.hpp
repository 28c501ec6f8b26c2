// Transitional: testing::ManagerInspector moved to kvmm/testing/manager_inspector.hpp (test
// doubles leave the public layers, issue 30 item 6). This forward stays only until
// src/manager/kv_cache_manager.cpp and tests/manager/*.cpp include the new path; then
// delete it, and its entry in scripts/check_layers.py. Nothing else may include it.
#pragma once

#include "kvmm/testing/manager_inspector.hpp"
