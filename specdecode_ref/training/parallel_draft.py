"""Training the parallel drafter (notebook 13): the draft model learns to predict K tokens at once.

At inference the drafter reads the committed tokens followed by K − 1 mask tokens and predicts
position j from mask m_j (proposers/parallel_draft.py). Training must show it that situation at
every answer position, without one forward per (position, offset) pair. PARD's trick, done here
too, is to lay all of them out in ONE sequence with a custom attention mask:

* the real tokens x_0 .. x_{T-1}, causal as usual (entry p predicts x_{p+1}: offset 0);
* for each offset j = 1 .. K − 1 and each position p, a mask entry m_j at position p standing for
  "the context ends at p − j, then j masks": it sees the real tokens x_0 .. x_{p-j} and the masks
  m_1 .. m_j of that same chain (the entries at p − j + 1 .. p with base p − j), nothing else, and
  predicts x_{p+1}.

Every entry then computes exactly what the inference forward computes for it (a test checks this
against a real inference forward), so one forward over T + (K−1)·A entries (A answer positions)
trains all K offsets of every position. The attention mask is the only trick: :func:`pard_layout`
builds it.

**What is learned.** The network starts as the shipped distilled draft model. PARD fine-tunes the
whole draft; here the four layers receive a rank-r update on every projection (LoRA, Hu et al.
2021: W + s·B·A with B starting at zero, so training starts from the draft model itself) and the
mask token gets its embedding. The update is merged into the weights at load time and costs
nothing at inference; what is shipped is the mask and the factors, a few hundred kB.

**Conditional drop.** A layout with every depth at every position is T + (K−1)·A entries long.
PARD's conditional drop trains depth j on a random share 0.7^j of the positions, chosen so that
every kept entry still finds the shallower masks of its chain (:func:`conditional_drop`): about
T + 1.5·A entries for K = 4, which roughly halves a step here.

**Labels.** The corpus' answers are the target's own (greedy and sampled, distill.py), so the next
token of an answer is the target's choice there: the loss is the cross-entropy of that token (hard
labels, as PARD trains), over the 8,192-token draft vocabulary the proposer drafts from (tokens
outside it are never drafted and carry no loss). No teacher pass is needed: the committed token ids
(``data/distill_ids.npz``) are the whole corpus.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import decoder
from ..proposers.parallel_draft import PROJECTIONS, add_mask_token, merge_low_rank
from .distill import Corpus, iterate_batches, load_token_ids, split_by_group
from .loop import autocast, fit
from .recipes import PARALLEL_DRAFT

GREEDY_PASSES = ("greedy", "follow_greedy", "reuse_greedy", "follow2_greedy")  # answers at temperature 0


# ---- the corpus: token ids only ---------------------------------------------------------------

def token_corpus(path=None, max_len: int = PARALLEL_DRAFT.max_len) -> Corpus:
    """The committed answers (distill.DEFAULT_IDS_PATH) as a Corpus whose 'top-k' is the answer's own
    next token (K = 1, probability 1): hard labels, no teacher pass. Sequences longer than
    ``max_len`` tokens, and answers shorter than 2 tokens, are left out. ``meta["groups"]`` (the base
    prompt of each answer) and ``meta["passes_of"]`` (its generation pass) are kept for the split."""
    from .distill import DEFAULT_IDS_PATH

    saved = load_token_ids(DEFAULT_IDS_PATH if path is None else path)
    names = saved["meta"]["passes"]
    ids, start, t_ids, t_logp, groups, passes = [], [], [], [], [], []
    for (prompt, answer), group, pas in zip(saved["pairs"], saved["groups"], saved["passes"]):
        if answer.numel() < 2 or prompt.numel() + answer.numel() > max_len or prompt.numel() < 1:
            continue
        ids.append(torch.cat([prompt, answer]))
        start.append(int(prompt.numel()))
        t_ids.append(answer[:, None].clone())
        t_logp.append(torch.zeros(answer.numel(), 1))
        groups.append(group)
        passes.append(names[pas])
    return Corpus(ids, start, t_ids, t_logp, None, {"groups": groups, "passes_of": passes, "max_len": max_len})


def split_corpus(corpus: Corpus, holdout_fraction: float = 0.03) -> tuple:
    """(train, held-out), all answers to one base prompt on the same side (distill.split_by_group)."""
    train, hold = split_by_group(corpus.meta["groups"], holdout_fraction, seed=0)
    pick = lambda c, idx: Corpus([c.ids[i] for i in idx], [c.start[i] for i in idx],  # noqa: E731
                                 [c.topk_ids[i] for i in idx], [c.topk_logp[i] for i in idx], None,
                                 {"groups": [c.meta["groups"][i] for i in idx],
                                  "passes_of": [c.meta["passes_of"][i] for i in idx]})
    return pick(corpus, train), pick(corpus, hold)


# ---- the layout: every (position, offset) in one forward --------------------------------------

def conditional_drop(answer_positions: int, positions: int, keep, generator: torch.Generator | None) -> list:
    """PARD's conditional drop (COD): which prediction positions each mask depth trains on.

    Depth j (mask m_j) keeps a random share ``keep[j-1]`` of the positions, drawn among those whose
    depth-(j-1) entry was kept, shifted by one: an entry at depth j needs the masks m_1 .. m_{j-1}
    of its own chain, i.e. the entries one position earlier at depth j − 1 (and so on), so a kept
    entry always finds its chain. Returns, per depth j = 1 .. positions − 1, the kept indices into
    the answer positions 0 .. answer_positions − 1 (all of them when ``generator`` is None)."""
    kept, prev = [], list(range(answer_positions))
    for j in range(1, positions):
        cand = [i + 1 for i in prev if i + 1 < answer_positions]
        if generator is not None and cand:
            n = max(1, round(keep[j - 1] * answer_positions)) if j - 1 < len(keep) else len(cand)
            pick = torch.randperm(len(cand), generator=generator)[: min(n, len(cand))]
            cand = sorted(cand[i] for i in pick.tolist())
        kept.append(cand)
        prev = cand
    return kept


def pard_layout(seqs: list, starts: list, positions: int, mask_id: int, keep=(), generator=None):
    """One training forward for a batch: every real token, and the mask entries of every depth.

    seqs: list of LongTensor [T_b]; starts: index of each sequence's first answer token;
    positions: K (depths 0 .. K-1); mask_id: the mask token's id (the target's vocabulary size).
    keep, generator: PARD's conditional drop (:func:`conditional_drop`); no generator keeps all.
    Returns a dict of tensors, N entries per row (right-padded):
      ids [B, N] (padding 0), pos [B, N] (position ids), visible [B, 1, N, N] (bool: query sees key),
      and the loss entries: rows [E], cols [E], targets [E] (the token each predicts),
      offsets [E] (0 for a real token, j for the j-th mask).
    """
    if positions < 1:
        raise ValueError(f"positions must be >= 1, got {positions}")
    entries = []
    for s, st in zip(seqs, starts):
        t = int(s.numel())
        if not 1 <= st < t:
            raise ValueError(f"answer start {st} outside a sequence of {t} tokens")
        ids, pos, base, is_mask = list(s.tolist()), list(range(t)), list(range(t)), [False] * t
        # answer position a predicts x_{st+a} from the entry at st-1+a
        loss = [(st - 1 + a, int(s[st + a]), 0) for a in range(t - st)]
        for j, kept in enumerate(conditional_drop(t - st, positions, keep, generator), start=1):
            for a in kept:
                p = st - 1 + a
                loss.append((len(ids), int(s[p + 1]), j))
                ids.append(mask_id)
                pos.append(p)
                base.append(p - j)
                is_mask.append(True)
        entries.append((ids, pos, base, is_mask, loss))
    n = max(len(e[0]) for e in entries)
    b = len(entries)
    ids = torch.zeros(b, n, dtype=torch.long)
    pos = torch.zeros(b, n, dtype=torch.long)
    base = torch.full((b, n), -2, dtype=torch.long)
    mask = torch.zeros(b, n, dtype=torch.bool)
    valid = torch.zeros(b, n, dtype=torch.bool)
    rows, cols, targets, offsets = [], [], [], []
    for r, (i, p, bs, m, loss) in enumerate(entries):
        k = len(i)
        ids[r, :k], pos[r, :k], base[r, :k] = torch.tensor(i), torch.tensor(p), torch.tensor(bs)
        mask[r, :k], valid[r, :k] = torch.tensor(m), True
        for c, tgt, off in loss:
            rows.append(r)
            cols.append(c)
            targets.append(tgt)
            offsets.append(off)
    q_pos, k_pos = pos[:, :, None], pos[:, None, :]
    q_base, k_base = base[:, :, None], base[:, None, :]
    k_mask = mask[:, None, :]
    # a real token sees the real tokens up to its chain's base; a mask, the masks of its own chain up to itself
    sees = (~k_mask & (k_pos <= q_base)) | (k_mask & (k_base == q_base) & (k_pos <= q_pos))
    sees &= valid[:, :, None] & valid[:, None, :]
    sees |= torch.eye(n, dtype=torch.bool)[None]  # a padding entry sees itself: no empty softmax row
    return {"ids": ids, "pos": pos, "visible": sees[:, None], "rows": torch.tensor(rows),
            "cols": torch.tensor(cols), "targets": torch.tensor(targets), "offsets": torch.tensor(offsets)}


@torch.no_grad()
def layout_error(draft, seqs: list, starts: list, positions: int, keep=(), generator=None, visible=None) -> float:
    """How far ONE layout forward is from inference: the largest difference between an entry's final
    hidden state there and the same context fed as at inference (the real tokens up to the entry's
    base, then j masks), over every entry. About 1e-5 in fp32 when the layout is right.
    visible: an attention mask to use instead of the layout's own (to show that a wrong one is caught)."""
    mask_id = draft.get_input_embeddings().mask_id
    lay = pard_layout(seqs, starts, positions, mask_id, keep, generator)
    h = draft.model(input_ids=lay["ids"], attention_mask=lay["visible"] if visible is None else visible,
                    position_ids=lay["pos"]).last_hidden_state
    err = 0.0
    for r, c, tgt, j in zip(lay["rows"].tolist(), lay["cols"].tolist(), lay["targets"].tolist(),
                            lay["offsets"].tolist()):
        p = int(lay["pos"][r, c])
        if tgt != int(seqs[r][p + 1]):
            raise AssertionError(f"entry {c} of row {r} predicts {tgt}, not the token at {p + 1}")
        ids = seqs[r][: p - j + 1].tolist() + [mask_id] * j
        ref = draft.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
        err = max(err, float((ref - h[r, c]).abs().max()))
    return err


