# Bad input through every Python call (issue 29), table-driven: each case is a call with one
# bad argument (a wrong type or dtype, a shape, a value out of range, a stale handle, a batch
# with one bad element) and asserts the exception's type, that its message names the
# argument (and the index in an array), that the manager's observable state (counters,
# stats, every live request's counts and page tables) is exactly as before, and that the
# manager serves afterwards; then the integer inputs that are accepted, and a seeded run of
# batch calls with one bad element at a random position. The defects of issue 29 have
# their exact tests in test_input_defects.py.
import array
from fractions import Fraction

import numpy as np
import pytest

import kvmm
from bad_input_world import BIG, U32, World, tables2
from conftest import small_layout


def f32(*v):
    return np.array(v, np.float64)


# (id, call(world), exception type, regex its message must contain). The calls take the
# world `w` so that handles are the world's.
CASES = [
    # ---- add_request: tokens, items, keywords
    ("add_request/str", lambda w: w.kv.add_request("not tokens"), TypeError, "tokens"),
    ("add_request/float-list", lambda w: w.kv.add_request([1, 2, 3.9]), TypeError, r"tokens\[2\] = 3\.9"),
    ("add_request/negative", lambda w: w.kv.add_request([1, -1]), OverflowError, r"tokens\[1\] = -1"),
    ("add_request/2^32+7", lambda w: w.kv.add_request([BIG + 7]), OverflowError, r"tokens\[0\] = 4294967303"),
    ("add_request/bool", lambda w: w.kv.add_request([1, True]), TypeError, r"tokens\[1\]"),
    ("add_request/str-elem", lambda w: w.kv.add_request([1, "2"]), TypeError, r"tokens\[1\]"),
    ("add_request/float-array", lambda w: w.kv.add_request(f32(1, 2)), TypeError, "tokens.*float64"),
    ("add_request/int64-negative", lambda w: w.kv.add_request(np.array([3, -2], np.int64)), OverflowError,
     r"tokens\[1\] = -2"),
    ("add_request/uint64-big", lambda w: w.kv.add_request(np.array([3, BIG], np.uint64)), OverflowError,
     r"tokens\[1\] = 4294967296"),
    ("add_request/bool-array", lambda w: w.kv.add_request(np.array([True])), TypeError, "tokens.*bool"),
    ("add_request/2-D", lambda w: w.kv.add_request(np.zeros((2, 2), U32)), kvmm.Error, "tokens.*1-D"),
    ("add_request/nested-list", lambda w: w.kv.add_request([[1, 2]]), kvmm.Error, r"tokens\[0\]"),
    ("add_request/int", lambda w: w.kv.add_request(5), TypeError, "tokens"),
    ("add_request/items-str", lambda w: w.kv.add_request([1] * 9, items="x"), TypeError, "items"),
    ("add_request/items-not-tuple", lambda w: w.kv.add_request([1] * 9, items=[5]), TypeError, r"items\[0\]"),
    ("add_request/items-2-fields", lambda w: w.kv.add_request([1] * 9, items=[(1, 2)]), kvmm.Error, r"items\[0\]"),
    ("add_request/items-hash-str", lambda w: w.kv.add_request([1] * 9, items=[("h", 0, 4)]), TypeError,
     r"items\[0\] hash"),
    ("add_request/items-hash-bool", lambda w: w.kv.add_request([1] * 9, items=[(True, 0, 4)]), TypeError,
     r"items\[0\] hash"),
    ("add_request/items-hash-negative", lambda w: w.kv.add_request([1] * 9, items=[(-1, 0, 4)]), kvmm.Error,
     r"items\[0\] hash = -1"),
    ("add_request/items-offset-float", lambda w: w.kv.add_request([1] * 9, items=[(7, 0.5, 4)]), TypeError,
     r"items\[0\] offset"),
    ("add_request/items-length-negative", lambda w: w.kv.add_request([1] * 9, items=[(7, 0, -4)]), OverflowError,
     r"items\[0\] length = -4"),
    ("add_request/items-past-prompt", lambda w: w.kv.add_request([1] * 9, items=[(7, 8, 4)]), kvmm.Error, "items"),
    ("add_request/lora-negative", lambda w: w.kv.add_request([1] * 9, lora_id=-1), TypeError, "lora_id"),
    ("add_request/salt-int", lambda w: w.kv.add_request([1] * 9, cache_salt=5), TypeError, "cache_salt"),
    ("add_request/max_tokens-huge", lambda w: w.kv.add_request([1] * 9, max_tokens=2**40), kvmm.Error, "max_tokens"),
    # ---- per-request calls: stale handles, wrong types, values out of range
    ("append_tokens/stale", lambda w: w.kv.append_tokens(w.stale, [1]), kvmm.Error, r"request = \d+"),
    ("append_tokens/negative", lambda w: w.kv.append_tokens(w.a, [1, -1]), OverflowError, r"tokens\[1\] = -1"),
    ("append_tokens/float", lambda w: w.kv.append_tokens(w.a, [0.5]), TypeError, r"tokens\[0\]"),
    ("append_tokens/handle-str", lambda w: w.kv.append_tokens("a", [1]), TypeError, "r"),
    ("append_token/stale", lambda w: w.kv.append_token(w.stale, 1), kvmm.Error, r"request = \d+"),
    ("append_token/negative", lambda w: w.kv.append_token(w.a, -1), TypeError, "token"),
    ("append_token/2^32", lambda w: w.kv.append_token(w.a, BIG), TypeError, "token"),
    ("append_token/float", lambda w: w.kv.append_token(w.a, 1.5), TypeError, "token"),
    # scalars: pybind11's integer caster took bools and truncated whatever int() takes
    ("append_token/np-float32", lambda w: w.kv.append_token(w.a, np.float32(3.9)), TypeError, "token"),
    ("append_token/fraction", lambda w: w.kv.append_token(w.a, Fraction(7, 2)), TypeError, "token"),
    ("append_token/bool", lambda w: w.kv.append_token(w.a, True), TypeError, "token"),
    ("append_token/handle-bool", lambda w: w.kv.append_token(True, 1), TypeError, "r"),
    ("append_token/handle-np-float32", lambda w: w.kv.append_token(np.float32(w.a), 1), TypeError, "r"),
    ("append_token/handle-np-bool", lambda w: w.kv.append_token(np.bool_(True), 1), TypeError, "r"),
    ("lookup_prefix/stale", lambda w: w.kv.lookup_prefix(w.stale), kvmm.Error, r"request = \d+"),
    ("lookup_prefix/again", lambda w: w.kv.lookup_prefix(w.a), kvmm.Error, "lookup_prefix must come once"),
    ("lookup_prefix/swapped", lambda w: w.kv.lookup_prefix(w.sw), kvmm.Error, "swapped out"),
    ("allocate/stale", lambda w: w.kv.allocate(w.stale, 1), kvmm.Error, r"request = \d+"),
    ("allocate/swapped", lambda w: w.kv.allocate(w.sw, 1), kvmm.Error, "swapped out"),
    ("allocate/negative", lambda w: w.kv.allocate(w.a, -1), TypeError, "num_new_tokens"),
    ("allocate/float", lambda w: w.kv.allocate(w.a, 1.5), TypeError, "num_new_tokens"),
    ("allocate/np-float32", lambda w: w.kv.allocate(w.a, np.float32(1.5)), TypeError, "num_new_tokens"),
    ("allocate/bool", lambda w: w.kv.allocate(w.a, 1, True), TypeError, "lookahead"),
    ("allocate/too-many", lambda w: w.kv.allocate(w.a, BIG - 1, BIG - 1), kvmm.Error, "num_new_tokens"),
    ("commit/stale", lambda w: w.kv.commit(w.stale, 1), kvmm.Error, r"request = \d+"),
    ("commit/past-allocated", lambda w: w.kv.commit(w.a, w.kv.num_allocated(w.a) + 1), kvmm.Error,
     "num_computed_tokens"),
    ("commit/backwards", lambda w: w.kv.commit(w.a, w.kv.num_computed(w.a) - 1), kvmm.Error, "already has"),
    ("commit/before-pin", lambda w: w.kv.commit(w.pend, w.kv.num_computed(w.pend)), kvmm.Error,
     "before the allocate"),
    ("commit/negative", lambda w: w.kv.commit(w.a, -1), TypeError, "num_computed_tokens"),
    ("commit/2^64", lambda w: w.kv.commit(w.a, 2**64), TypeError, "num_computed_tokens"),
    ("commit/np-float16", lambda w: w.kv.commit(w.a, np.float16(10)), TypeError, "num_computed_tokens"),
    ("fork/stale", lambda w: w.kv.fork(w.stale), kvmm.Error, r"request = \d+"),
    ("fork/swapped", lambda w: w.kv.fork(w.sw), kvmm.Error, "swapped out"),
    ("free/stale", lambda w: w.kv.free(w.stale), kvmm.Error, r"request = \d+"),
    ("free/unknown", lambda w: w.kv.free(12345), kvmm.Error, "request = 12345"),
    ("free/str", lambda w: w.kv.free("a"), TypeError, "r"),
    ("free/bool", lambda w: w.kv.free(True), TypeError, "r"),
    ("free/fraction", lambda w: w.kv.free(Fraction(w.a * 2 + 1, 2)), TypeError, "r"),
    ("reset/stale", lambda w: w.kv.reset(w.stale), kvmm.Error, r"request = \d+"),
    ("swap_out/stale", lambda w: w.kv.swap_out(w.stale), kvmm.Error, r"request = \d+"),
    ("swap_out/pending", lambda w: w.kv.swap_out(w.pend), kvmm.Error, "before the allocate"),
    ("swap_in/running", lambda w: w.kv.swap_in(w.a), kvmm.Error, "not swapped out"),
    ("swap_in/stale", lambda w: w.kv.swap_in(w.stale), kvmm.Error, r"request = \d+"),
    ("pin_prefix/stale", lambda w: w.kv.pin_prefix(w.stale), kvmm.Error, r"request = \d+"),
    ("unpin/unknown", lambda w: w.kv.unpin(999), kvmm.Error, "pin = 999"),
    ("set_priority/stale", lambda w: w.kv.set_priority(w.stale, 1), kvmm.Error, r"request = \d+"),
    ("set_priority/negative", lambda w: w.kv.set_priority(w.a, -1), TypeError, "priority"),
    ("cached_image/str", lambda w: w.kv.cached_image("h", 4), TypeError, "hash"),
    ("cached_image/bool", lambda w: w.kv.cached_image(True, 4), TypeError, "hash"),
    ("cached_image/negative", lambda w: w.kv.cached_image(-1, 4), kvmm.Error, "hash = -1"),
    ("cached_image/2^128", lambda w: w.kv.cached_image(2**128, 4), kvmm.Error, "hash"),
    # ---- queries: a stale handle raises (is_active answers), groups out of range
    ("is_swapped/stale", lambda w: w.kv.is_swapped(w.stale), kvmm.Error, r"request = \d+"),
    ("draft_recompute/not-draft", lambda w: w.kv.draft_recompute(w.a, 0), kvmm.Error, "group = 0"),
    ("draft_recompute/stale", lambda w: w.kv.draft_recompute(w.stale, 0), kvmm.Error, r"request = \d+"),
    ("draft_recompute/float", lambda w: w.kv.draft_recompute(w.a, 0.5), TypeError, "group"),
    ("tag_state/not-tagged", lambda w: w.kv.tag_state(w.a, 0, 4), kvmm.Error, "group = 0"),
    ("tag_state/negative", lambda w: w.kv.tag_state(w.a, 0, -1), TypeError, "state_tokens"),
    ("image_from_cache/stale", lambda w: w.kv.image_from_cache(w.stale, 0), kvmm.Error, r"request = \d+"),
    ("image_from_cache/item", lambda w: w.kv.image_from_cache(w.a, 0), kvmm.Error, "item = 0"),
    ("image_from_cache/float", lambda w: w.kv.image_from_cache(w.a, 0.5), TypeError, "item"),
    ("lookup_report/stale", lambda w: w.kv.lookup_report(w.stale), kvmm.Error, r"request = \d+"),
    ("lookup_report/off", lambda w: w.kv.lookup_report(w.a), kvmm.Error, "miss_reasons is 0"),
    ("lookup_report/float", lambda w: w.kv.lookup_report(0.5), TypeError, "r"),
    ("cache_usage/stale", lambda w: w.kv.cache_usage(w.stale), kvmm.Error, r"request = \d+"),
    ("cache_usage/float", lambda w: w.kv.cache_usage(0.5), TypeError, "r"),
    ("num_computed/stale", lambda w: w.kv.num_computed(w.stale), kvmm.Error, r"request = \d+"),
    ("num_allocated/stale", lambda w: w.kv.num_allocated(w.stale), kvmm.Error, r"request = \d+"),
    ("num_tokens/stale", lambda w: w.kv.num_tokens(w.stale), kvmm.Error, r"request = \d+"),
    ("page_table/stale", lambda w: w.kv.page_table(w.stale, 0), kvmm.Error, r"request = \d+"),
    ("page_table/group", lambda w: w.kv.page_table(w.a, 7), kvmm.Error, "group = 7"),
    ("page_table/start", lambda w: w.kv.page_table(w.a, 0, 99), kvmm.Error, "start = 99"),
    ("page_table/start-float", lambda w: w.kv.page_table(w.a, 0, 0.5), TypeError, "start"),
    ("would_allocate/stale", lambda w: w.kv.would_allocate(w.stale, 1), kvmm.Error, r"request = \d+"),
    ("would_allocate/float", lambda w: w.kv.would_allocate(w.a, 1.5), TypeError, "num_new_tokens"),
    ("would_allocate/negative", lambda w: w.kv.would_allocate(w.a, -1), TypeError, "num_new_tokens"),
    ("host_page_table/stale", lambda w: w.kv.host_page_table(w.stale, 0), kvmm.Error, r"request = \d+"),
    ("kv_len/stale", lambda w: w.kv.kv_len(w.stale, 0), kvmm.Error, r"request = \d+"),
    ("kv_len/group", lambda w: w.kv.kv_len(w.a, 7), kvmm.Error, "group = 7"),
    ("row/stale", lambda w: w.kv.row(w.stale), kvmm.Error, r"request = \d+"),
    ("num_used_pages/group", lambda w: w.kv.num_used_pages(7), kvmm.Error, "group = 7"),
    ("num_evictable_pages/group", lambda w: w.kv.num_evictable_pages(7), kvmm.Error, "group = 7"),
    ("num_evicted_pages/group", lambda w: w.kv.num_evicted_pages(7), kvmm.Error, "group = 7"),
    ("num_used_pages/str", lambda w: w.kv.num_used_pages("0"), TypeError, "group"),
    ("page_table/group-np-float32", lambda w: w.kv.page_table(w.a, np.float32(0.5)), TypeError, "group"),
    ("unpin/bool", lambda w: w.kv.unpin(False), TypeError, "pin"),
    # ---- append_batch: one bad element anywhere, a mismatch; the good ones stay unchanged
    ("append_batch/stale", lambda w: w.kv.append_batch([w.a, w.stale], [1, 2]), kvmm.Error, r"ids\[1\]"),
    ("append_batch/id-float", lambda w: w.kv.append_batch([w.a, w.b + 0.5], [1, 2]), TypeError, r"ids\[1\]"),
    ("append_batch/id-2^32+h", lambda w: w.kv.append_batch([w.a, BIG + w.b], [1, 2]), OverflowError, r"ids\[1\]"),
    ("append_batch/id-str", lambda w: w.kv.append_batch([w.a, "h"], [1, 2]), TypeError, r"ids\[1\]"),
    ("append_batch/id-bool", lambda w: w.kv.append_batch([True], [1]), TypeError, r"ids\[0\]"),
    ("append_batch/ids-float-array", lambda w: w.kv.append_batch(f32(w.a), [1]), TypeError, "ids.*float64"),
    ("append_batch/ids-int64-negative", lambda w: w.kv.append_batch(np.array([w.a, -1]), [1, 2]), OverflowError,
     r"ids\[1\] = -1"),
    ("append_batch/token-negative", lambda w: w.kv.append_batch([w.a, w.b], [1, -1]), OverflowError,
     r"tokens\[1\] = -1"),
    ("append_batch/token-2^32+7", lambda w: w.kv.append_batch([w.a, w.b], [1, BIG + 7]), OverflowError,
     r"tokens\[1\]"),
    ("append_batch/token-float", lambda w: w.kv.append_batch([w.a, w.b], [1, 3.9]), TypeError, r"tokens\[1\]"),
    ("append_batch/tokens-float-array", lambda w: w.kv.append_batch([w.a], f32(3.9)), TypeError, "tokens"),
    ("append_batch/mismatch", lambda w: w.kv.append_batch([w.a, w.b], [1]), kvmm.Error, "tokens"),
    ("append_batch/ids-2-D", lambda w: w.kv.append_batch(np.array([[w.a]], U32), [1]), kvmm.Error, "ids.*1-D"),
    ("append_batch/ids-None", lambda w: w.kv.append_batch(None, [1]), TypeError, "ids"),
    # ---- allocate_batch
    ("allocate_batch/stale", lambda w: w.kv.allocate_batch([w.a, w.stale], 1), kvmm.Error, r"ids\[1\]"),
    ("allocate_batch/swapped", lambda w: w.kv.allocate_batch([w.a, w.sw], 1), kvmm.Error,
     r"ids\[1\].*swapped out"),
    ("allocate_batch/id-float", lambda w: w.kv.allocate_batch([w.a, w.b + 0.5], 1), TypeError, r"ids\[1\]"),
    ("allocate_batch/id-2^32+h", lambda w: w.kv.allocate_batch([w.a, BIG + w.b], 1), OverflowError, r"ids\[1\]"),
    ("allocate_batch/id-str", lambda w: w.kv.allocate_batch([w.a, "h"], 1), TypeError, r"ids\[1\]"),
    ("allocate_batch/n-negative", lambda w: w.kv.allocate_batch([w.a, w.b], [1, -1]), OverflowError,
     r"num_new_tokens\[1\] = -1"),
    ("allocate_batch/n-float", lambda w: w.kv.allocate_batch([w.a, w.b], 1.5), TypeError, "num_new_tokens"),
    ("allocate_batch/n-float-array", lambda w: w.kv.allocate_batch([w.a, w.b], f32(1, 2)), TypeError,
     "num_new_tokens"),
    ("allocate_batch/n-bool", lambda w: w.kv.allocate_batch([w.a, w.b], True), TypeError, "num_new_tokens"),
    ("allocate_batch/n-str", lambda w: w.kv.allocate_batch([w.a, w.b], "1"), TypeError, "num_new_tokens"),
    ("allocate_batch/n-length", lambda w: w.kv.allocate_batch([w.a, w.b], [1, 2, 3]), kvmm.Error,
     "num_new_tokens: 3 values for a batch of 2"),
    ("allocate_batch/lookahead-negative", lambda w: w.kv.allocate_batch([w.a, w.b], 1, -1), OverflowError,
     "lookahead = -1"),
    ("allocate_batch/too-many", lambda w: w.kv.allocate_batch([w.a, w.b], [1, BIG - 1], [0, 5]), kvmm.Error,
     r"num_new_tokens\[1\]"),
    # ---- commit_batch
    ("commit_batch/stale", lambda w: w.kv.commit_batch([w.a, w.stale]), kvmm.Error, r"ids\[1\]"),
    ("commit_batch/swapped", lambda w: w.kv.commit_batch([w.a, w.sw]), kvmm.Error, r"ids\[1\].*swapped out"),
    ("commit_batch/id-float", lambda w: w.kv.commit_batch([w.a, w.b + 0.5]), TypeError, r"ids\[1\]"),
    ("commit_batch/past-allocated", lambda w: w.kv.commit_batch([w.a, w.b], [10, 15]), kvmm.Error,
     r"num_computed\[1\] = 15"),
    ("commit_batch/backwards-twice", lambda w: w.kv.commit_batch([w.a, w.a], [10, 9]), kvmm.Error,
     r"num_computed\[1\] = 9.*already has 10"),
    ("commit_batch/before-pin", lambda w: w.kv.commit_batch([w.a, w.pend]), kvmm.Error,
     r"ids\[1\].*before the allocate"),
    ("commit_batch/before-pin-given", lambda w: w.kv.commit_batch([w.a, w.pend], [10, 8]), kvmm.Error,
     r"ids\[1\].*before the allocate"),
    ("commit_batch/n-negative", lambda w: w.kv.commit_batch([w.a], [-1]), OverflowError, r"num_computed\[0\] = -1"),
    ("commit_batch/n-float", lambda w: w.kv.commit_batch([w.a], 9.5), TypeError, "num_computed"),
    ("commit_batch/n-length", lambda w: w.kv.commit_batch([w.a], [9, 9]), kvmm.Error, "num_computed"),
    # ---- exports
    ("export_csr/stale", lambda w: w.kv.export_csr(0, [w.a, w.stale]), kvmm.Error, r"request = \d+"),
    ("export_csr/id-float", lambda w: w.kv.export_csr(0, [w.a + 0.5]), TypeError, r"batch\[0\]"),
    ("export_csr/id-2^32+h", lambda w: w.kv.export_csr(0, [BIG + w.a]), OverflowError, r"batch\[0\]"),
    ("export_csr/group", lambda w: w.kv.export_csr(7, [w.a]), kvmm.Error, "group = 7"),
    ("export_csr/indptr-int64", lambda w: w.kv.export_csr(0, [w.a], np.zeros(2, np.int64), np.zeros(8, np.int32),
                                                          np.zeros(1, np.int32)), TypeError, "indptr.*int32"),
    ("export_csr/indices-small", lambda w: w.kv.export_csr(0, [w.a], np.zeros(2, np.int32), np.zeros(1, np.int32),
                                                           np.zeros(1, np.int32)), kvmm.Error, "indices"),
    ("export_csr/read-only", lambda w: w.kv.export_csr(0, [w.a], np.zeros(2, np.int32).setflags(write=False) or
                                                       np.frombuffer(bytes(8), np.int32), np.zeros(8, np.int32),
                                                       np.zeros(1, np.int32)), TypeError, "indptr.*writable"),
    ("export_csr/one-array", lambda w: w.kv.export_csr(0, [w.a], np.zeros(2, np.int32)), kvmm.Error, "together"),
    ("export_csr/first_page-alone", lambda w: w.kv.export_csr(0, [w.a], first_page=np.zeros(1, np.int32)),
     kvmm.Error, "first_page"),
    ("export_dense/stale", lambda w: w.kv.export_dense(0, [w.stale], 8), kvmm.Error, r"request = \d+"),
    ("export_dense/table-float", lambda w: w.kv.export_dense(0, [w.a], block_table=np.zeros((1, 8))), TypeError,
     "block_table"),
    ("export_dense/table-small", lambda w: w.kv.export_dense(0, [w.a, w.b], block_table=np.zeros((1, 8), np.int32)),
     kvmm.Error, "block_table|size"),
    ("export_dense/narrow", lambda w: w.kv.export_dense(0, [w.b], block_table=np.zeros((1, 2), np.int32)),
     kvmm.Error, "max_pages"),
    ("export_dense/1-D-no-width", lambda w: w.kv.export_dense(0, [w.a], block_table=np.zeros(8, np.int32)),
     kvmm.Error, "max_pages"),
    ("export_dense/transposed", lambda w: w.kv.export_dense(0, [w.a], block_table=np.zeros((8, 2), np.int32).T),
     TypeError, "C-contiguous"),
    ("export_dense_incremental/stale", lambda w: w.kv.export_dense_incremental(
        0, [w.a, w.stale], np.zeros((2, 8), np.int32)), kvmm.Error, r"request = \d+"),
    ("export_dense_incremental/id-str", lambda w: w.kv.export_dense_incremental(
        0, ["h"], np.zeros((1, 8), np.int32)), TypeError, r"batch\[0\]"),
    ("export_dense_incremental/table-int64", lambda w: w.kv.export_dense_incremental(
        0, [w.a], np.zeros((1, 8), np.int64)), TypeError, "block_table.*int32"),
    ("export_dense/null_page-np-float32", lambda w: w.kv.export_dense(0, [w.a], 8, null_page=np.float32(0.5)),
     TypeError, "null_page"),
    ("export_csr/group-bool", lambda w: w.kv.export_csr(True, [w.a]), TypeError, "group"),
    ("export_dense_incremental/group", lambda w: w.kv.export_dense_incremental(
        7, [w.a], np.zeros((1, 8), np.int32)), kvmm.Error, "group = 7"),
    # ---- decode_step
    ("decode_step/stale", lambda w: w.kv.decode_step([w.a, w.stale], [1, 2], tables2(2)), kvmm.Error,
     r"request = \d+"),
    ("decode_step/pending", lambda w: w.kv.decode_step([w.a, w.pend], [1, 2], tables2(2)), kvmm.Error,
     "first allocate"),
    ("decode_step/swapped", lambda w: w.kv.decode_step([w.a, w.sw], [1, 2], tables2(2)), kvmm.Error, "swapped out"),
    ("decode_step/id-float", lambda w: w.kv.decode_step([w.a, w.b + 0.5], [1, 2], tables2(2)), TypeError,
     r"ids\[1\]"),
    ("decode_step/id-2^32+h", lambda w: w.kv.decode_step([w.a, BIG + w.b], [1, 2], tables2(2)), OverflowError,
     r"ids\[1\]"),
    ("decode_step/id-str", lambda w: w.kv.decode_step([w.a, "h"], [1, 2], tables2(2)), TypeError, r"ids\[1\]"),
    ("decode_step/token-negative", lambda w: w.kv.decode_step([w.a, w.b], [1, -1], tables2(2)), OverflowError,
     r"tokens\[1\] = -1"),
    ("decode_step/token-float", lambda w: w.kv.decode_step([w.a, w.b], [1, 3.9], tables2(2)), TypeError,
     r"tokens\[1\]"),
    ("decode_step/mismatch", lambda w: w.kv.decode_step([w.a, w.b], [1], tables2(2)), kvmm.Error, "tokens"),
    ("decode_step/table-int64", lambda w: w.kv.decode_step([w.a], [1], [np.zeros((1, 16), np.int64), None]),
     TypeError, r"tables\[0\].*int32"),
    ("decode_step/table-str", lambda w: w.kv.decode_step([w.a], [1], ["x", None]), TypeError, r"tables\[0\]"),
    ("decode_step/widths", lambda w: w.kv.decode_step([w.a], [1], [np.zeros((1, 16), np.int32),
                                                                   np.zeros((1, 8), np.int32)]),
     kvmm.Error, r"tables\[1\]"),
    ("decode_step/table-small", lambda w: w.kv.decode_step([w.a, w.b], [1, 2], tables2(1)), kvmm.Error,
     r"tables\[0\]"),
    ("decode_step/row-too-long", lambda w: w.kv.decode_step([w.a, w.b], [1, 2], tables2(2, width=3)), kvmm.Error,
     r"ids\[1\].*3 columns"),
    ("decode_step/groups", lambda w: w.kv.decode_step([w.a], [1], tables2(1) + [np.zeros((1, 16), np.int32)]),
     kvmm.Error, "group"),
    # ---- the module's other calls (no manager state involved: the world stays as it was)
    ("Buffer/overflow", lambda w: kvmm.Buffer([BIG, BIG]), ValueError, "shape"),
    ("Buffer/negative", lambda w: kvmm.Buffer([4, -1]), ValueError, r"shape\[1\] = -1"),
    ("Buffer/str", lambda w: kvmm.Buffer("x"), TypeError, "shape"),
    ("KVCacheManager/pages-negative", lambda w: kvmm.KVCacheManager(small_layout(), num_large_pages=-1), TypeError,
     "num_large_pages"),
    ("KVCacheManager/max_requests-0", lambda w: kvmm.KVCacheManager(small_layout(), num_large_pages=4,
                                                                    max_requests=0), kvmm.Error, "max_requests"),
    ("KVCacheManager/log", lambda w: kvmm.KVCacheManager(small_layout(), num_large_pages=4, log=5), TypeError, "log"),
    ("KVCacheManager/arena", lambda w: kvmm.KVCacheManager(small_layout(), arena=object()), TypeError, "arena"),
    ("Arena/device", lambda w: kvmm.Arena(small_layout(), 4, device="tpu"), kvmm.Error, "device = 'tpu'"),
    ("Arena/backing", lambda w: kvmm.Arena(small_layout(), 4, backing="lazy"), kvmm.Error, "backing = 'lazy'"),
    ("Arena/pages-negative", lambda w: kvmm.Arena(small_layout(), -4), TypeError, "num_large_pages"),
    ("presets/unknown", lambda w: kvmm.presets.by_name("nope"), kvmm.Error, "nope"),
    ("KVLayout/heads", lambda w: kvmm.KVLayout.plan([kvmm.LayerGroup.full_attention("bad", 2, 0, 64, 2, 16)]),
     kvmm.Error, "kv_heads"),
    ("read_hf_config/type", lambda w: kvmm.read_hf_config('{"model_type": "unknown_family"}'), kvmm.Error,
     "model_type"),
    ("read_hf_config/not-str", lambda w: kvmm.read_hf_config(5), TypeError, "json_text"),
]


