# The manager the bad-input tests (test_bad_input.py, test_input_defects.py) call into: a
# request in each state a call can meet, its observable state as one comparable value, and
# a check that it still serves.
import numpy as np

import kvmm
from conftest import small_layout

U32 = np.uint32
BIG = 2**32


class World:
    """A manager with a request in each state a call can meet: running with a step
    scheduled (a, b), swapped out (sw), looked up with its prefix hit not pinned yet (pend),
    and a freed handle (stale)."""

    def __init__(self, pages=48):
        self.kv = kv = kvmm.KVCacheManager(small_layout(), num_large_pages=pages, num_host_large_pages=16,
                                           max_requests=16)
        kv.begin_step()
        self.a = self.running(np.arange(9) + 1000)
        self.b = self.running(np.arange(13) + 2000)
        self.sw = self.running(np.arange(9) + 3000)
        assert kv.swap_out(self.sw) is not None
        self.stale = kv.add_request(np.arange(5, dtype=U32))
        kv.free(self.stale)
        self.pend = kv.add_request(np.arange(9, dtype=U32) + 1000)  # a's prompt: a cached prefix
        assert kv.lookup_prefix(self.pend) > 0
        kv.begin_step()
        for r in (self.a, self.b):  # a step scheduled, not committed: kv_len > num_computed
            kv.append_token(r, 7)
            assert kv.allocate(r, 1)
        self.live = [self.a, self.b, self.sw, self.pend]

    def running(self, prompt):
        kv = self.kv
        r = kv.add_request(np.asarray(prompt, U32))
        hit = kv.lookup_prefix(r)
        assert kv.allocate(r, len(prompt) - hit)
        kv.commit(r, len(prompt))
        return r

    def state(self):
        kv = self.kv
        c = kv.counters()
        counters = {k: getattr(c, k) for k in dir(c) if not k.startswith("_")}
        st = kv.stats()
        groups = [(g.used_pages, g.evictable_pages, g.empty_pages, g.large_pages, g.hit_pages, g.evicted_pages)
                  for g in st.groups]
        reqs = []
        for r in self.live:
            reqs.append((kv.is_active(r), kv.is_swapped(r), kv.num_computed(r), kv.num_allocated(r),
                         kv.num_tokens(r), kv.row(r),
                         [kv.kv_len(r, g) for g in range(2)],
                         [list(kv.page_table(r, g)) for g in range(2)],
                         [list(kv.host_page_table(r, g)) for g in range(2)]))
        return (counters, groups, st.free_large_pages, kv.num_active, kv.free_large_pages, kv.step, reqs,
                len(kv.copies()))

    def serve(self):
        """The manager still works: a decode step of the running requests, a new request end
        to end, and the invariants."""
        kv = self.kv
        kv.begin_step()
        ids = np.array([self.a, self.b], U32)
        tables = [np.zeros((2, 64), np.int32) for _ in range(2)]
        assert kv.decode_step(ids, np.array([5, 6], U32), tables, null_page=0) == 2
        for g in range(2):
            assert (tables[g] == kv.export_dense(g, ids, 64, null_page=0)).all()
        r = kv.add_request(np.arange(11, dtype=U32) + 9000)
        hit = kv.lookup_prefix(r)
        assert kv.allocate_batch([r], 11 - hit) == 1
        kv.commit_batch([r])
        assert kv.num_computed(r) == 11
        kv.free(r)
        kv.check_invariants()


def tables2(rows, width=16):
    return [np.zeros((rows, width), np.int32) for _ in range(2)]
