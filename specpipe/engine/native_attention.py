"""The native forward's cache and attention parts (native_model.py runs them): the preallocated
`KVCache`, the boolean mask over its slots (a row sees the slots before its block, its
ancestors-or-self inside it, and in a sliding-window layer only what the window reaches), the
rotary tables and rotation, and `_attend_rows`, the exact precisions' attention one query row at
a time (a verify row computed bit for bit as a one-token forward computes it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F



class KVCache:
    """Keys and values, preallocated: per layer one [B, 2 · kv heads, capacity + spare, head dim]
    tensor (`layers`), its first kv heads the keys and the rest the values, so a block's keys
    and values are written in one copy (one kernel a layer fewer on a GPU). `keys` and `values`
    are views of them. Each layer's tensor is a tensor of its own (a compiled graph writes it in
    place). `capacity` slots hold a sequence; `spare` slots past them take the keys of a static
    step's padding rows (engine/static.py), which no real row sees."""

    def __init__(self, layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, spare: int = 0):
        shape = (batch, 2 * kv_heads, capacity + spare, head_dim)
        self._of([torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)], capacity)

    def _of(self, layers: list[torch.Tensor], capacity: int) -> "KVCache":
        self.layers, self.capacity = layers, capacity
        self.keys = [t[:, : t.shape[1] // 2] for t in layers]  # [B, kv heads, capacity + spare, D] views
        self.values = [t[:, t.shape[1] // 2 :] for t in layers]
        return self

    @property
    def width(self) -> int:
        """Slots allocated per row (capacity and spare): what a static step attends over."""
        return self.layers[0].shape[2] if self.layers else 0

    @property
    def batch(self) -> int:
        return self.layers[0].shape[0] if self.layers else 0

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.layers)

    def rows(self, count: int, first: int = 0) -> "KVCache":
        """Rows first..first+count-1 as a cache of their own: views, so writes land in this one."""
        return object.__new__(KVCache)._of([t[first : first + count] for t in self.layers], self.capacity)

    def row(self, index: int) -> "KVCache":
        return self.rows(1, index)


def host_parents(tree: torch.Tensor | None) -> list[list[int]] | None:
    """A tree's parents [B, N] as host ints, for the CPU's paths that lay rows out by them (the
    exact row attention, the C kernel's row table): a CPU tensor's read is no device sync. A
    GPU's tree never comes here (its rows attend through the mask)."""
    if tree is None:
        return None
    if tree.device.type != "cpu":
        raise ValueError("a tree's host layout is the CPU's: on a GPU its rows attend through the mask")
    return tree.tolist()


def _row_keys(starts: list[int], n: int, trees: list[list[int]] | None) -> list[list[tuple[int, int, bool]]]:
    """For each batch row, its block rows in the order they attend: (row, width, moved). Row
    `row` attends to slots 0..width-1, which must hold its prefix and its path (ancestors and
    itself) in path order, as a sequential cache would; moved: its own key is not at slot
    width - 1 yet and is copied there first. A chain's rows are in place. A tree's (trees[b]:
    row b's parents, padding nodes hanging off nothing) are visited depth first, so each row's
    ancestors already sit in the slots before its own. All host ints."""
    out = []
    for b, first in enumerate(starts):
        if trees is None:
            out.append([(i, first + i + 1, False) for i in range(n)])
            continue
        depth = [0]  # per block row: its ancestors, row 0 included, not itself
        children: list[list[int]] = [[] for _ in range(n)]
        for node, parent in enumerate(trees[b]):
            depth.append(depth[max(parent, -1) + 1] + 1)
            children[max(parent, -1) + 1].append(node + 1)  # a padding node: a child of row 0
        held = list(range(n))  # held[d]: the block row whose key is at slot first + d
        order, todo = [], [0]
        while todo:  # depth-first, preorder: slots first..first+depth-1 hold the row's ancestors
            i = todo.pop()
            order.append((i, first + depth[i] + 1, held[depth[i]] != i))
            held[depth[i]] = i
            todo.extend(reversed(children[i]))
        out.append(order)
    return out


def _attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                 start: list[int], rows: list[list[tuple[int, int, bool]]], window: int | None = None) -> torch.Tensor:
    """Attention one query row at a time, each exactly as a one-token forward computes it (the
    same call on the same slice of the cache, no mask): CPU SDPA's reduction order depends on
    the number of queries, the key width and the mask, so a batched block is not bitwise equal
    to one-token steps. A tree row's path is laid out in the block's slots as it goes (one key
    moved per row, depth first; no gather of the prefix), and the block order is restored after.
    q [B, kv heads, group, n, D]; k, v: the block's [B, n, kv heads, D], already in the cache at
    slots start[b]...; keys, values [B, kv heads, capacity, D] -> [B, n, kv heads, group, D].
    window: a sliding window's length: a row sees its last `window` slots (its path's positions), as
    its one-token forward does."""
    out = []
    for b, order in enumerate(rows):
        queries = q[b].permute(2, 0, 1, 3).contiguous()  # [n, kv heads, group, D]: row i is queries[i : i + 1]
        att: list[torch.Tensor | None] = [None] * len(order)
        moved = False
        for i, width, move in order:
            if move:
                keys[b, :, width - 1], values[b, :, width - 1] = k[b, i], v[b, i]
                moved = True
            first = 0 if window is None else max(0, width - window)
            att[i] = F.scaled_dot_product_attention(queries[i : i + 1], keys[b : b + 1, :, first:width],
                                                    values[b : b + 1, :, first:width])
        if moved:  # the block's keys back in block order: what `keep` gathers the accepted path from
            block = slice(start[b], start[b] + k.shape[1])
            keys[b, :, block], values[b, :, block] = k[b].transpose(0, 1), v[b].transpose(0, 1)
        out.append(att[0] if len(att) == 1 else torch.cat(att))  # [n, kv heads, group, D]
    return out[0][None] if len(out) == 1 else torch.stack(out)


def _mask(start: torch.Tensor, n: int, width: int, ancestry: torch.Tensor | None) -> torch.Tensor:
    """[B, 1, n, width] bool: slot j is visible to block row i of row b (ancestry [B, n, n]: a
    tree's, per row; None: causal)."""
    batch = start.shape[0]
    block = (torch.ones(n, n, dtype=torch.bool, device=start.device).tril().expand(batch, n, n) if ancestry is None
             else ancestry.to(start.device))
    column = torch.arange(width, device=start.device)[None, :] - start[:, None]  # [B, width]: slot - block start
    before = column < 0
    inside = (column >= 0) & (column < n)
    in_block = block.gather(2, column.clamp(0, n - 1)[:, None, :].expand(-1, n, -1))  # [B, n, width]
    return (before[:, None] | (inside[:, None] & in_block))[:, None]


def key_positions(start: torch.Tensor, offsets: torch.Tensor, width: int) -> torch.Tensor:
    """[B, width]: the position of the key at each slot when a tree block sits at slots
    start[b]..: a slot before the block holds its own position, block slot start + i holds
    start + offsets[b, i] (its depth; offsets [B, n]), slots past the block their index (never visible)."""
    n = offsets.shape[-1]
    slot = torch.arange(width, device=start.device)[None]
    column = slot - start[:, None]  # [B, width]: slot - block start
    inside = (column >= 0) & (column < n)
    depth = offsets.expand(start.shape[0], n).gather(1, column.clamp(0, n - 1))
    return torch.where(inside, start[:, None] + depth, slot)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotary embedding (rotate-half form) of x [T, heads, D], in place (x may be a view of the
    fused projection's output), computed in the tables' dtype (`_rope_tables`). `sin` is
    signed: its first half negated, so rotate-half's `cat([-x2, x1]) * sin` is
    `cat([x2, x1]) * sin` here, the same bits (a sign flip is exact) one kernel fewer a layer.
    The second product and the sum are one `addcmul` (one kernel fewer again; in a half
    precision the sum of the two is rounded once, where transformers rounds the second product
    first: a last-bit difference at most)."""
    x1, x2 = x.chunk(2, -1)
    swapped = torch.cat([x2, x1], -1).to(cos.dtype)  # a copy: x may change now
    if x.dtype == cos.dtype:  # the rotation written straight into x: no copy back
        x.mul_(cos).addcmul_(swapped, sin)
    else:
        x.copy_((x.to(cos.dtype) * cos).addcmul_(swapped, sin))


def _rope_tables(rotary: torch.nn.Module, length: int, head_dim: int, dtype: torch.dtype,
                 activations: torch.dtype, kind: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, signed sin [length, D] (see `_rotate`), in the activations' dtype where it is a half
    precision, as transformers applies rotary (its tables computed in float32, then rounded to
    the activations' dtype): on bf16 the rotation is then two casts a layer cheaper, in the
    arithmetic of transformers' own bf16 forward. Wider activations get float32 or wider tables.
    kind: the layer type whose table this is, where the module keeps one per type (Gemma 3). A
    partial rotary factor gives tables narrower than D: the dims they rotate."""
    dtype = torch.promote_types(dtype, torch.float32)
    extra = () if kind is None else (kind,)
    with torch.no_grad():  # [1, length, R], the model's attention scaling included
        cos, sin = rotary(torch.zeros(1, 1, head_dim, dtype=dtype), torch.arange(length)[None], *extra)
    cos, sin = cos[0], sin[0].clone()
    sin[:, : sin.shape[-1] // 2] *= -1
    table = activations if activations in (torch.bfloat16, torch.float16) else dtype
    return cos.to(table), sin.to(table)