@pytest.mark.parametrize("name,call,exc,match", CASES, ids=[c[0] for c in CASES])
def test_bad_call(name, call, exc, match):
    w = World()
    before = w.state()
    with pytest.raises(exc, match=match) as e:
        call(w)
    # A kvmm.Error is a RuntimeError; the Python types are never kvmm.Error.
    assert isinstance(e.value, kvmm.Error) == (exc is kvmm.Error)
    assert w.state() == before, name
    w.kv.check_invariants()
    w.serve()


def test_every_manager_call_has_a_case():
    """The table covers every public method of KVCacheManager that takes an argument."""
    no_args = {"begin_step", "stats", "counters", "take_events", "take_kv_events", "copies", "reset_prefix_cache",
               "check_invariants", "is_active"}  # is_active answers for any handle
    methods = {n for n in dir(kvmm.KVCacheManager) if not n.startswith("_") and callable(getattr(
        kvmm.KVCacheManager, n))} - no_args
    covered = {c[0].split("/")[0] for c in CASES}
    assert methods - covered == set()


# ---- accepted inputs: every integer array type whose values fit, and the batch semantics


@pytest.mark.parametrize("make", [
    lambda v: list(v), lambda v: tuple(v), lambda v: np.array(v, np.uint32), lambda v: np.array(v, np.int64),
    lambda v: np.array(v, np.int32), lambda v: np.array(v, np.uint64), lambda v: np.array(v, np.uint16),
    lambda v: np.array(v, np.int16), lambda v: np.array(v, np.uint8), lambda v: np.array(v, np.int8),
    lambda v: np.array(v, np.uint32)[::-1][::-1].copy(), lambda v: np.array(v + v, np.uint32)[::2],
    lambda v: array.array("I", v), lambda v: np.array(v, object), lambda v: [np.int64(x) for x in v],
    lambda v: np.array(v, np.dtype(">u4")),
], ids=["list", "tuple", "uint32", "int64", "int32", "uint64", "uint16", "int16", "uint8", "int8", "copy",
        "strided", "array.array", "object", "np-scalars", "big-endian"])
