# Hits finer than a page from Python (issue 34 item 3): hit_unit lets a hit end inside a
# page, the admitting allocate lists the copy of the partial page; bad values raise.
import pytest

import kvmm


def layout():
    return kvmm.KVLayout.plan([kvmm.LayerGroup.full_attention("full", 1, 1, 8, 2, 16)])


def test_hit_inside_a_page_copies_it():
    kv = kvmm.KVCacheManager(layout(), num_large_pages=32, hit_unit=4)
    a_prompt = list(range(1000, 1000 + 16 * 4 + 5))
    kv.begin_step()
    a = kv.add_request(a_prompt)
    assert kv.lookup_prefix(a) == 0
    assert kv.allocate(a, len(a_prompt))
    kv.commit(a, len(a_prompt))
    src = list(kv.page_table(a, 0))[2]
    kv.free(a)

    prompt = a_prompt[: 16 * 2 + 11] + [7] * 20  # 2 pages and 11 tokens of page 2 agree
    kv.begin_step()
    b = kv.add_request(prompt)
    assert kv.lookup_prefix(b) == 16 * 2 + 8  # the last whole 4-token unit
    assert kv.allocate(b, len(prompt) - 40)
    mine = list(kv.page_table(b, 0))[2]
    assert mine != src
    assert [list(c) for c in kv.copies()] == [[0, src, mine]]
    kv.check_invariants()


def test_next_turn_hits_into_a_finished_requests_partial_last_page():
    lay = kvmm.KVLayout.plan([kvmm.LayerGroup.full_attention("full", 1, 1, 8, 2, 64)])
    for unit, expect in ((0, 64), (4, 68), (1, 70)):
        kv = kvmm.KVCacheManager(lay, num_large_pages=16, hit_unit=unit)
        turn = list(range(100, 170))  # 70 tokens: one full 64-token page and 6 tokens
        kv.begin_step()
        a = kv.add_request(turn)
        kv.lookup_prefix(a)
        assert kv.allocate(a, len(turn))
        kv.commit(a, len(turn))
        src = list(kv.page_table(a, 0))[1]
        kv.free(a)
        kv.begin_step()
        b = kv.add_request(turn + [5] * 30)  # the next turn
        assert kv.lookup_prefix(b) == expect
        assert kv.allocate(b, 100 - expect)
        copies = [list(c) for c in kv.copies()]
        assert copies == ([] if unit == 0 else [[0, src, list(kv.page_table(b, 0))[1]]])
        kv.check_invariants()


def test_off_by_default_and_bad_values():
    kv = kvmm.KVCacheManager(layout(), num_large_pages=32)
    p = list(range(1, 40))
    kv.begin_step()
    a = kv.add_request(p)
    kv.lookup_prefix(a)
    assert kv.allocate(a, len(p))
    kv.commit(a, len(p))
    kv.free(a)
    b = kv.add_request(p[:20] + [0] * 10)
    assert kv.lookup_prefix(b) == 16
    with pytest.raises(kvmm.Error, match="hit_unit = 3"):
        kvmm.KVCacheManager(layout(), num_large_pages=8, hit_unit=3)
    with pytest.raises((TypeError, OverflowError, ValueError)):
        kvmm.KVCacheManager(layout(), num_large_pages=8, hit_unit=-1)
