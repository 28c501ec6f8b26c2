// The hand-built KV event batch of the distributed/ encoding tests: a stored run at page 0 with a
// salt and a multimodal item, a stored sliding-window run with a parent, a cross-attention
// run that must not be emitted, a removed run and a clear, over a three-group layout.
#pragma once

#include "kvmm/distributed/kv_event_encoding.hpp"

namespace kvmm::test {

inline KVLayout test_layout() {
  return KVLayout::plan({LayerGroup::full_attention("full", 2, 2, 64, 2, 4),
                         LayerGroup::sliding_window("swa", 2, 2, 64, 2, 4, 128),
                         LayerGroup::cross_attention("cross", 1, 2, 64, 2, 4)});
}

inline KvEventBatch test_batch() {
  KvEventBatch b;
  // Stored, group 0, request pages 0..1, salt "s1", one image overlapping page 1.
  b.hashes = {{0x11, 0xa}, {0x12, 0xb}, {0x21, 0}, {0x31, 0}, {0x41, 0}, {0x42, 0}};
  b.tokens = {1, 2, 3, 4, 5, 6, 7, 300, 9, 10, 11, 12, 13, 14, 15, 16};
  b.text = "s1";
  b.items.push_back(KvEventItemKey{1, BlockHash{0x0f, 0xabc}, -2});
  KvEvent s0;
  s0.kind = KvEventKind::kStored;
  s0.group = 0;
  s0.hash_begin = 0;
  s0.num_pages = 2;
  s0.first_page = 0;
  s0.tokens_per_page = 4;
  s0.token_begin = 0;
  s0.salt_begin = 0;
  s0.salt_size = 2;
  s0.item_begin = 0;
  s0.num_items = 1;
  b.events.push_back(s0);
  // Stored, group 1 (sliding window 128), request page 2 after parent 0x99, LoRA 7, host.
  KvEvent s1;
  s1.kind = KvEventKind::kStored;
  s1.medium = Medium::kHost;
  s1.group = 1;
  s1.hash_begin = 2;
  s1.num_pages = 1;
  s1.has_parent = true;
  s1.parent = BlockHash{0x99, 0};
  s1.first_page = 2;
  s1.tokens_per_page = 4;
  s1.token_begin = 8;
  s1.lora_id = 7;
  s1.salt_size = 2;  // ignored: the salt keys page 0 only
  b.events.push_back(s1);
  // Stored, group 2 (cross attention): not emitted.
  KvEvent s2 = s1;
  s2.group = 2;
  s2.hash_begin = 3;
  b.events.push_back(s2);
  KvEvent r;
  r.kind = KvEventKind::kRemoved;
  r.group = 0;
  r.hash_begin = 4;
  r.num_pages = 2;
  b.events.push_back(r);
  KvEvent c;
  c.kind = KvEventKind::kCleared;
  b.events.push_back(c);
  return b;
}

}  // namespace kvmm::test
