// The kvmm Python module (_kvmm), part 2: KVCacheManager as kvmm.KVCacheManager. Request
// handles are ints; token and id arrays cross as numpy uint32 without a copy; the batch
// calls and exports (batch.cpp) are one crossing each, O(batch) in C++. The GIL is released
// in calls that may take long (hashing long prompts, lookups, big batches); a per-manager
// flag rejects a second thread meanwhile (manager.hpp).
#include "manager.hpp"

#include <pybind11/stl.h>

#include <string>

namespace kvmm::py_bind {

namespace {

py::int_ hash_to_int(const BlockHash& h) {
  return py::reinterpret_borrow<py::int_>((py::int_(h.hi) << py::int_(64)) | py::int_(h.lo));
}

// The manager's KvEventBatch as Python objects (copied: the batch is reused). O(events +
// pages + tokens).
py::list kv_events_list(Manager& m) {
  {
    auto kv = m.use();
    kv->take_events(m.kv_events());
  }
  const KvEventBatch& b = m.kv_events();
  static const char* const kKinds[] = {"stored", "removed", "cleared"};
  static const char* const kMedia[] = {"device", "host", "remote"};
  py::list out;
  for (const KvEvent& e : b.events) {
    py::dict d;
    d["kind"] = kKinds[static_cast<int>(e.kind)];
    if (e.kind != KvEventKind::kCleared) {
      d["group"] = e.group;
      py::list hashes;
      for (const BlockHash& h : b.hashes_of(e)) hashes.append(hash_to_int(h));
      d["block_hashes"] = hashes;
      d["medium"] = kMedia[static_cast<int>(e.medium)];
    }
    if (e.kind == KvEventKind::kStored) {
      d["parent"] = e.has_parent ? py::object(hash_to_int(e.parent)) : py::object(py::none());
      d["first_page"] = e.first_page;
      d["tokens_per_page"] = e.tokens_per_page;
      const auto tok = b.tokens_of(e);
      py::array_t<std::uint32_t> ids(static_cast<py::ssize_t>(tok.size()));
      std::copy(tok.begin(), tok.end(), ids.mutable_data());
      d["token_ids"] = ids;
      d["lora_id"] = e.lora_id;
      d["cache_salt"] = std::string(b.salt_of(e));
      py::list items;
      for (const KvEventItemKey& k : b.items_of(e))
        items.append(py::make_tuple(k.page_in_run, hash_to_int(k.item_hash), k.offset));
      d["extra_keys"] = items;
    }
    out.append(d);
  }
  return out;
}

BlockHash hash_from(const py::handle& h, const char* what) {
  if (!py::isinstance<py::int_>(h) || PyBool_Check(h.ptr()))
    throw py::type_error(fmt::format("{}: expected an int (128-bit hash), got {}", what,
                                     std::string(py::str(py::type::handle_of(h).attr("__name__")))));
  py::int_ v = py::reinterpret_borrow<py::int_>(h);
  if (v < py::int_(0) || v >= (py::int_(1) << py::int_(128)))
    fail("{} = {}: a 128-bit hash is in [0, 2^128)", what, std::string(py::str(v)));
  const py::int_ mask = py::reinterpret_borrow<py::int_>((py::int_(1) << py::int_(64)) - py::int_(1));
  return {.lo = py::reinterpret_borrow<py::int_>(v & mask).cast<std::uint64_t>(),
          .hi = py::reinterpret_borrow<py::int_>(v >> py::int_(64)).cast<std::uint64_t>()};
}

// (hash, offset, length) tuples, sorted by offset (the manager checks the order); each field
// checked and named (items[k] offset).
std::vector<MultimodalItem> items_from(const py::object& items) {
  std::vector<MultimodalItem> out;
  if (items.is_none()) return out;
  const auto type_of = [](const py::handle& h) {
    return std::string(py::str(py::type::handle_of(h).attr("__name__")));
  };
  if (!PySequence_Check(items.ptr()) || PyUnicode_Check(items.ptr()))
    throw py::type_error(fmt::format("items: expected a list of (hash, offset, length), got {}", type_of(items)));
  const auto seq = py::reinterpret_borrow<py::sequence>(items);
  for (std::size_t k = 0; k < seq.size(); ++k) {
    const py::object it = seq[k];
    if (!PySequence_Check(it.ptr()) || PyUnicode_Check(it.ptr()))
      throw py::type_error(fmt::format("items[{}]: expected a (hash, offset, length) tuple, got {}", k, type_of(it)));
    const auto t = py::reinterpret_borrow<py::sequence>(it);
    if (t.size() != 3) fail("items[{}]: each item is (hash, offset, length), got {} fields", k, t.size());
    const std::string hash = fmt::format("items[{}] hash", k), offset = fmt::format("items[{}] offset", k),
                      length = fmt::format("items[{}] length", k);
    out.push_back({.hash = hash_from(t[0], hash.c_str()),
                   .offset = int_scalar<std::uint64_t>(t[1], offset.c_str()),
                   .length = int_scalar<std::uint32_t>(t[2], length.c_str())});
  }
  return out;
}

py::array copies_array(std::span<const PageCopy> copies) {
  py::array_t<std::uint32_t> out({static_cast<py::ssize_t>(copies.size()), py::ssize_t{3}});
  auto w = out.mutable_unchecked<2>();
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const auto k = static_cast<py::ssize_t>(i);
    w(k, 0) = copies[i].group;
    w(k, 1) = copies[i].src;
    w(k, 2) = copies[i].dst;
  }
  return out;
}

py::array ids_array(std::span<const PageId> ids) {
  py::array_t<std::uint32_t> out(static_cast<py::ssize_t>(ids.size()));
  std::copy(ids.begin(), ids.end(), out.mutable_data());
  return out;
}

// block_hash=: None (XXH3-128), a function name, or a dict {"function": name, "key": bytes,
// "salted_only": bool}. Bad key material is kvmm.Error from the manager's constructor.
BlockHashOptions block_hash_from(const py::object& v) {
  BlockHashOptions o;
  if (v.is_none()) return o;
  py::object fn = v;
  if (py::isinstance<py::dict>(v)) {
    fn = py::str("xxh3-128");
    for (const auto& [k, x] : py::reinterpret_borrow<py::dict>(v)) {
      const std::string name = py::str(k);
      if (name == "function") {
        fn = py::reinterpret_borrow<py::object>(x);
      } else if (name == "key") {
        if (!py::isinstance<py::bytes>(x)) throw py::type_error("block_hash['key']: expected bytes (the secret key)");
        o.key = py::reinterpret_borrow<py::bytes>(x);
      } else if (name == "salted_only") {
        if (!py::isinstance<py::bool_>(x)) throw py::type_error("block_hash['salted_only']: expected a bool");
        o.salted_only = x.cast<bool>();
      } else {
        throw py::value_error("block_hash: unknown key '" + name + "' (function, key, salted_only)");
      }
    }
  }
  if (!py::isinstance<py::str>(fn))
    throw py::type_error(
        "block_hash: expected None, 'xxh3-128', 'sha256', 'blake2b-keyed' or a dict of function, key, "
        "salted_only");
  const std::string f = fn.cast<std::string>();
  for (const BlockHashFunction c :
       {BlockHashFunction::kXxh3_128, BlockHashFunction::kSha256, BlockHashFunction::kBlake2bKeyed})
    if (f == to_string(c)) {
      o.function = c;
      return o;
    }
  throw py::value_error("block_hash function = '" + f + "': expected 'xxh3-128', 'sha256' or 'blake2b-keyed'");
}

const char* retention_release_name(RetentionRelease r) {
  return r == RetentionRelease::kOwn ? "own" : r == RetentionRelease::kAll ? "all" : "off";
}

RetentionRelease retention_release_from(const std::string& s) {
  if (s == "own") return RetentionRelease::kOwn;
  if (s == "all") return RetentionRelease::kAll;
  if (s == "off") return RetentionRelease::kOff;
  throw py::value_error("retention_release = '" + s + "': expected 'own', 'all' or 'off'");
}

KVCacheManagerOptions options_from(std::uint32_t num_large_pages, std::uint32_t num_host_large_pages,
                                   std::uint32_t max_requests, bool prefix_caching, bool record_events,
                                   const py::object& log, std::uint64_t seed, std::uint32_t learned_boundaries,
                                   std::uint32_t prompt_tail_tokens, bool record_kv_events,
                                   const py::object& block_hash, std::uint32_t miss_reasons, std::uint32_t hit_unit,
                                   double retention_budget, const std::string& retention_release) {
  KVCacheManagerOptions o{.num_large_pages = num_large_pages,
                          .num_host_large_pages = num_host_large_pages,
                          .max_requests = max_requests,
                          .prefix_caching = prefix_caching,
                          .record_events = record_events,
                          .seed = seed};
  o.learned_boundaries = learned_boundaries;
  o.prompt_tail_tokens = prompt_tail_tokens;
  o.record_kv_events = record_kv_events;
  o.miss_reasons = miss_reasons;
  o.hit_unit = hit_unit;
  o.retention_budget = retention_budget;
  o.retention_release = retention_release_from(retention_release);
  o.block_hash = block_hash_from(block_hash);
  if (!log.is_none()) {
    if (!PyCallable_Check(log.ptr())) throw py::type_error("log: expected a callable(level: str, message: str)");
    // The callable is called with the GIL held; an exception it raises is reported as
    // unraisable (it must not unwind through the manager's call). Its last reference may
    // drop without the GIL (a manager freed on another thread): a deleter that takes it.
    std::shared_ptr<py::object> guarded(new py::object(log), [](py::object* p) {
      py::gil_scoped_acquire gil;
      delete p;
    });
    o.log = [guarded](LogLevel level, std::string_view msg) {
      py::gil_scoped_acquire gil;
      const char* name = level == LogLevel::kDebug ? "debug" : level == LogLevel::kInfo ? "info" : "warning";
      try {
        (*guarded)(name, py::str(msg.data(), msg.size()));
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("kvmm.KVCacheManager log callback");
      }
    };
  }
  return o;
}

py::dict reason_dict(const std::array<std::uint64_t, kNumMissReasons>& v) {
  py::dict d;
  for (std::size_t k = 0; k < kNumMissReasons; ++k)
    d[py::str(std::string(to_string(static_cast<MissReason>(k))))] = v[k];
  return d;
}

void bind_stats(py::module_& m) {
  py::class_<GroupStats>(m, "GroupStats")
      .def_readonly("used_pages", &GroupStats::used_pages)
      .def_readonly("evictable_pages", &GroupStats::evictable_pages)
      .def_readonly("empty_pages", &GroupStats::empty_pages)
      .def_readonly("large_pages", &GroupStats::large_pages)
      .def_readonly("allocated_bytes", &GroupStats::allocated_bytes)
      .def_readonly("needed_bytes", &GroupStats::needed_bytes)
      .def_readonly("waste_bytes", &GroupStats::waste_bytes)
      .def_readonly("hit_pages", &GroupStats::hit_pages)
      .def_readonly("evicted_pages", &GroupStats::evicted_pages);
  py::class_<CacheStats>(m, "CacheStats")
      .def_readonly("groups", &CacheStats::groups)
      .def_readonly("free_large_pages", &CacheStats::free_large_pages)
      .def_readonly("lookups", &CacheStats::lookups)
      .def_readonly("lookup_tokens", &CacheStats::lookup_tokens)
      .def_readonly("hit_tokens", &CacheStats::hit_tokens);
  py::class_<ManagerCounters>(m, "ManagerCounters")
      .def_readonly("lookups", &ManagerCounters::lookups)
      .def_readonly("lookup_tokens", &ManagerCounters::lookup_tokens)
      .def_readonly("hit_tokens", &ManagerCounters::hit_tokens)
      .def_readonly("admissions", &ManagerCounters::admissions)
      .def_readonly("admitted_lookup_tokens", &ManagerCounters::admitted_lookup_tokens)
      .def_readonly("admitted_hit_tokens", &ManagerCounters::admitted_hit_tokens)
      .def_readonly("refused_admissions", &ManagerCounters::refused_admissions)
      .def_readonly("refused_allocations", &ManagerCounters::refused_allocations)
      .def_readonly("lost_hits", &ManagerCounters::lost_hits)
      .def_readonly("cow_copies", &ManagerCounters::cow_copies)
      .def_readonly("swapped_out_pages", &ManagerCounters::swapped_out_pages)
      .def_readonly("swapped_in_pages", &ManagerCounters::swapped_in_pages)
      .def_readonly("evicted_pages", &ManagerCounters::evicted_pages)
      .def_readonly("retention_released_pages", &ManagerCounters::retention_released_pages)
      .def_readonly("retention_bytes", &ManagerCounters::retention_bytes)
      .def_readonly("active_requests", &ManagerCounters::active_requests)
      .def_readonly("free_large_pages", &ManagerCounters::free_large_pages)
      .def_readonly("large_pages", &ManagerCounters::large_pages)
      .def_readonly("used_pages", &ManagerCounters::used_pages)
      .def_readonly("evictable_pages", &ManagerCounters::evictable_pages)
      .def_property_readonly(
          "miss_lookups", [](const ManagerCounters& c) { return reason_dict(c.misses.lookups); },
          "Lookups per reason their hit stopped ({reason: count}; miss_reasons on)")
      .def_property_readonly(
          "missed_tokens", [](const ManagerCounters& c) { return reason_dict(c.misses.tokens); },
          "Tokens looked up and not hit, per reason ({reason: tokens}; miss_reasons on)");
}

void bind_requests(py::class_<Manager>& c) {
  c.def(
       "add_request",
       [](Manager& m, const py::object& tokens, Int<std::uint32_t> lora_id, const py::object& items,
          Int<std::uint64_t> prompt_tokens, const std::string& cache_salt, Int<std::uint32_t> priority,
          Int<std::uint64_t> max_tokens) {
         const U32Arg t(tokens, "tokens");
         const std::vector<MultimodalItem> it = items_from(items);
         auto kv = m.use();
         const RequestExtras extras{.lora_id = lora_id,
                                    .items = it,
                                    .prompt_tokens = prompt_tokens,
                                    .cache_salt = cache_salt,
                                    .priority = priority,
                                    .max_tokens = max_tokens};
         MaybeRelease release(t.size() >= kReleaseGilAt);
         return kv->add_request(t.span, extras);
       },
       py::arg("tokens"), py::kw_only(), py::arg("lora_id") = 0, py::arg("items") = py::none(),
       py::arg("prompt_tokens") = 0, py::arg("cache_salt") = "", py::arg("priority") = 0, py::arg("max_tokens") = 0,
       "Registers a request (prompt token ids; items: (hash, offset, length) images) and returns its handle")
      .def(
          "append_tokens",
          [](Manager& m, Int<RequestId> r, const py::object& tokens) {
            const U32Arg t(tokens, "tokens");
            auto kv = m.use();
            MaybeRelease release(t.size() >= kReleaseGilAt);
            kv->append_tokens(r, t.span);
          },
          py::arg("r"), py::arg("tokens"))
      .def(
          "append_token", [](Manager& m, Int<RequestId> r, Int<std::uint32_t> t) { m.use()->append_token(r, t); },
          py::arg("r"), py::arg("token"))
      .def(
          "lookup_prefix",
          [](Manager& m, Int<RequestId> r, Int<std::uint64_t> limit) {
            auto kv = m.use();
            MaybeRelease release(kv->num_tokens(r) >= kReleaseGilAt);
            return kv->lookup_prefix(r, limit);
          },
          py::arg("r"), py::arg("limit") = KVCacheManager::kMaxTokens)
      .def(
          "allocate",
          [](Manager& m, Int<RequestId> r, Int<std::uint32_t> n, Int<std::uint32_t> lookahead) {
            auto kv = m.use();
            MaybeRelease release(n >= kReleaseGilAt);
            const AllocateResult res = kv->allocate(r, n, lookahead);
            m.last_allocate() = res.kind;
            return static_cast<bool>(res);
          },
          py::arg("r"), py::arg("num_new_tokens"), py::arg("lookahead") = 0)
      .def_property_readonly(
          "last_allocate_result", [](Manager& m) { return std::string(to_string(m.last_allocate())); },
          "Why the last allocate() answered as it did: 'ok', 'no_memory' (refused, nothing changed) or "
          "'hit_lost' (pages of the looked-up hit were evicted since lookup_prefix: nothing changed; reset "
          "the request and look it up again)")
      .def(
          "would_allocate",
          [](Manager& m, Int<RequestId> r, Int<std::uint32_t> n, Int<std::uint32_t> lookahead) {
            return m.use()->would_allocate(r, n, lookahead);
          },
          py::arg("r"), py::arg("num_new_tokens"), py::arg("lookahead") = 0,
          "Whether allocate(r, num_new_tokens, lookahead) would succeed now; changes nothing")
      .def(
          "commit", [](Manager& m, Int<RequestId> r, Int<std::uint64_t> n) { m.use()->commit(r, n); }, py::arg("r"),
          py::arg("num_computed_tokens"))
      .def(
          "fork", [](Manager& m, Int<RequestId> r) { return m.use()->fork(r); }, py::arg("parent"))
      .def(
          "free", [](Manager& m, Int<RequestId> r) { m.use()->free(r); }, py::arg("r"))
      .def(
          "reset", [](Manager& m, Int<RequestId> r) { m.use()->reset(r); }, py::arg("r"));
}

// Preemption plans, copy-on-write copies, the prefix cache's pins and priorities.
void bind_plans(py::class_<Manager>& c) {
  c.def(
       "swap_out",
       [](Manager& m, Int<RequestId> r) -> py::object {
         auto plan = m.use()->swap_out(r);
         return plan ? py::object(copies_array(*plan)) : py::object(py::none());
       },
       py::arg("r"), "Every page of r to the host pool: [n, 3] uint32 (group, src, dst), or None (host full)")
      .def(
          "swap_in",
          [](Manager& m, Int<RequestId> r) -> py::object {
            auto plan = m.use()->swap_in(r);
            return plan ? py::object(copies_array(*plan)) : py::object(py::none());
          },
          py::arg("r"))
      .def(
          "copies", [](Manager& m) { return copies_array(m.use()->copies()); },
          "Copy-on-write copies since begin_step(): [n, 3] uint32 (group, src, dst)")
      .def("reset_prefix_cache",
           [](Manager& m) {
             auto kv = m.use();
             py::gil_scoped_release release;
             kv->reset_prefix_cache();
           })
      .def(
          "pin_prefix", [](Manager& m, Int<RequestId> r) { return m.use()->pin_prefix(r); }, py::arg("r"))
      .def(
          "unpin", [](Manager& m, Int<PinId> p) { m.use()->unpin(p); }, py::arg("pin"))
      .def(
          "set_priority", [](Manager& m, Int<RequestId> r, Int<std::uint32_t> p) { m.use()->set_priority(r, p); },
          py::arg("r"), py::arg("priority"))
      .def(
          "cached_image",
          [](Manager& m, const py::object& hash, Int<std::uint32_t> length, Int<std::uint32_t> lora_id) {
            const MultimodalItem item{.hash = hash_from(hash, "hash"), .offset = 0, .length = length};
            return m.use()->cached_image(item, lora_id);
          },
          py::arg("hash"), py::arg("length"), py::arg("lora_id") = 0)
      .def(
          "draft_recompute",
          [](Manager& m, Int<RequestId> r, Int<GroupId> g) {
            const TokenRange t = m.use()->draft_recompute(r, g);
            return py::make_tuple(t.begin, t.end);
          },
          py::arg("r"), py::arg("group"),
          "(begin, end): the draft positions of draft group `group` the engine computes after r's admitting "
          "allocate (its draft hit to the hit)")
      .def(
          "tag_state",
          [](Manager& m, Int<RequestId> r, Int<GroupId> g, Int<std::uint64_t> n) {
            return m.use()->tag_state(r, g, n);
          },
          py::arg("r"), py::arg("group"), py::arg("state_tokens"),
          "The state page of a tagged recurrent-state group holds exactly the state after state_tokens positions: "
          "cached when all are verified and it is a checkpoint; False for a state over a draft")
      .def(
          "image_from_cache",
          [](Manager& m, Int<RequestId> r, Int<std::uint32_t> item) { return m.use()->image_from_cache(r, item); },
          py::arg("r"), py::arg("item"));
}

void bind_queries(py::class_<Manager>& c) {
  c.def_property_readonly("layout", [](Manager& m) { return m.kv().layout(); })
      .def("begin_step", [](Manager& m) { return m.use()->begin_step(); })
      .def_property_readonly("step", [](Manager& m) { return m.use()->step(); })
      .def("stats",
           [](Manager& m) {
             auto kv = m.use();
             py::gil_scoped_release release;
             return kv->stats();
           })
      .def("counters", [](Manager& m) { return m.use()->counters(); })
      .def(
          "lookup_report",
          [](Manager& m, Int<RequestId> r) {
            const LookupReport& rep = m.use()->lookup_report(r);
            py::list groups;
            for (const GroupMiss& g : rep.groups)
              groups.append(py::dict(py::arg("hit_tokens") = g.hit_tokens,
                                     py::arg("reason") = std::string(to_string(g.reason)), py::arg("page") = g.page));
            return py::dict(py::arg("limit") = rep.limit, py::arg("hit_tokens") = rep.hit_tokens,
                            py::arg("reason") = std::string(to_string(rep.reason)), py::arg("group") = rep.group,
                            py::arg("groups") = groups);
          },
          py::arg("r"),
          "Why r's lookup_prefix stopped where it did, per group (needs miss_reasons > 0): {limit, hit_tokens, "
          "reason, group, groups: [{hit_tokens, reason, page}]}")
      .def(
          "cache_usage",
          [](Manager& m, Int<RequestId> r) {
            const CacheUsage u = m.use()->cache_usage(r);
            return py::dict(py::arg("read_tokens") = u.read_tokens, py::arg("written_tokens") = u.written_tokens);
          },
          py::arg("r"), "r's tokens read from the cache (admitted hits) and written to it (pages it newly cached)")
      .def(
          "take_events",
          [](Manager& m) {
            auto kv = m.use();
            kv->take_events(m.events());
            py::list out;
            for (const CacheEvent& e : m.events())
              out.append(py::make_tuple(e.kind == CacheEventKind::kStored ? "stored" : "removed", e.group, e.page,
                                        hash_to_int(e.hash)));
            return out;
          },
          "Recorded events since the last take: [(kind 'stored'|'removed', group, page, hash)]")
      .def(
          "take_kv_events", [](Manager& m) { return kv_events_list(m); },
          "A KV-aware router's events since the last take (record_kv_events=True), in order: dicts with "
          "'kind' ('stored', 'removed', 'cleared'), 'group', 'block_hashes' (128-bit ints; vLLM's int "
          "hashes are the low 64 bits), and for stored runs 'parent' (int or None), 'first_page', "
          "'tokens_per_page', 'token_ids' (uint32 array), 'lora_id', 'cache_salt', 'extra_keys' "
          "([(page_in_run, item hash, offset)]), 'medium' (docs/router.md)")
      .def(
          "is_active", [](Manager& m, Int<RequestId> r) { return m.use()->is_active(r); }, py::arg("r"))
      .def(
          "is_swapped", [](Manager& m, Int<RequestId> r) { return m.use()->is_swapped(r); }, py::arg("r"))
      .def_property_readonly("num_active", [](Manager& m) { return m.use()->num_active(); })
      .def(
          "num_computed", [](Manager& m, Int<RequestId> r) { return m.use()->num_computed(r); }, py::arg("r"))
      .def(
          "num_allocated", [](Manager& m, Int<RequestId> r) { return m.use()->num_allocated(r); }, py::arg("r"))
      .def(
          "num_tokens", [](Manager& m, Int<RequestId> r) { return m.use()->num_tokens(r); }, py::arg("r"))
      .def(
          "page_table",
          [](Manager& m, Int<RequestId> r, Int<GroupId> g, Int<std::uint64_t> start) {
            const std::span<const PageId> row = m.use()->page_table(r, g);
            if (start > row.size())
              fail("start = {}: request {} has {} pages in group {}", std::uint64_t{start}, RequestId{r}, row.size(),
                   GroupId{g});
            return ids_array(row.subspan(start));
          },
          py::arg("r"), py::arg("group"), py::arg("start") = 0,
          "A copy of r's page ids in group g from index start (uint32; NULL_PAGE for freed ones): O(pages copied)")
      .def(
          "host_page_table",
          [](Manager& m, Int<RequestId> r, Int<GroupId> g) {
            return ids_array(testing::ManagerInspector(*m.use()).host_page_table(r, g));
          },
          py::arg("r"), py::arg("group"))
      .def(
          "kv_len", [](Manager& m, Int<RequestId> r, Int<GroupId> g) { return KernelExports(*m.use()).kv_len(r, g); },
          py::arg("r"), py::arg("group"))
      .def(
          "row", [](Manager& m, Int<RequestId> r) { return KernelExports(*m.use()).row(r).index; }, py::arg("r"))
      .def_property_readonly("free_large_pages", [](Manager& m) { return m.use()->large_pages().num_free(); })
      .def(
          "num_used_pages", [](Manager& m, Int<GroupId> g) { return m.use()->page_counts(g).used; }, py::arg("group"))
      .def(
          "num_evictable_pages", [](Manager& m, Int<GroupId> g) { return m.use()->page_counts(g).evictable; },
          py::arg("group"))
      .def(
          "num_evicted_pages", [](Manager& m, Int<GroupId> g) { return m.use()->page_counts(g).evicted; },
          py::arg("group"))
      .def("check_invariants", [](Manager& m) {
        auto kv = m.use();
        py::gil_scoped_release release;
        kv->check_invariants();
      });
}

}  // namespace

