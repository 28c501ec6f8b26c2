// The CUDA driver types and entry points used here are declared locally (no cuda.h,
// no link to libcuda); their layouts follow the public CUDA driver API.
#include "kvmm/memory/cuda_memory.hpp"

#include "kvmm/error.hpp"

#include <dlfcn.h>

#include <mutex>

namespace kvmm {
namespace {

using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUstream = void*;
using CUevent = void*;
using CUdeviceptr = unsigned long long;
using CUmemHandle = unsigned long long;

constexpr CUresult kSuccess = 0;
constexpr CUresult kNotReady = 600;
constexpr int kAllocationPinned = 1;         // CU_MEM_ALLOCATION_TYPE_PINNED
constexpr int kHandlePosixFd = 1;            // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
constexpr int kLocationDevice = 1;           // CU_MEM_LOCATION_TYPE_DEVICE
constexpr int kAccessReadWrite = 3;          // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
constexpr int kGranularityMinimum = 0;       // CU_MEM_ALLOC_GRANULARITY_MINIMUM
constexpr unsigned kEventDisableTiming = 2;  // CU_EVENT_DISABLE_TIMING

struct CUmemLocation {
  int type;
  int id;
};
struct CUmemAllocationProp {
  int type;
  int requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};
struct CUmemAccessDesc {
  CUmemLocation location;
  int flags;
};

struct Driver {
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuMemGetAllocationGranularity)(std::size_t*, const CUmemAllocationProp*, int) = nullptr;
  CUresult (*cuMemAddressReserve)(CUdeviceptr*, std::size_t, std::size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*cuMemAddressFree)(CUdeviceptr, std::size_t) = nullptr;
  CUresult (*cuMemCreate)(CUmemHandle*, std::size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*cuMemRelease)(CUmemHandle) = nullptr;
  CUresult (*cuMemMap)(CUdeviceptr, std::size_t, std::size_t, CUmemHandle, unsigned long long) = nullptr;
  CUresult (*cuMemUnmap)(CUdeviceptr, std::size_t) = nullptr;
  CUresult (*cuMemSetAccess)(CUdeviceptr, std::size_t, const CUmemAccessDesc*, std::size_t) = nullptr;
  CUresult (*cuMemExportToShareableHandle)(void*, CUmemHandle, int, unsigned long long) = nullptr;
  CUresult (*cuMemImportFromShareableHandle)(CUmemHandle*, void*, int) = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*cuEventDestroy)(CUevent) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuEventQuery)(CUevent) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent) = nullptr;
  bool ok = false;
  std::string reason;
};

// Resolves one symbol: through cuGetProcAddress when the driver has it (it picks the
// entry point version matching CUDA 12 semantics), else plain dlsym of `versioned`.
template <typename Fn>
bool resolve(void* lib, void* gpa, bool gpa_v2, const char* name, const char* versioned, Fn*& out) {
  void* p = nullptr;
  if (gpa_v2) {
    int status = 0;
    using Gpa2 = CUresult (*)(const char*, void**, int, unsigned long long, int*);
    if (reinterpret_cast<Gpa2>(gpa)(name, &p, 12000, 0, &status) != kSuccess) p = nullptr;
  } else if (gpa != nullptr) {
    using Gpa = CUresult (*)(const char*, void**, int, unsigned long long);
    if (reinterpret_cast<Gpa>(gpa)(name, &p, 12000, 0) != kSuccess) p = nullptr;
  }
  if (p == nullptr) p = dlsym(lib, versioned);
  out = reinterpret_cast<Fn*>(p);
  return p != nullptr;
}

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      d.reason = "libcuda.so.1 cannot be loaded (no NVIDIA driver)";
      return;
    }
    void* gpa = dlsym(lib, "cuGetProcAddress_v2");
    const bool v2 = gpa != nullptr;
    if (!v2) gpa = dlsym(lib, "cuGetProcAddress");
    bool ok = true;
