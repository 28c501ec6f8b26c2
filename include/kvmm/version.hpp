// kvmm's version as macros (for #if) and as kvmm::version() (for logs and checks); costs
// nothing at run time. The numbers equal CMake's project(kvmm VERSION ...): configuring
// fails when they differ (cmake/version.cmake), so bump both together.
#pragma once

#include <string_view>

#define KVMM_VERSION_MAJOR 0
#define KVMM_VERSION_MINOR 1
#define KVMM_VERSION_PATCH 0
#define KVMM_VERSION "0.1.0"

namespace kvmm {

// "MAJOR.MINOR.PATCH" of the headers compiled in.
constexpr std::string_view version() noexcept { return KVMM_VERSION; }

}  // namespace kvmm