void bind_manager(py::module_& m) {
  bind_stats(m);
  const KVCacheManagerOptions d;
  py::class_<Manager> c(m, "KVCacheManager", "What a scheduler calls each step (see docs/python.md)");
  c.def(py::init([](const KVLayout& layout, std::uint32_t num_large_pages, std::uint32_t num_host_large_pages,
                    std::uint32_t max_requests, bool prefix_caching, bool record_events, const py::object& log,
                    std::uint64_t seed, const py::object& arena, std::uint32_t learned_boundaries,
                    std::uint32_t prompt_tail_tokens, bool record_kv_events, const py::object& block_hash,
                    std::uint32_t miss_reasons, std::uint32_t hit_unit, double retention_budget,
                    const std::string& retention_release) {
          if (!arena.is_none() && !py::isinstance<Arena>(arena)) throw py::type_error("arena: expected a kvmm.Arena");
          return std::make_unique<Manager>(
              layout,
              options_from(num_large_pages, num_host_large_pages, max_requests, prefix_caching, record_events, log,
                           seed, learned_boundaries, prompt_tail_tokens, record_kv_events, block_hash, miss_reasons,
                           hit_unit, retention_budget, retention_release),
              arena);
        }),
        py::arg("layout"), py::kw_only(), py::arg("num_large_pages") = 0, py::arg("num_host_large_pages") = 0,
        py::arg("max_requests") = d.max_requests, py::arg("prefix_caching") = d.prefix_caching,
        py::arg("record_events") = d.record_events, py::arg("log") = py::none(), py::arg("seed") = d.seed,
        py::arg("arena") = py::none(), py::arg("learned_boundaries") = d.learned_boundaries,
        py::arg("prompt_tail_tokens") = d.prompt_tail_tokens, py::arg("record_kv_events") = d.record_kv_events,
        py::arg("block_hash") = py::none(), py::arg("miss_reasons") = d.miss_reasons, py::arg("hit_unit") = d.hit_unit,
        py::arg("retention_budget") = d.retention_budget,
        py::arg("retention_release") = retention_release_name(d.retention_release));
  c.attr("MAX_TOKENS") = KVCacheManager::kMaxTokens;
  c.attr("MAX_REQUESTS") = KVCacheManager::kMaxRequests;
  bind_requests(c);
  bind_plans(c);
  bind_batch(c);
  bind_queries(c);
  m.def(
      "_live_managers", [] { return g_live_managers.load(); }, "KVCacheManager objects alive (leak tests)");
}

}  // namespace kvmm::py_bind
