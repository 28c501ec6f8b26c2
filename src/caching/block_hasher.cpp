// BlockHasher: XXH3-128 through block_hash.cpp's chain, SHA-256 and keyed BLAKE2b through
// libsodium (crypto_hash_sha256, crypto_generichash_blake2b), one streaming call per page
// over the encoding block_hasher.hpp documents. State on the stack; no heap use.
#include "kvmm/caching/block_hasher.hpp"

#include "block_hash_detail.hpp"

#include "kvmm/error.hpp"

#include <sodium.h>

#include <algorithm>
#include <cstring>

namespace kvmm {

std::string_view to_string(BlockHashFunction f) {
  switch (f) {
    case BlockHashFunction::kXxh3_128:
      return "xxh3-128";
    case BlockHashFunction::kSha256:
      return "sha256";
    case BlockHashFunction::kBlake2bKeyed:
      return "blake2b-keyed";
  }
  return "unknown";
}

namespace {

constexpr char kTagPage[8] = {'k', 'v', 'm', 'm', '.', 'p', 'g', '1'};
constexpr char kTagItemPage[8] = {'k', 'v', 'm', 'm', '.', 'i', 't', '1'};
constexpr char kTagBytes[8] = {'k', 'v', 'm', 'm', '.', 'b', 'y', '1'};

// One message fed to SHA-256 or keyed BLAKE2b in parts; digest() gives its first 16 bytes.
class Message {
 public:
  Message(BlockHashFunction f, const unsigned char* key, std::size_t key_size) : f_(f) {
    if (f_ == BlockHashFunction::kSha256)
      crypto_hash_sha256_init(&sha_);
    else
      crypto_generichash_blake2b_init(&b2_, key, key_size, 16);
  }
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;
  ~Message() {
    // The BLAKE2b state holds the key block until the first compression: wipe it.
    if (f_ == BlockHashFunction::kBlake2bKeyed) sodium_memzero(&b2_, sizeof b2_);
  }

  Message& add(const void* data, std::size_t size) {
    if (size == 0) return *this;
    const auto* p = static_cast<const unsigned char*>(data);
    if (f_ == BlockHashFunction::kSha256)
      crypto_hash_sha256_update(&sha_, p, size);
    else
      crypto_generichash_blake2b_update(&b2_, p, size);
    return *this;
  }
  template <class T>
  Message& add(const T& value) {
    return add(&value, sizeof value);
  }

  BlockHash digest() {
    unsigned char out[crypto_hash_sha256_BYTES];
    if (f_ == BlockHashFunction::kSha256)
      crypto_hash_sha256_final(&sha_, out);
    else
      crypto_generichash_blake2b_final(&b2_, out, 16);
    BlockHash h;
    std::memcpy(&h.lo, out, 8);
    std::memcpy(&h.hi, out + 8, 8);
    return h;
  }

