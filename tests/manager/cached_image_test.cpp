// cached_image (issue 15 item 8): whether an engine may skip the vision encoder for an
// image, because every page of it is cached in every encoder-token group.
#include "kvmm/manager/kv_cache_manager.hpp"

#include <catch2/catch.hpp>

#include <vector>

using namespace kvmm;

TEST_CASE("cached_image answers whether every page of an image is cached in every encoder group", "[manager][images]") {
  const KVLayout layout = KVLayout::plan({LayerGroup::full_attention("text", 1, 1, 8, 2, 4),
                                          LayerGroup::cross_attention("cross", 1, 1, 8, 2, 4),
                                          LayerGroup::vision_embedding("vision", 32, 4)});
  KVCacheManager kv(layout, {.num_large_pages = 64, .max_requests = 2});
  const MultimodalItem img{hash_bytes(std::as_bytes(std::span("pixels", 6))), 2, 10};
  const MultimodalItem other{hash_bytes(std::as_bytes(std::span("other", 5))), 2, 10};
  std::vector<std::uint32_t> prompt(16, 3);
  CHECK_FALSE(kv.cached_image(img));
  kv.begin_step();
  const RequestId r = kv.add_request(prompt, {.items = std::span(&img, 1)});
  kv.lookup_prefix(r);
  REQUIRE(kv.allocate(r, 16));
  CHECK_FALSE(kv.cached_image(img));  // allocated, not computed yet
  kv.commit(r, 16);                   // consumed: vision pages released, still cached
  kv.free(r);
  CHECK(kv.cached_image(img));
  CHECK(kv.cached_image(MultimodalItem{img.hash, 99, 10}));  // the offset does not matter
  CHECK_FALSE(kv.cached_image(img, 1));                      // another LoRA
  CHECK_FALSE(kv.cached_image(other));
  CHECK_FALSE(kv.cached_image(MultimodalItem{img.hash, 2, 14}));  // a longer image: more pages
  CHECK_THROWS_WITH(kv.cached_image(MultimodalItem{img.hash, 2, 0}), Catch::Contains("item.length = 0"));
  kv.reset_prefix_cache();
  CHECK_FALSE(kv.cached_image(img));

  KVCacheManager text_only(KVLayout::plan({LayerGroup::full_attention("text", 1, 1, 8, 2, 4)}),
                           {.num_large_pages = 8, .max_requests = 2});
  CHECK_FALSE(text_only.cached_image(img));  // nothing caches images
}