#define KVMM_RESOLVE(field, versioned) ok &= resolve(lib, gpa, v2, #field, versioned, d.field)
    KVMM_RESOLVE(cuInit, "cuInit");
    KVMM_RESOLVE(cuDeviceGetCount, "cuDeviceGetCount");
    KVMM_RESOLVE(cuDeviceGet, "cuDeviceGet");
    KVMM_RESOLVE(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    KVMM_RESOLVE(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    KVMM_RESOLVE(cuCtxGetCurrent, "cuCtxGetCurrent");
    KVMM_RESOLVE(cuCtxSetCurrent, "cuCtxSetCurrent");
    KVMM_RESOLVE(cuGetErrorString, "cuGetErrorString");
    KVMM_RESOLVE(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    KVMM_RESOLVE(cuMemAddressReserve, "cuMemAddressReserve");
    KVMM_RESOLVE(cuMemAddressFree, "cuMemAddressFree");
    KVMM_RESOLVE(cuMemCreate, "cuMemCreate");
    KVMM_RESOLVE(cuMemRelease, "cuMemRelease");
    KVMM_RESOLVE(cuMemMap, "cuMemMap");
    KVMM_RESOLVE(cuMemUnmap, "cuMemUnmap");
    KVMM_RESOLVE(cuMemSetAccess, "cuMemSetAccess");
    KVMM_RESOLVE(cuMemExportToShareableHandle, "cuMemExportToShareableHandle");
    KVMM_RESOLVE(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle");
    KVMM_RESOLVE(cuEventCreate, "cuEventCreate");
    KVMM_RESOLVE(cuEventDestroy, "cuEventDestroy_v2");
    KVMM_RESOLVE(cuEventRecord, "cuEventRecord");
    KVMM_RESOLVE(cuEventQuery, "cuEventQuery");
    KVMM_RESOLVE(cuEventSynchronize, "cuEventSynchronize");
#undef KVMM_RESOLVE
    if (!ok) {
      d.reason = "libcuda.so.1 lacks a virtual memory management entry point (driver too old)";
      return;
    }
    const CUresult init = d.cuInit(0);
    if (init != kSuccess) {
      d.reason = fmt::format("cuInit failed with CUresult {}", init);
      return;
    }
    int count = 0;
    if (d.cuDeviceGetCount(&count) != kSuccess || count == 0) {
      d.reason = "the CUDA driver reports no device";
      return;
    }
    d.ok = true;
  });
  return d;
}

std::string describe(CUresult r) {
  const char* s = nullptr;
  if (driver().cuGetErrorString != nullptr && driver().cuGetErrorString(r, &s) == kSuccess && s != nullptr)
    return fmt::format("{} ({})", s, r);
  return fmt::format("CUresult {}", r);
}

CUmemAllocationProp allocation_prop(int device, bool shareable) {
  CUmemAllocationProp p{};
  p.type = kAllocationPinned;
  p.requestedHandleTypes = shareable ? kHandlePosixFd : 0;
  p.location = CUmemLocation{kLocationDevice, device};
  return p;
}

}  // namespace

bool CudaMemory::available() { return driver().ok; }

std::string CudaMemory::unavailable_reason() { return driver().reason; }