 private:
  BlockHashFunction f_;
  union {
    crypto_hash_sha256_state sha_;
    crypto_generichash_blake2b_state b2_;
  };
};

// The libsodium CPU dispatch (AVX2 BLAKE2b) is chosen by sodium_init, once per process.
void init_sodium() {
  static const int ok = sodium_init();
  if (ok < 0) fail("block_hash: libsodium failed to initialize (sodium_init = {})", ok);
}

}  // namespace

BlockHasher::BlockHasher(const BlockHashOptions& options)
    : function_(options.function),
      salted_only_(options.salted_only && options.function != BlockHashFunction::kXxh3_128) {
  const std::size_t n = options.key.size();
  switch (options.function) {
    case BlockHashFunction::kXxh3_128:
    case BlockHashFunction::kSha256:
      if (n != 0)
        fail(
            "KVCacheManagerOptions::block_hash.key: {} bytes given, but function = {} takes no key (only "
            "blake2b-keyed does)",
            n, to_string(options.function));
      break;
    case BlockHashFunction::kBlake2bKeyed:
      if (n < crypto_generichash_blake2b_KEYBYTES_MIN || n > crypto_generichash_blake2b_KEYBYTES_MAX)
        fail(
            "KVCacheManagerOptions::block_hash.key: {} bytes; function = blake2b-keyed needs a secret key of {}-{} "
            "bytes (32 random bytes recommended)",
            n, crypto_generichash_blake2b_KEYBYTES_MIN, crypto_generichash_blake2b_KEYBYTES_MAX);
      if (std::all_of(options.key.begin(), options.key.end(), [&](char c) { return c == options.key[0]; }))
        fail(
            "KVCacheManagerOptions::block_hash.key: {} bytes all equal to {:#04x}; function = blake2b-keyed needs "
            "a random secret key",
            n, static_cast<unsigned char>(options.key[0]));
      std::memcpy(key_.data(), options.key.data(), n);
      key_size_ = static_cast<std::uint8_t>(n);
      break;
    default:
      fail("KVCacheManagerOptions::block_hash.function = {}: not a BlockHashFunction",
           static_cast<unsigned>(options.function));
  }
  if (function_ != BlockHashFunction::kXxh3_128) init_sodium();
}

BlockHasher::~BlockHasher() { sodium_memzero(key_.data(), key_.size()); }

BlockHash BlockHasher::finish(BlockHashFunction f, BlockHash h) const {
  if (!salted_only_) return h;
  if (f == BlockHashFunction::kXxh3_128)
    h.hi &= ~kSaltedBit;
  else
    h.hi |= kSaltedBit;
  return h;
}

BlockHash BlockHasher::hash_page(bool salted, const BlockHash& parent, std::span<const std::uint32_t> tokens,
                                 const PageExtraKeys& extra) const {
  const BlockHashFunction f = function_for(salted);
  if (f == BlockHashFunction::kXxh3_128) return finish(f, kvmm::hash_page(parent, tokens, extra));
  const std::uint32_t n = static_cast<std::uint32_t>(tokens.size());
  const std::uint32_t flags =
      (extra.item != nullptr ? 1u : 0u) | (extra.lora_id != 0 ? 2u : 0u) | (!extra.salt.empty() ? 4u : 0u);
  Message m(f, key_.data(), key_size_);
  m.add(kTagPage).add(parent.lo).add(parent.hi).add(n).add(flags).add(tokens.data(), tokens.size_bytes());
  if (extra.item != nullptr) m.add(extra.item->hash.lo).add(extra.item->hash.hi).add(extra.item_offset);
  if (extra.lora_id != 0) m.add(extra.lora_id);
  if (!extra.salt.empty()) m.add(std::uint64_t{extra.salt.size()}).add(extra.salt.data(), extra.salt.size());
  return finish(f, m.digest());
}

void BlockHasher::hash_pages(bool salted, const BlockHash& parent, std::span<const std::uint32_t> tokens,
                             std::uint32_t tokens_per_page, std::uint32_t lora_id, std::span<BlockHash> out) const {
  if (tokens_per_page == 0 || tokens.size() / tokens_per_page < out.size())
    fail("tokens: size {} < {} pages x {} tokens", tokens.size(), out.size(), tokens_per_page);
  if (function_for(salted) == BlockHashFunction::kXxh3_128 && !salted_only_)
    return kvmm::hash_pages(parent, tokens, tokens_per_page, lora_id, out);
  PageExtraKeys ex;
  ex.lora_id = lora_id;
  BlockHash h = parent;
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = h = hash_page(salted, h, tokens.subspan(i * tokens_per_page, tokens_per_page), ex);
}

BlockHash BlockHasher::hash_item_page(const BlockHash& item, std::uint32_t page_index, std::uint32_t lora_id) const {
  if (function_ == BlockHashFunction::kXxh3_128) return kvmm::hash_item_page(item, page_index, lora_id);
  Message m(function_, key_.data(), key_size_);
  m.add(kTagItemPage).add(item.lo).add(item.hi).add(page_index).add(lora_id);
  return finish(function_, m.digest());
}

BlockHash BlockHasher::hash_bytes(std::span<const std::byte> bytes) const {
  if (function_ == BlockHashFunction::kXxh3_128) return kvmm::hash_bytes(bytes);
  Message m(function_, key_.data(), key_size_);
  m.add(kTagBytes).add(bytes.data(), bytes.size());
  return m.digest();
}

}  // namespace kvmm
