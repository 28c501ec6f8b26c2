# Randomized differential test: a seeded operation sequence (add with shared prefixes and
# LoRA ids, lookup, allocate with lookahead, commit, append, fork, free, reset, swap out/in,
# pins, CSR exports, steps) runs through the Python bindings while being written as a
# script; the C++ driver (driver/driver.cpp) replays the script on the C++ KVCacheManager. Both
# print every result, page table and stats line the same way: the outputs must be equal.
import random
import subprocess

import numpy as np
import pytest

import kvmm

GROUPS = ["group full full 2 1 64 2 4", "group sliding local 2 1 64 2 4 8"]


def layout():
    return kvmm.KVLayout.plan([kvmm.LayerGroup.full_attention("full", 2, 1, 64, 2, 4),
                               kvmm.LayerGroup.sliding_window("local", 2, 1, 64, 2, 4, 8)])


def ids_text(ids):
    return "".join(f" {-1 if p == kvmm.NULL_PAGE else int(p)}" for p in ids)


def plan_text(plan):
    if plan is None:
        return "none"
    return f"{len(plan)}" + "".join(f" {g}:{s}:{d}" for g, s, d in plan)


class PySide:
    """Applies one script line through the bindings and returns its output lines."""

    def __init__(self):
        self.kv = None
        self.slots = {}
        self.pins = {}

    def tables(self):
        out = []
        kv = self.kv
        for slot in sorted(self.slots):
            r = self.slots[slot]
            if not kv.is_active(r):
                continue
            sw = kv.is_swapped(r)
            out.append(f"req {slot} computed={kv.num_computed(r)} allocated={kv.num_allocated(r)} "
                       f"tokens={kv.num_tokens(r)} swapped={int(sw)}")
            for g in range(2):
                table = kv.host_page_table(r, g) if sw else kv.page_table(r, g)
                out.append(f"  g{g}:{ids_text(table)}")
        st = kv.stats()
        out.append(f"stats free={st.free_large_pages} lookups={st.lookups} lookup_tokens={st.lookup_tokens} "
                   f"hit_tokens={st.hit_tokens}")
        for g in st.groups:
            out.append(f"  used={g.used_pages} evictable={g.evictable_pages} empty={g.empty_pages} "
                       f"large={g.large_pages} waste={g.waste_bytes} hit={g.hit_pages} evicted={g.evicted_pages}")
        return out

    def run(self, line):
        op, *a = line.split()
        a = [int(x) for x in a]
        kv = self.kv
        if op == "manager":
            self.kv = kvmm.KVCacheManager(layout(), num_large_pages=a[0], num_host_large_pages=a[1],
                                          max_requests=a[2], prefix_caching=bool(a[3]))
            return []
        if op == "step":
            kv.begin_step()
            return []
        if op == "tables":
            return self.tables()
        try:
            if op == "add":
                self.slots[a[0]] = kv.add_request(np.array(a[3:], np.uint32), lora_id=a[1])
                return ["ok"]
            if op == "lookup":
                return [str(kv.lookup_prefix(self.slots[a[0]]))]
            if op == "alloc":
                return [str(int(kv.allocate(self.slots[a[0]], a[1], a[2])))]
            if op == "commit":
                kv.commit(self.slots[a[0]], a[1])
            elif op == "append":
                kv.append_token(self.slots[a[0]], a[1])
            elif op == "fork":
                self.slots[a[1]] = kv.fork(self.slots[a[0]])
            elif op == "free":
                kv.free(self.slots[a[0]])
            elif op == "reset":
                kv.reset(self.slots[a[0]])
            elif op == "swapout":
                return [plan_text(kv.swap_out(self.slots[a[0]]))]
            elif op == "swapin":
                return [plan_text(kv.swap_in(self.slots[a[0]]))]
            elif op == "pin":
                self.pins[a[1]] = kv.pin_prefix(self.slots[a[0]])
            elif op == "unpin":
                kv.unpin(self.pins[a[0]])
            elif op == "export":
                batch = np.array([self.slots[s] for s in a[1:]], np.uint32)
                indptr, indices, last, _ = kv.export_csr(a[0], batch)
                return ["csr" + "".join(f" {x}" for x in indptr) + " |" + "".join(f" {x}" for x in indices) + " |"
                        + "".join(f" {x}" for x in last)]
            else:
                raise AssertionError(op)
            return ["ok"]
        except kvmm.Error:
            return ["error"]