CudaMemory::CudaMemory(const CudaMemoryOptions& options) : device_(options.device), shareable_(options.shareable) {
  const Driver& d = driver();
  if (!d.ok) fail("CUDA backend unavailable: {}", d.reason);
  int count = 0;
  d.cuDeviceGetCount(&count);
  if (options.device < 0 || options.device >= count)
    fail("device = {}: {} CUDA devices present", options.device, count);
  CUdevice dev = 0;
  CUresult r = d.cuDeviceGet(&dev, options.device);
  if (r != kSuccess) fail("device = {}: cuDeviceGet: {}", options.device, describe(r));
  device_ = dev;
  const CUmemAllocationProp prop = allocation_prop(device_, shareable_);
  std::size_t gran = 0;
  r = d.cuMemGetAllocationGranularity(&gran, &prop, kGranularityMinimum);
  if (r != kSuccess) fail("device = {}: cuMemGetAllocationGranularity: {}", options.device, describe(r));
  granularity_ = gran;
  if (options.chunk_bytes < (std::uint64_t{2} << 20) || options.chunk_bytes % granularity_ != 0)
    fail("chunk_bytes = {}: must be at least 2 MiB and a multiple of the granularity {}", options.chunk_bytes,
         granularity_);
  chunk_bytes_ = options.chunk_bytes;
  r = d.cuDevicePrimaryCtxRetain(&context_, device_);
  if (r != kSuccess) fail("device = {}: cuDevicePrimaryCtxRetain: {}", options.device, describe(r));
}

CudaMemory::~CudaMemory() {
  const Driver& d = driver();
  make_current();
  while (!pending_.empty()) {
    d.cuEventSynchronize(pending_.back().event);
    d.cuMemUnmap(pending_.back().addr, pending_.back().bytes);
    d.cuEventDestroy(pending_.back().event);
    pending_.pop_back();
  }
  for (void* e : spare_events_) d.cuEventDestroy(e);
  d.cuDevicePrimaryCtxRelease(device_);
}

// The mapper thread calls in too: the context must be current on every calling thread.
void CudaMemory::make_current() const {
  CUcontext cur = nullptr;
  if (driver().cuCtxGetCurrent(&cur) != kSuccess || cur != context_) driver().cuCtxSetCurrent(context_);
}

bool CudaMemory::reserve(std::uint64_t bytes, VirtualRange* out) {
  std::lock_guard lock(mutex_);
  if (bytes == 0) fail("bytes = {}: cannot reserve an empty range", bytes);
  make_current();
  const std::uint64_t size = (bytes + chunk_bytes_ - 1) / chunk_bytes_ * chunk_bytes_;
  CUdeviceptr p = 0;
  if (driver().cuMemAddressReserve(&p, size, chunk_bytes_, 0, 0) != kSuccess) return false;
  *out = VirtualRange{p, size};
  return true;
}

void CudaMemory::free_range(const VirtualRange& range) {
  std::lock_guard lock(mutex_);
  make_current();
  drain();
  const CUresult r = driver().cuMemAddressFree(range.base, range.bytes);
  if (r != kSuccess) fail("range.base = {:#x}: cuMemAddressFree: {}", range.base, describe(r));
}

bool CudaMemory::create_chunk(ChunkHandle* out) {
  std::lock_guard lock(mutex_);
  make_current();
  const CUmemAllocationProp prop = allocation_prop(device_, shareable_);
  CUmemHandle h = 0;
  if (driver().cuMemCreate(&h, chunk_bytes_, &prop, 0) != kSuccess) return false;
  *out = h;
  return true;
}

void CudaMemory::release_chunk(ChunkHandle chunk) {
  std::lock_guard lock(mutex_);
  make_current();
  // A deferred unmap may still reference the chunk: finish them first (rare: trims).
  drain();
  const CUresult r = driver().cuMemRelease(chunk);
  if (r != kSuccess) fail("chunk = {:#x}: cuMemRelease: {}", chunk, describe(r));
}

bool CudaMemory::map(ChunkHandle chunk, std::uint64_t addr) {
  std::lock_guard lock(mutex_);
  if (addr % chunk_bytes_ != 0) fail("addr = {:#x}: not aligned to the chunk size {}", addr, chunk_bytes_);
  make_current();
  // An address whose previous mapping is still being retired must be free first.
  for (std::size_t i = 0; i < pending_.size();) {
    if (addr < pending_[i].addr + pending_[i].bytes && pending_[i].addr < addr + chunk_bytes_)
      complete(i);
    else
      ++i;
  }
  return driver().cuMemMap(addr, chunk_bytes_, 0, chunk, 0) == kSuccess;
}

