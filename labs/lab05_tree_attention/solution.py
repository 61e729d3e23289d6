"""Lab 5 — a worked solution, written the way a student would (for instructors)."""
from __future__ import annotations

import torch


def _parent_list(parents):
    p = [int(x) for x in (parents.tolist() if isinstance(parents, torch.Tensor) else parents)]
    for i, par in enumerate(p):
        if not -1 <= par < i:
            raise ValueError(f"parents[{i}] = {par}: must be -1 (the root) or an earlier node index")
    return p


def tree_depths(parents):
    p = _parent_list(parents)
    depth = []
    for par in p:
        depth.append(1 if par == -1 else depth[par] + 1)
    return torch.tensor(depth, dtype=torch.long)


def tree_attention_mask(parents, past_len, dtype=torch.float32):
    p = _parent_list(parents)
    n = len(p)
    allowed = torch.zeros(n + 1, past_len + n + 1, dtype=torch.bool)
    allowed[:, : past_len + 1] = True  # the prefix and the root
    for i in range(n):
        j = i
        while j != -1:  # walk up: node i sees itself and every ancestor
            allowed[i + 1, past_len + 1 + j] = True
            j = p[j]
    mask = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype)
    mask[allowed] = 0.0
    return mask[None, None]


def tree_position_ids(parents, past_len):
    depth = tree_depths(parents)
    return (torch.cat([torch.zeros(1, dtype=torch.long), depth]) + past_len)[None]


def tree_greedy_verify(target_logits, parents, draft_tokens):
    p = _parent_list(parents)
    tokens = [int(t) for t in draft_tokens]
    best = target_logits.argmax(dim=-1).tolist()
    run = []  # length of the all-correct path ending at node i (0: some node on it is wrong)
    for i, par in enumerate(p):
        ok = tokens[i] == best[par + 1] and (par == -1 or run[par] > 0)
        run.append((1 if par == -1 else run[par] + 1) if ok else 0)
    accepted = []
    if run and max(run) > 0:
        node = run.index(max(run))  # the first of the longest
        while node != -1:
            accepted.append(node)
            node = p[node]
        accepted.reverse()
    last_slot = accepted[-1] + 1 if accepted else 0
    emitted = [tokens[i] for i in accepted] + [best[last_slot]]
    return accepted, emitted
