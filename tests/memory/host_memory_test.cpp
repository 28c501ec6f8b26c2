#include "kvmm/memory/host_memory.hpp"
#include "kvmm/error.hpp"
#include "kvmm/memory/cuda_memory.hpp"
#include "kvmm/testing/faulty_memory.hpp"

#include <catch2/catch.hpp>

#include <cstring>

using namespace kvmm;

namespace {
std::byte* ptr(std::uint64_t a) { return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(a)); }
}  // namespace

TEST_CASE("HostMemory: bytes written through one mapping are read through another mapping of the same chunk") {
  HostMemory mem({.chunk_bytes = 4096});
  VirtualRange r1, r2;
  REQUIRE(mem.reserve(4 * 4096, &r1));
  REQUIRE(mem.reserve(4 * 4096, &r2));
  REQUIRE(r1.base % 4096 == 0);
  ChunkHandle a, b;
  REQUIRE(mem.create_chunk(&a));
  REQUIRE(mem.create_chunk(&b));
  REQUIRE(mem.map(a, r1.base + 4096));
  REQUIRE(mem.map(a, r2.base));
  REQUIRE(mem.map(b, r1.base));
  REQUIRE(mem.set_access(r1.base, 2 * 4096));  // one call for the run of two chunks
  REQUIRE(mem.set_access(r2.base, 4096));
  CHECK(mem.map_count(a) == 2);
  CHECK(mem.live_mappings() == 3);

  std::memset(ptr(r1.base), 0x11, 4096);
  for (int i = 0; i < 4096; ++i) ptr(r1.base + 4096)[i] = std::byte(i * 7);
  for (int i = 0; i < 4096; ++i) REQUIRE(ptr(r2.base)[i] == std::byte(i * 7));
  ptr(r2.base)[100] = std::byte{0xAB};
  CHECK(ptr(r1.base + 4096)[100] == std::byte{0xAB});
  CHECK(ptr(r1.base)[100] == std::byte{0x11});  // chunk b is distinct memory

  // Unmap one alias: the other still sees the data.
  mem.unmap(r1.base, 2 * 4096);
  CHECK(mem.map_count(a) == 1);
  CHECK(mem.map_count(b) == 0);
  CHECK(ptr(r2.base)[100] == std::byte{0xAB});
  // Remap b where a was: the address now shows b's bytes.
  REQUIRE(mem.map(b, r1.base + 4096));
  REQUIRE(mem.set_access(r1.base + 4096, 4096));
  CHECK(ptr(r1.base + 4096)[0] == std::byte{0x11});
  mem.unmap(r1.base + 4096, 4096);
  mem.unmap(r2.base, 4096);
  CHECK(mem.live_mappings() == 0);
  mem.release_chunk(a);
  mem.release_chunk(b);
  CHECK(mem.live_chunks() == 0);
  mem.free_range(r1);
  mem.free_range(r2);
  CHECK(mem.live_ranges() == 0);
}

TEST_CASE("HostMemory: a released chunk's offset is reused and its pages were punched out") {
  HostMemory mem({.chunk_bytes = 8192, .max_chunks = 2});
  CHECK(mem.chunk_bytes() == 8192);
  VirtualRange r;
  REQUIRE(mem.reserve(8192, &r));
  ChunkHandle a, b, c;
  REQUIRE(mem.create_chunk(&a));
  REQUIRE(mem.create_chunk(&b));
  CHECK_FALSE(mem.create_chunk(&c));  // capacity reached: a normal false
  CHECK(mem.live_chunks() == 2);
  REQUIRE(mem.map(a, r.base));
  REQUIRE(mem.set_access(r.base, 8192));
  std::memset(ptr(r.base), 0x5A, 8192);
  mem.unmap(r.base, 8192);
  mem.release_chunk(a);
  REQUIRE(mem.create_chunk(&c));
  CHECK(c == a);  // the offset is reused
  REQUIRE(mem.map(c, r.base));
  REQUIRE(mem.set_access(r.base, 8192));
  for (int i = 0; i < 8192; i += 512) REQUIRE(ptr(r.base)[i] == std::byte{0});  // hole punched
  mem.unmap(r.base, 8192);
  mem.release_chunk(b);
  mem.release_chunk(c);
  mem.free_range(r);
}

TEST_CASE("HostMemory: misuse raises kvmm::Error naming the argument and changes nothing") {
  HostMemory mem({.chunk_bytes = 4096});
  VirtualRange r;
  REQUIRE(mem.reserve(2 * 4096, &r));
  ChunkHandle a;
  REQUIRE(mem.create_chunk(&a));
  CHECK_THROWS_WITH(mem.map(a, r.base + 1), Catch::Contains("addr = "));
  CHECK_THROWS_WITH(mem.map(a + 5, r.base), Catch::Contains(fmt::format("chunk = {}", a + 5)));
  CHECK(mem.live_mappings() == 0);
  REQUIRE(mem.map(a, r.base));
  CHECK_THROWS_WITH(mem.map(a, r.base), Catch::Contains("already mapped"));
  CHECK_THROWS_WITH(mem.release_chunk(a), Catch::Contains("still mapped"));
  CHECK_THROWS_WITH(mem.unmap(r.base + 4096, 4096), Catch::Contains("no chunk is mapped"));
  CHECK(mem.live_mappings() == 1);
  CHECK(mem.live_chunks() == 1);
  mem.unmap(r.base, 4096);
  mem.release_chunk(a);
  CHECK_THROWS_WITH(mem.release_chunk(a), Catch::Contains("not live"));
  CHECK_THROWS_WITH(mem.reserve(0, &r), Catch::Contains("bytes = 0"));
  CHECK_THROWS_WITH(HostMemory({.chunk_bytes = 0}), Catch::Contains("chunk_bytes = 0"));
  mem.free_range(r);
}

TEST_CASE("FaultyMemory fails exactly the Nth acquiring call") {
  HostMemory host({.chunk_bytes = 4096});
  FaultyMemory mem(host);
  mem.fail_at(3);
  VirtualRange r;
  ChunkHandle a, b;
  CHECK(mem.reserve(4096, &r));       // 1
  CHECK(mem.create_chunk(&a));        // 2
  CHECK_FALSE(mem.create_chunk(&b));  // 3 fails
  CHECK(mem.fired());
  CHECK(host.live_chunks() == 1);
  CHECK(mem.map(a, r.base));  // 4
  CHECK(mem.calls() == 4);
  mem.unmap(r.base, 4096);  // releasing calls are not counted
  CHECK(mem.calls() == 4);
  mem.release_chunk(a);
  mem.free_range(r);
  CHECK(host.live_ranges() == 0);
}

TEST_CASE("CudaMemory starts cleanly without a driver and reports itself unavailable") {
  if (CudaMemory::available()) {
    WARN("a CUDA driver is present; the no-driver path is not exercised here");
    CHECK(CudaMemory::unavailable_reason().empty());
    return;
  }
  CHECK_FALSE(CudaMemory::unavailable_reason().empty());
  CHECK_THROWS_AS(CudaMemory(), Error);
  CHECK_THROWS_WITH(CudaMemory(), Catch::Contains("CUDA backend unavailable"));
  CHECK_FALSE(CudaMemory::available());  // stable across calls
}
