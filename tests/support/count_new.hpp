// Heap-allocation counter for the no-allocation tests and benchmarks: linking
// count_new.cpp into a binary replaces every unaligned global operator new/delete form
// with a malloc/free pair that counts calls. One relaxed atomic add per allocation.
#pragma once

#include <cstdint>

namespace kvmm::test {

// operator new calls (all unaligned forms) since the program started.
std::uint64_t heap_allocations();
// operator new calls made by the calling thread (for code that shares the process with
// threads that may allocate, e.g. a publisher's own thread).
std::uint64_t thread_heap_allocations();

}  // namespace kvmm::test
