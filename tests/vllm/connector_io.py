"""The worker side of vLLM's ExampleConnector (a KV store on disk), for the stand-in worker:
a request the connector marks for storing has its prompt's context keys (kv_content.py)
saved once its prompt is computed, and the connector's folder for that prompt is created
then (the scheduler side looks for it); a request marked for loading gets the saved keys
written into the slots the connector's metadata names, in the step that admits it. So a
connector hit whose tokens land in the wrong blocks, or in blocks another request holds,
fails the content check. (vLLM's own worker side saves in the request's first step, before
a chunked prompt is computed; saving when it is computed keeps the store's content whole.)
Cost: O(tokens stored and loaded)."""

from __future__ import annotations

import os

from kv_content import KVContent


class ConnectorStore:
    def __init__(self, connector, content: KVContent):
        self.connector = connector
        self.content = content
        self.saved: dict[str, list[int]] = {}  # folder -> context keys of the stored tokens
        self.pending: dict[str, tuple[str, int]] = {}  # request -> (folder, tokens to store)
        self.loads = 0  # tokens loaded

    def before_step(self, out, tables: dict[str, list[list[int]]]) -> None:
        """Loads of this step (before its K/V writes and reads); stores to make later."""
        meta = out.kv_connector_metadata
        if meta is None:
            return
        bs = self.content.block_size
        new = [nr.req_id for nr in out.scheduled_new_reqs]
        for m in meta.requests:
            folder = self.connector._generate_foldername_debug(m.token_ids, m.mm_hashes, create_folder=False)
            slots = m.slot_mapping.tolist()
            if m.is_store:
                # The new request whose blocks the slots are (two such requests share the
                # pages, so their tokens and keys, up to the end).
                rid = next(r for r in new if all(tables[r][0][p // bs] == s // bs for p, s in enumerate(slots)))
                self.pending[rid] = (folder, len(slots))
                continue
            keys = self.saved[folder]
            assert len(keys) >= len(slots), f"a load of {len(slots)} tokens from a store of {len(keys)}"
            for p, s in enumerate(slots):
                self.content.slots[(s // bs, s % bs)] = keys[p]
            self.loads += len(slots)

    def after_step(self, tokens: dict[str, list[int]], kv_done: dict[str, int]) -> None:
        """Stores whose prompt tokens are now computed: saved, and their folder created."""
        for rid, (folder, n) in list(self.pending.items()):
            if kv_done.get(rid, 0) >= n:
                self.saved[folder] = [self.content.key(rid, tokens[rid], p) for p in range(n)]
                os.makedirs(folder, exist_ok=True)
                del self.pending[rid]
