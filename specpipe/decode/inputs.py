"""A step's input block, [B, W + 1]: each row's last token, then its draft. It is built where
its parts are: on the host where the host knows all of it (the runner sends it with the step's
other inputs, one copy), split where the host knows the last tokens and the device the draft
(a head's or a draft model's), else on the device (a plain step queued ahead takes the last
tokens from the verdict in flight, decode/loop.py).
"""

from __future__ import annotations

import functools

import torch

from specpipe.drafts import DraftBatch
from specpipe.engine.base import Split


@functools.lru_cache(maxsize=64)
def empty_draft(width: int, device: torch.device) -> DraftBatch:
    """A plain step's draft: one per width and device, read only, so a plain step launches nothing for it."""
    return DraftBatch.empty(width, device)


def block(runner, rows: list, pending, draft: DraftBatch) -> torch.Tensor | Split:
    """[B, W + 1] the verify block of `rows` (None: a free row riding along), after `pending`."""
    last = last_tokens(runner.device, rows, pending)  # [B]
    if last.device.type == "cpu" and draft.host is not None:
        return torch.cat([last[:, None], draft.host], 1)
    if last.device.type == "cpu" and draft.width > 0:  # a head's or a draft model's draft: the runner joins them
        return Split(last[:, None], draft.tokens)
    last = last.to(runner.device, non_blocking=True)
    return last[:, None] if draft.width == 0 else torch.cat([last[:, None], draft.on(last.device).tokens], 1)


def last_tokens(device: torch.device, rows: list, pending) -> torch.Tensor:
    """[B] each row's last token: on the host where the host has them all, else on the device,
    from `pending`'s verdict for the rows it carries on (plain: its first column)."""
    fed = [pending is not None and pending.carries(slot, row) for slot, row in enumerate(rows)]
    host = [row.tokens[-1] if row is not None and not f else 0 for row, f in zip(rows, fed)]
    if not any(fed):
        return torch.tensor(host)
    carried = pending.verdict.ids[:, 0]  # [B'] the tokens pending emitted
    if len(rows) <= len(carried) and all(f or row is None for row, f in zip(rows, fed)):
        return carried[: len(rows)]  # no copy at all: the usual overlapped step
    if len(rows) > len(carried):
        carried = torch.cat([carried, carried.new_zeros(len(rows) - len(carried))])
    picks = torch.tensor([host, fed]).to(device, non_blocking=True)  # [2, B]: one copy
    return torch.where(picks[1].bool(), carried[: len(rows)], picks[0])