bool CudaMemory::set_access(std::uint64_t addr, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  if (addr % chunk_bytes_ != 0 || bytes % chunk_bytes_ != 0)
    fail("addr = {:#x}, bytes = {}: not a run of whole chunks", addr, bytes);
  make_current();
  const CUmemAccessDesc desc{CUmemLocation{kLocationDevice, device_}, kAccessReadWrite};
  return driver().cuMemSetAccess(addr, bytes, &desc, 1) == kSuccess;
}

void CudaMemory::unmap(std::uint64_t addr, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  if (addr % chunk_bytes_ != 0 || bytes % chunk_bytes_ != 0)
    fail("addr = {:#x}, bytes = {}: not a run of whole chunks", addr, bytes);
  make_current();
  const Driver& d = driver();
  if (deferred_) {
    CUevent ev = nullptr;
    if (!spare_events_.empty()) {
      ev = spare_events_.back();
      spare_events_.pop_back();
    } else if (d.cuEventCreate(&ev, kEventDisableTiming) != kSuccess) {
      ev = nullptr;
    }
    if (ev != nullptr && d.cuEventRecord(ev, stream_) == kSuccess) {
      pending_.push_back(Pending{addr, bytes, ev});
      return;
    }
    if (ev != nullptr) spare_events_.push_back(ev);
    // Could not record: fall back to waiting for the stream's work via a full drain.
  }
  const CUresult r = d.cuMemUnmap(addr, bytes);
  if (r != kSuccess) fail("addr = {:#x}: cuMemUnmap: {}", addr, describe(r));
}

void CudaMemory::complete(std::size_t i) {
  const Driver& d = driver();
  const Pending p = pending_[i];
  d.cuEventSynchronize(p.event);
  const CUresult r = d.cuMemUnmap(p.addr, p.bytes);
  pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
  spare_events_.push_back(p.event);
  if (r != kSuccess) fail("addr = {:#x}: deferred cuMemUnmap: {}", p.addr, describe(r));
}

void CudaMemory::set_consumer_stream(void* stream) {
  std::lock_guard lock(mutex_);
  stream_ = stream;
  deferred_ = true;
}

void CudaMemory::clear_consumer_stream() {
  std::lock_guard lock(mutex_);
  drain();
  deferred_ = false;
  stream_ = nullptr;
}

std::size_t CudaMemory::poll() {
  std::lock_guard lock(mutex_);
  make_current();
  std::size_t done = 0;
  for (std::size_t i = 0; i < pending_.size();) {
    if (driver().cuEventQuery(pending_[i].event) == kNotReady) {
      ++i;
      continue;
    }
    complete(i);
    ++done;
  }
  return done;
}

void CudaMemory::drain() {
  std::lock_guard lock(mutex_);
  if (pending_.empty()) return;
  make_current();
  while (!pending_.empty()) complete(pending_.size() - 1);
}

int CudaMemory::export_chunk(ChunkHandle chunk) {
  std::lock_guard lock(mutex_);
  if (!shareable_) fail("chunk = {:#x}: backend was built with shareable = false", chunk);
  make_current();
  int fd = -1;
  const CUresult r = driver().cuMemExportToShareableHandle(&fd, chunk, kHandlePosixFd, 0);
  if (r != kSuccess) fail("chunk = {:#x}: cuMemExportToShareableHandle: {}", chunk, describe(r));
  return fd;
}

ChunkHandle CudaMemory::import_chunk(int fd) {
  std::lock_guard lock(mutex_);
  make_current();
  CUmemHandle h = 0;
  const CUresult r = driver().cuMemImportFromShareableHandle(
      &h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)), kHandlePosixFd);
  if (r != kSuccess) fail("fd = {}: cuMemImportFromShareableHandle: {}", fd, describe(r));
  return h;
}

}  // namespace kvmm
