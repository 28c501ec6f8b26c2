// Links against the installed kvmm and checks one allocation round trip.
#include <kvmm/paging/kv_allocator.hpp>
#include <kvmm/spec/presets.hpp>

#include <cstdio>

int main() {
  kvmm::PagedKVAllocator kv(kvmm::presets::gemma2_27b(), {.num_large_pages = 16, .max_requests = 4});
  const kvmm::RequestId r = kv.add_request();
  if (!kv.append_tokens(r, 100)) return 1;
  const auto pages = kv.page_tables(0).num_pages(r);
  kv.free_request(r);
  kv.check_invariants();
  std::printf("kvmm consumer: large page %llu bytes, %u pages for 100 tokens, %u large pages free\n",
              static_cast<unsigned long long>(kv.layout().large_page_bytes()), pages,
              kv.large_pages().num_free());
  return kv.large_pages().num_free() == 16 && pages == 7 ? 0 : 1;
}
