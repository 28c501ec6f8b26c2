#!/usr/bin/python3
# An independent consumer of kvmm's KV event stream, written the way a KV-aware router
# reads vLLM's: SUB to [topic][seq u64 BE][msgpack KVEventBatch], decode with vLLM's schema
# (map or positional array encoding), detect sequence gaps and fill them through the
# ROUTER replay socket (request: start seq u64 BE; answers [seq, payload]... then seq -1),
# and keep the set of cached (group_idx, block hash) per group.
#
# Driven over stdin by the C++ test, one command a line:
#   sync <seq>   wait until every batch up to <seq> is applied (replaying if need be),
#                then print "state <blocks> <digest> <last_seq> <replays> <lost> <errors>"
#   quit
# --drop-every N ignores every Nth live message (a simulated gap: replay must fill it).
import argparse
import os
import sys

import msgpack
import zmq

MASK = (1 << 64) - 1


def mix(group, h):
    # splitmix64 of hash ^ group * golden ratio: the C++ test computes the same digest.
    z = (h ^ (group * 0x9E3779B97F4A7C15)) & MASK
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


STORED_FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                 "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"]
REMOVED_FIELDS = ["block_hashes", "medium", "group_idx"]
KINDS = {"full_attention", "sliding_window", "chunked_local_attention", "mamba"}


def as_event(raw):
    """vLLM's event as a dict with every field (defaults for dropped ones), either encoding."""
    if isinstance(raw, dict):
        tag = raw["type"]
        fields = raw
    else:
        tag = raw[0]
        names = STORED_FIELDS if tag == "BlockStored" else REMOVED_FIELDS if tag == "BlockRemoved" else []
        if len(raw) - 1 > len(names):
            raise ValueError(f"{tag}: {len(raw) - 1} fields, schema has {len(names)}")
        fields = dict(zip(names, raw[1:]))
    ev = {"type": tag, "group_idx": 0, "parent_block_hash": None, "extra_keys": None, "lora_id": None,
          "kv_cache_spec_sliding_window": None, "medium": None}
    ev.update(fields)
    return ev


class Consumer:
    def __init__(self, args):
        self.args = args
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, args.topic.encode())
        self.sub.connect(args.endpoint)
        self.replay = self.ctx.socket(zmq.DEALER)
        self.replay.setsockopt(zmq.RCVHWM, 0)
        self.replay.connect(args.replay)
        self.blocks = set()
        self.digest = 0
        self.last = -1
        self.pending = {}  # seq -> payload received live ahead of a gap
        self.replaying = False
        self.replays = 0
        self.lost = 0
        self.errors = 0
        self.live = 0

    def apply(self, payload):
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        if isinstance(batch, dict):
            events = batch["events"]
            rank = batch.get("data_parallel_rank")
        else:
            events = batch[1]
            rank = batch[2] if len(batch) > 2 else None
        if rank != self.args.rank:
            self.errors += 1
        for raw in events:
            ev = as_event(raw)
            tag, group = ev["type"], ev["group_idx"]
            if tag == "BlockStored":
                hashes = ev["block_hashes"]
                if len(ev["token_ids"]) != len(hashes) * ev["block_size"] or ev["kv_cache_spec_kind"] not in KINDS:
                    self.errors += 1
                if (ev["kv_cache_spec_kind"] == "sliding_window") != (ev["kv_cache_spec_sliding_window"] is not None):
                    self.errors += 1
                for h in hashes:
                    if (group, h) not in self.blocks:
                        self.blocks.add((group, h))
                        self.digest = (self.digest + mix(group, h)) & MASK
            elif tag == "BlockRemoved":
                for h in ev["block_hashes"]:
                    if (group, h) in self.blocks:
                        self.blocks.remove((group, h))
                        self.digest = (self.digest - mix(group, h)) & MASK
            elif tag == "AllBlocksCleared":
                self.blocks.clear()
                self.digest = 0
            else:
                self.errors += 1

    def take(self, seq, payload):
        if seq <= self.last:
            return
        if seq == self.last + 1:
            self.apply(payload)
            self.last = seq
            while self.last + 1 in self.pending:
                self.apply(self.pending.pop(self.last + 1))
                self.last += 1
        else:
            self.pending[seq] = payload
            self.request_replay()

    def request_replay(self):
        if not self.replaying:
            self.replaying = True
            self.replays += 1
            self.replay.send_multipart([b"", (self.last + 1).to_bytes(8, "big")])

    def on_replay(self):
        frames = self.replay.recv_multipart()
        seq = int.from_bytes(frames[-2], "big", signed=True)
        if seq != -1:
            if seq > self.last + 1:  # no longer buffered by the publisher: skip ahead
                self.lost += seq - self.last - 1
                self.last = seq - 1
            self.take(seq, frames[-1])
            return
        self.replaying = False
        if self.pending and min(self.pending) > self.last + 1:
            self.request_replay()

    def on_live(self):
        topic, seq_bytes, payload = self.sub.recv_multipart()
        self.live += 1
        if self.args.drop_every and self.live % self.args.drop_every == 0:
            return
        self.take(int.from_bytes(seq_bytes, "big"), payload)

    def run(self):
        poller = zmq.Poller()
        poller.register(self.sub, zmq.POLLIN)
        poller.register(self.replay, zmq.POLLIN)
        stdin = sys.stdin.fileno()
        poller.register(stdin, zmq.POLLIN)
        buf = b""
        target = None
        idle = 0
        while True:
            events = dict(poller.poll(50))
            if self.sub in events:
                self.on_live()
            if self.replay in events:
                self.on_replay()
            if stdin in events:
                chunk = os.read(stdin, 4096)
                if not chunk:
                    return
                buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                cmd = line.decode().split()
                if cmd[0] == "quit":
                    return
                target = int(cmd[1])
                idle = 0
            if target is not None:
                if self.last >= target:
                    print(f"state {len(self.blocks)} {self.digest} {self.last} {self.replays} {self.lost} {self.errors}",
                          flush=True)
                    target = None
                elif not events:
                    idle += 1
                    if idle >= 4:  # 200 ms without progress: the tail was lost, replay it
                        if self.replaying and idle >= 40:
                            self.replaying = False  # a lost answer: ask again
                        self.request_replay()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--replay", required=True)
    p.add_argument("--topic", default="")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--drop-every", type=int, default=0)
    args = p.parse_args()
    print("ready", flush=True)
    Consumer(args).run()


if __name__ == "__main__":
    main()