def test_integer_inputs_of_every_kind(make):
    w = World()
    kv = w.kv
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    r = kv.add_request(make(tokens))
    assert kv.num_tokens(r) == 9
    hit = kv.lookup_prefix(r)
    assert kv.allocate_batch(make([r]), make([9 - hit])) == 1
    kv.append_batch(make([r]), make([10]))
    kv.commit_batch(make([r]), make([9]))
    assert kv.num_computed(r) == 9 and kv.num_tokens(r) == 10
    assert list(kv.export_dense(0, make([r]), 4)[0][:3]) == list(kv.page_table(r, 0)[:3])
    kv.check_invariants()


def test_empty_batches_of_any_dtype():
    w = World()
    before = w.state()
    for empty in ([], (), np.array([]), np.array([], np.int64)):
        w.kv.append_batch(empty, empty)
        assert w.kv.allocate_batch(empty, 1) == 0
        w.kv.commit_batch(empty)
    assert w.state() == before


def test_a_request_twice_in_a_batch():
    w = World()
    kv, a = w.kv, w.a
    n = kv.num_tokens(a)
    kv.append_batch([a, a], [5, 6])
    assert kv.num_tokens(a) == n + 2
    kv.commit_batch([a, a], [9, 10])
    assert kv.num_computed(a) == 10
    kv.check_invariants()


