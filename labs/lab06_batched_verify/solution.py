"""Lab 6 — a worked solution, written the way a student would (for instructors)."""
from __future__ import annotations

import torch


def step_layout(rows_ids, lengths, pad_id=0):
    rows = [[int(t) for t in r] for r in rows_ids]
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), pad_id, dtype=torch.long)
    pos = torch.full((len(rows), n), -1, dtype=torch.long)
    for b, row in enumerate(rows):
        start = n - len(row)
        for j, tok in enumerate(row):
            ids[b, start + j] = tok
            pos[b, start + j] = lengths[b] + j
    return ids, pos


def ragged_attention_mask(slot_pos, query_pos, dtype=torch.float32):
    b, s = slot_pos.shape
    n = query_pos.shape[1]
    keys = slot_pos[:, None, :]  # [B, 1, S]
    queries = query_pos[:, :, None]  # [B, N, 1]
    allowed = (keys >= 0) & (keys <= queries)
    for j in range(n):  # padding queries: their own slot only
        own = s - n + j
        allowed[:, j, own] |= query_pos[:, j] < 0
    mask = torch.zeros(b, n, s, dtype=dtype)
    mask[~allowed] = torch.finfo(dtype).min
    return mask[:, None]


def verify_rows(logits, drafts):
    n = logits.shape[1]
    emitted, accepted = [], []
    for b, draft in enumerate(drafts):
        draft = [int(t) for t in draft]
        mine = logits[b, n - len(draft) - 1:]  # this row's positions: the last len + 1 columns
        best = mine.argmax(-1).tolist()
        a = 0
        while a < len(draft) and draft[a] == best[a]:
            a += 1
        emitted.append(draft[:a] + [best[a]])
        accepted.append(a)
    return emitted, accepted


def rollback(slot_pos, keep):
    out = slot_pos.clone()
    for b, k in enumerate(keep):
        out[b][out[b] >= k] = -1
    return out


def compaction_index(slot_pos):
    b, s = slot_pos.shape
    live = [[(int(slot_pos[r, c]), c) for c in range(s) if slot_pos[r, c] >= 0] for r in range(b)]
    width = max(len(x) for x in live)
    index = torch.zeros(b, width, dtype=torch.long)
    new_pos = torch.full((b, width), -1, dtype=torch.long)
    for r, slots in enumerate(live):
        slots.sort()
        start = width - len(slots)
        for w, (p, c) in enumerate(slots):
            index[r, start + w] = c
            new_pos[r, start + w] = p
    return index, new_pos