# ---- the low-rank update ---------------------------------------------------------------------

class LowRankLinear(torch.nn.Module):
    """``base(x) + scale · B(A(x))``: a frozen projection with a trainable rank-r update, B = 0 at start."""

    def __init__(self, base: torch.nn.Linear, rank: int, scale: float):
        super().__init__()
        self.base, self.scale = base, float(scale)
        self.A = torch.nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.B = torch.nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scale * F.linear(F.linear(x, self.A.to(x.dtype)), self.B.to(x.dtype))


def add_low_rank(draft, rank: int, scale: float) -> dict:
    """Wrap every projection of every layer (PROJECTIONS) in a LowRankLinear; returns name -> wrapper."""
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    wrapped = {}
    for i, layer in enumerate(draft.model.layers):
        for proj in PROJECTIONS:
            parent_name, attr = proj.split(".")
            parent = getattr(layer, parent_name)
            lin = getattr(parent, attr)
            w = LowRankLinear(lin, rank, scale)
            setattr(parent, attr, w)
            wrapped[f"model.layers.{i}.{proj}"] = w
    return wrapped


def remove_low_rank(draft, wrapped: dict) -> dict:
    """Put the plain projections back, merge the updates into them, return name -> (A, B)."""
    factors = {}
    for name, w in wrapped.items():
        layer_path, attr = name.rsplit(".", 1)
        setattr(draft.get_submodule(layer_path), attr, w.base)
        factors[name] = (w.A.detach().clone(), w.B.detach().clone())
    merge_low_rank(draft, {f"{n}.{x}": t for n, (a, b) in factors.items() for x, t in (("A", a), ("B", b))},
                   next(iter(wrapped.values())).scale)
    return factors


