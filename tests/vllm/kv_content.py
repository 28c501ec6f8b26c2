"""What each block holds, checked without a model: the stand-in worker records, for every
position it computes, a key of the request's context up to that position (LoRA id, cache
salt, token ids, and the identifier of the image whose placeholder covers the position) in
the (block, offset) slot its block table names. When a request is admitted (new or resumed)
with tokens already computed, every position below them in a non-null block must hold the
request's own key: a page shared across LoRA adapters, salts or images, a hit on a page
that does not hold those tokens, or an id another group or request overwrote, fails.
Blocks are one pool for every group, as in vLLM. Cost: O(positions written + positions
admitted from the cache)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Extras:
    """A request's cache keys besides its token ids (the trace's, as vLLM's Request has them)."""

    lora: int = 0
    salt: str | None = None
    images: list[tuple[str, int, int]] = field(default_factory=list)  # (identifier, offset, length)


class KVContent:
    def __init__(self, block_size: int, extras: dict[str, Extras], successor_groups: frozenset[int] = frozenset()):
        self.block_size = block_size
        # Groups holding an EAGLE / MTP drafter's layers: their KV at position p is computed
        # from token p + 1 as well (the drafter's input there is the next token's embedding),
        # so a slot holds the key of position p + 1.
        self.successor_groups = successor_groups
        self.extras = extras
        self.slots: dict[tuple[int, int], int] = {}
        self._keys: dict[str, list[int]] = {}

    def key(self, rid: str, tokens: list[int], pos: int) -> int:
        """The context key of position `pos` (a hash of everything the KV there depends on)."""
        keys = self._keys.setdefault(rid, [])
        if len(keys) <= pos:
            ex = self.extras.get(rid, Extras())
            prev = keys[-1] if keys else hash((ex.lora, ex.salt))
            for p in range(len(keys), pos + 1):
                image = next((i for i, o, n in ex.images if o <= p < o + n), None)
                prev = hash((prev, tokens[p], image))
                keys.append(prev)
        return keys[pos]

    def write(self, rid: str, tables: list[list[int]], tokens: list[int], start: int, end: int) -> None:
        """Positions [start, end) computed into every group's block (those of known tokens:
        with async scheduling and drafts the scheduler may run ahead of the accepted ones)."""
        for p in range(start, min(end, len(tokens))):
            for g, table in enumerate(tables):
                q = p + (g in self.successor_groups)
                if q >= len(tokens):
                    continue  # a drafter's last position waits for the next token
                block = table[p // self.block_size]
                assert block != 0, f"{rid}: position {p} of group {g} computed into the null block"
                self.slots[(block, p % self.block_size)] = self.key(rid, tokens, q)

    def check_admitted(self, rid: str, tables: list[list[int]], tokens: list[int], computed: int) -> None:
        """A request admitted with `computed` tokens from the cache: each held position below
        them holds this request's key."""
        for g, table in enumerate(tables):
            for p in range(computed):
                block = table[p // self.block_size]
                if block == 0:
                    continue  # out of the group's window: not held
                got = self.slots.get((block, p % self.block_size))
                assert got == self.key(rid, tokens, p + (g in self.successor_groups)), (
                    f"{rid}: admitted with {computed} computed tokens, but block {block} (group {g}) holds "
                    f"another context at position {p}")