BAD_ELEMENTS = [  # (make the bad element from the world, exception, what the message names)
    (lambda w: w.stale, kvmm.Error, "ids"),
    (lambda w: w.a + 0.5, TypeError, "ids"),
    (lambda w: BIG + w.a, OverflowError, "ids"),
    (lambda w: -1, OverflowError, "ids"),
    (lambda w: "h", TypeError, "ids"),
    (lambda w: None, TypeError, "ids"),
]


def test_one_bad_element_anywhere_in_a_batch():
    """Seeded: batch calls over the running requests with one bad element at a random
    position (or a bad token / count): always the exception naming that index, the state
    unchanged; and between them good calls that the manager keeps serving."""
    rng = np.random.default_rng(29)
    w = World(pages=512)
    kv = w.kv
    running = [w.a, w.b]
    for _ in range(6):  # more running requests, a step scheduled for each
        r = w.running(rng.integers(0, 50000, size=int(rng.integers(5, 30))))
        running.append(r)
    for r in running[2:]:
        kv.append_token(r, 1)
        assert kv.allocate(r, 1)
    bad_calls = 0
    for round_ in range(300):
        ids = [int(x) for x in rng.permutation(running)[: int(rng.integers(1, len(running) + 1))]]
        at = int(rng.integers(0, len(ids)))
        call = int(rng.integers(0, 5))
        w.live = running + [w.sw, w.pend]
        if round_ % 3 == 0:  # a good step: commit what was scheduled, append, allocate one more
            kv.begin_step()
            kv.commit_batch(running)
            kv.append_batch(running, rng.integers(0, 2**32, size=len(running), dtype=np.uint64))
            assert kv.allocate_batch(running, 1) == len(running)
            continue
        before = w.state()
        if rng.integers(0, 2) == 0:  # a bad id
            make, exc, _ = BAD_ELEMENTS[int(rng.integers(0, len(BAD_ELEMENTS)))]
            bad_ids = list(ids)
            bad_ids[at] = make(w)
            name = rf"(ids|batch)\[{at}\]"
            calls = [lambda: kv.append_batch(bad_ids, [1] * len(ids)), lambda: kv.allocate_batch(bad_ids, 1),
                     lambda: kv.commit_batch(bad_ids), lambda: kv.export_csr(0, bad_ids),
                     lambda: kv.decode_step(bad_ids, [1] * len(ids), tables2(len(ids), width=128))]
        else:  # a bad token or count among good ones
            good = [[1] * len(ids), [1] * len(ids), [kv.kv_len(r, 0) for r in ids], [1] * len(ids),
                    [0] * len(ids)][call]
            vals = list(good)
            big = 2**64 if call == 2 else BIG
            vals[at], exc = [(-1, OverflowError), (big, OverflowError), (0.5, TypeError), ("1", TypeError)][
                int(rng.integers(0, 4))]
            name = rf"{['tokens', 'num_new_tokens', 'num_computed', 'tokens', 'lookahead'][call]}\[{at}\]"
            calls = [lambda: kv.append_batch(ids, vals), lambda: kv.allocate_batch(ids, vals),
                     lambda: kv.commit_batch(ids, vals),
                     lambda: kv.decode_step(ids, vals, tables2(len(ids), width=128)),
                     lambda: kv.allocate_batch(ids, 1, vals)]
        with pytest.raises(exc, match=name):
            calls[call]()
        assert w.state() == before
        bad_calls += 1
    assert bad_calls > 150
    kv.check_invariants()
    w.serve()