# ---- loss and evaluation ---------------------------------------------------------------------

def vocab_index(vocab_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[vocab_size] -> index in the draft vocabulary, or -1 for a token outside it."""
    index = torch.full((vocab_size,), -1, dtype=torch.long)
    index[vocab_ids.long()] = torch.arange(vocab_ids.numel())
    return index


def pard_forward(draft, corpus: Corpus, idx: list, positions: int, weight: torch.Tensor, index: torch.Tensor,
                 device="cpu", keep=(), generator=None):
    """(logits over the draft vocabulary [E', V'], targets' indices [E'], offsets [E']) for a batch,
    entries whose target lies outside the draft vocabulary dropped. ``weight`` [V', H]: the lm_head rows
    of the draft vocabulary; ``index`` [V]: vocab_index (V is also where the mask ids start)."""
    lay = pard_layout([corpus.ids[i] for i in idx], [corpus.start[i] for i in idx], positions, index.numel(),
                      keep, generator)
    keep = index[lay["targets"]] >= 0
    out = draft.model(input_ids=lay["ids"].to(device), attention_mask=lay["visible"].to(device),
                      position_ids=lay["pos"].to(device))
    h = out.last_hidden_state[lay["rows"][keep].to(device), lay["cols"][keep].to(device)]
    logits = F.linear(h, weight.to(h.dtype))
    return logits, index[lay["targets"][keep]].to(device), lay["offsets"][keep]


def pard_loss_fn(draft, corpus: Corpus, positions: int, weight: torch.Tensor, index: torch.Tensor, device="cpu",
                 keep=PARALLEL_DRAFT.keep, seed: int = 0):
    """Cross-entropy of the answer's next token at every depth, averaged over all (kept) entries."""
    generator = torch.Generator().manual_seed(seed) if keep else None

    def loss_fn(idx):
        logits, tgt, _ = pard_forward(draft, corpus, idx, positions, weight, index, device, keep, generator)
        return F.cross_entropy(logits.float(), tgt), float((logits.detach().argmax(-1) == tgt).float().mean())

    return loss_fn


@torch.no_grad()
def evaluate_offsets(draft, corpus: Corpus, positions: int, weight: torch.Tensor, index: torch.Tensor,
                     ranks: int = 8, batch_tokens: int = 2048, device="cpu", passes=GREEDY_PASSES) -> dict:
    """Held-out figures per offset j (position j + 1 of a draft), on the answers of ``passes``
    (greedy: the token greedy verification accepts): top-1 agreement, cross-entropy, and
    rank_accuracy[j][r] = share of entries whose token is the r-th candidate (trees are built from it)."""
    pick = [i for i, p in enumerate(corpus.meta["passes_of"]) if p in passes] or list(range(len(corpus)))
    sub = Corpus([corpus.ids[i] for i in pick], [corpus.start[i] for i in pick], [corpus.topk_ids[i] for i in pick],
                 [corpus.topk_logp[i] for i in pick], None, {})
    n = torch.zeros(positions)
    loss = torch.zeros(positions)
    hits = torch.zeros(positions, ranks)
    g = torch.Generator().manual_seed(0)
    for idx in iterate_batches(sub, batch_tokens, g):
        with autocast(device):
            logits, tgt, off = pard_forward(draft, sub, idx, positions, weight, index, device)
        logits = logits.float().cpu()
        ce = F.cross_entropy(logits, tgt.cpu(), reduction="none")
        rank = (logits > logits.gather(1, tgt.cpu()[:, None])).sum(1)
        for j in range(positions):
            m = off == j
            n[j] += m.sum()
            loss[j] += ce[m].sum()
            for r in range(ranks):
                hits[j, r] += (rank[m] == r).sum()
    n = n.clamp(min=1)
    acc = hits / n[:, None]
    return {"agreement": [round(float(a), 4) for a in acc[:, 0]], "loss": [round(float(x), 4) for x in loss / n],
            "rank_accuracy": [[round(float(a), 4) for a in row] for row in acc], "entries": [int(x) for x in n],
            "sequences": len(sub)}


def train_parallel_draft(target, corpus: Corpus, vocab_ids: torch.Tensor, *, holdout: Corpus | None = None,
                         positions: int = PARALLEL_DRAFT.positions, rank: int = PARALLEL_DRAFT.rank,
                         scale: float = PARALLEL_DRAFT.scale, steps: int = PARALLEL_DRAFT.steps,
                         lr: float = PARALLEL_DRAFT.lr, batch_tokens: int = PARALLEL_DRAFT.batch_tokens,
                         seed: int = PARALLEL_DRAFT.seed, keep=PARALLEL_DRAFT.keep, init=None):
    """Adapt the shipped draft model (or ``init``, a draft network) into a parallel drafter.

    Returns (draft with the update merged and its mask token, factors {name: (A, B)}, mask [H],
    TrainResult); with ``holdout``, ``result.heldout = {"before": ..., "after": ...}`` per depth.
    """
    import copy

    from ..proposers.draft_model import load_draft_model

    device = next(target.parameters()).device
    torch.manual_seed(seed)
    draft = copy.deepcopy(init) if init is not None else load_draft_model(target)
    draft.float().requires_grad_(False)
    masked = add_mask_token(draft, positions)
    masked.mask.data = masked.mask.data.float()
    wrapped = add_low_rank(draft, rank, scale)
    weight = target.get_output_embeddings().weight.detach().float()[vocab_ids.long()].contiguous()
    index = vocab_index(vocab_ids, masked.mask_id)
    params = [masked.mask] + [p for w in wrapped.values() for p in (w.A, w.B)]
    for p in params:
        p.requires_grad_(True)
    draft.train()
    evaluate = (lambda: evaluate_offsets(draft, holdout, positions, weight, index, device=device)) \
        if holdout is not None else (lambda: {})
    before = evaluate()
    result = fit(params, pard_loss_fn(draft, corpus, positions, weight, index, device, keep, seed), corpus, steps=steps,
                 lr=lr, batch_tokens=batch_tokens, seed=seed, desc="parallel drafter", device=device)
    draft.eval()
    after = evaluate()
    factors = remove_low_rank(draft, wrapped)
    draft.requires_grad_(False)
    if holdout is not None:
        result.heldout = {"before": before, "after": after}
    return draft, factors, masked.mask.detach().clone(), result


__all__ = ["GREEDY_PASSES", "token_corpus", "split_corpus", "conditional_drop", "pard_layout", "layout_error", "LowRankLinear", "add_low_rank",
           "remove_low_rank", "vocab_index", "pard_forward", "pard_loss_fn", "evaluate_offsets",
           "train_parallel_draft"]
