"""SchedulerOutput's block-table protocol, followed once for every test worker: new requests
bring their full lists, running ones the ids appended this step, resumed ones (after a
preemption) replace their lists; finished requests are dropped. O(ids in the output)."""

from __future__ import annotations


def follow(out, tables: dict[str, list[list[int]]], tokens: dict[str, list[int]], num_groups: int) -> dict[str, int]:
    """Updates `tables` (request -> per-group block ids) and `tokens` (request -> token ids,
    the prompt for a new request) from one SchedulerOutput; returns each scheduled request's
    num_computed_tokens before this step."""
    for rid in out.finished_req_ids:
        tables.pop(rid, None)
    starts = {}
    for nr in out.scheduled_new_reqs:
        tables[nr.req_id] = [list(g) for g in nr.block_ids]
        tokens.setdefault(nr.req_id, list(nr.prompt_token_ids))
        starts[nr.req_id] = nr.num_computed_tokens
    c = out.scheduled_cached_reqs
    for i, rid in enumerate(c.req_ids):
        new = c.new_block_ids[i]
        if rid in c.resumed_req_ids:
            tables[rid] = [list(g) for g in new]
        elif new is not None:
            for g in range(num_groups):
                tables[rid][g].extend(new[g])
        starts[rid] = c.num_computed_tokens[i]
    return starts