def next_op(rng, side, next_slot, next_pin):
    """A random op, mostly valid for the current state (invalid ones must fail alike)."""
    kv = side.kv
    live = [s for s, r in side.slots.items() if kv.is_active(r)]
    k = rng.random()
    if (k < 0.12 and len(live) < 24) or not live:
        base = [7, 7, 9, 1, 2, 3, 4, 5, 6, 8, 10, 11][: rng.choice([0, 4, 8, 12])]
        tokens = base + [rng.randrange(50) for _ in range(rng.randrange(1, 30))]
        return f"add {next_slot} {rng.choice([0, 0, 1])} {len(tokens)} " + " ".join(map(str, tokens)), "slot"
    s = rng.choice(live)
    r = side.slots[s]
    fresh = kv.num_allocated(r) == 0
    if k < 0.2 and (fresh or rng.random() < 0.1):  # once before the first allocate
        return f"lookup {s}", None
    if k < 0.45:
        if kv.num_allocated(r) > kv.num_computed(r) and rng.random() < 0.7:
            return f"commit {s} {rng.randint(kv.num_computed(r) + 1, kv.num_allocated(r))}", None
        if kv.num_tokens(r) > kv.num_allocated(r):
            n = min(kv.num_tokens(r) - kv.num_allocated(r), rng.choice([1, 2, 5, 17, 64]))
            return f"alloc {s} {n} {rng.choice([0, 0, 3])}", None
        return f"append {s} {rng.randrange(50)}", None
    if k < 0.55:
        if kv.num_tokens(r) <= kv.num_allocated(r):
            return f"append {s} {rng.randrange(50)}", None
        return f"alloc {s} {kv.num_tokens(r) - kv.num_allocated(r)} 0", None
    if k < 0.6:
        return f"fork {s} {next_slot}", "slot"
    if k < 0.66 or (len(live) > 16 and rng.random() < 0.2):
        return f"free {s}", None
    if k < 0.72:
        return f"reset {s}", None
    if k < 0.76:
        return (f"swapin {s}" if kv.is_swapped(r) else f"swapout {s}"), None
    if k < 0.79:
        return f"pin {s} {next_pin}", "pin"
    if k < 0.82 and side.pins:
        return f"unpin {rng.choice(sorted(side.pins))}", None
    if k < 0.92:
        ready = [x for x in live if kv.num_allocated(side.slots[x]) > 0 and not kv.is_swapped(side.slots[x])]
        batch = rng.sample(ready or live, min(len(ready or live), rng.randint(1, 6)))
        return f"export {rng.randrange(2)} " + " ".join(map(str, batch)), None
    return "step", None


@pytest.mark.parametrize("seed,caching", [(1, 1), (2, 1), (3, 0), (4, 1)])
def test_python_and_cpp_agree(tmp_path, driver_path, seed, caching):
    rng = random.Random(seed)
    side = PySide()
    script = GROUPS + [f"manager 64 32 64 {caching}", "step"]
    out = []
    for line in script[2:]:
        out += side.run(line)
    next_slot = next_pin = 0
    for i in range(3000):
        line, kind = next_op(rng, side, next_slot, next_pin)
        next_slot += kind == "slot"
        next_pin += kind == "pin"
        script.append(line)
        out += side.run(line)
        if i % 100 == 99:
            script.append("tables")
            out += side.run("tables")
    script.append("tables")
    out += side.run("tables")
    side.kv.check_invariants()
    assert out.count("error") < len(out) // 8, "mostly valid operations"
    assert any(line.startswith("csr") for line in out) and any(line[:1].isdigit() and ":" in line for line in out)
    path = tmp_path / "ops.txt"
    path.write_text("\n".join(script) + "\n")
    cpp = subprocess.run([str(driver_path), str(path)], capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(cpp) == len(out)
    for n, (p, c) in enumerate(zip(out, cpp)):
        assert p == c, f"line {n}: python {p!r} vs C++ {c!r}"
