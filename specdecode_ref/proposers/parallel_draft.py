"""Parallel drafting (PARD): a small draft model proposes all K tokens in ONE forward.

A sequential draft model (draft_model.py) pays one draft forward per drafted token: K tokens cost
about K·c, where c is one forward of the draft. Once the target's verification of K + 1 tokens
costs about as much as one decode step, that c·K is what a speculative step spends beyond plain
decoding. PARD (An et al., 2025, "PARD: Accelerating LLM Inference with Low-Cost PARallel Draft
Model Adaptation", AMD-AIG-AIMA/PARD) removes it: after the committed tokens it appends K − 1
*mask* tokens and reads K predictions from one forward, drafting cost c·1.

**Inference.** Committed tokens x_0 .. x_{N-1}. Feed the ones the draft's cache has not seen,
then K − 1 copies of one mask token (m_1 .. m_{K-1} below) at positions N .. N+K-2, under the
ordinary causal mask:

    position    N-1      N     N+1  ...  N+K-2
    input      x_{N-1}  m_1    m_2  ...  m_{K-1}
    predicts    x_N    x_{N+1} x_{N+2}   x_{N+K-1}

The output at the last real token is the usual next-token prediction; mask m_j predicts the token
j places further on. The masks' keys and values are then dropped from the cache (they describe no
committed token), so the cache always holds exactly the committed tokens fed so far and needs no
rollback after verification: the accepted drafts and the bonus token are simply the next step's
new inputs.

**What it gives up.** Mask m_j predicts x_{N+j} without seeing the drafts before it: position j
conditions on the context and on j − 1 placeholders, not on the tokens it will follow. A
sequential draft conditions on its own earlier drafts. So a parallel draft's acceptance falls
faster with depth; it wins when the forwards it saves are worth more than the acceptance it
loses (notebook 13 measures both). Each position's distribution depends only on the context, so
rejection sampling is lossless with q_j as drawn (drafting.choose_tokens, as for Medusa's heads),
and the per-position top-k candidates form a Medusa-style tree (trees.tree_from_choices).

**The course's parallel drafter** starts from the shipped 4-layer draft model and learns (training
/parallel_draft.py): one mask embedding (id V, one past the target's vocabulary, read by
:class:`MaskedEmbedding`; PARD gives a reserved token of its tokenizer this role) and a rank-r update of every projection of the four layers, merged into the weights at load time. Only
the mask and the low-rank factors are shipped (a few hundred kB), which keeps the course's weights
within their budget; the layers themselves are the draft model's.

Counterparts: PARD's training and vLLM's parallel drafting for draft models
(``vllm/v1/spec_decode``); block-diffusion drafters (DFlash) extend the idea by conditioning the
masked block on the target's features and denoising it (notebook 13).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .. import decoder, kv, trees
from .base import Draft, Proposer, DecodeState, StepOutcome, resolve_draft_sampling, with_sizing
from .draft_model import BatchedDraftModelProposer, check_same_vocabulary, fit_logits, load_draft_model, vocab_size_of
from .drafting import choose_tokens
from .shipped import decoded_metadata, WEIGHTS_DIR, load_weights, require_embedded, require_file, save_weights, weights_metadata
from .vocab import VocabHead

PARD_WEIGHTS = WEIGHTS_DIR / "smollm2-135m-pard.safetensors"
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


class MaskedEmbedding(torch.nn.Module):
    """The target's token embeddings (shared, frozen) and one learned mask embedding at id V.

    Ids 0..V-1 read the shared table; id V (one past the target's vocabulary) is the mask token, as
    PARD appends one mask token K − 1 times. ``weight`` is the shared table, so the draft still
    reports the target's vocabulary size (the mask is never a token the target can emit).
    ``positions``: how many positions one forward drafts (the trained K: K − 1 masks).
    """

    def __init__(self, table: torch.nn.Embedding, positions: int):
        super().__init__()
        if positions < 2:
            raise ValueError(f"a parallel drafter drafts at least 2 positions per forward, got {positions}")
        self.table = table
        self.positions = int(positions)
        w = table.weight
        self.mask = torch.nn.Parameter(w.detach().float().mean(0).to(w.dtype))

    @property
    def weight(self) -> torch.Tensor:
        return self.table.weight

    @property
    def mask_id(self) -> int:
        return int(self.table.weight.shape[0])

    def mask_ids(self, n: int) -> list:
        """n mask tokens (n <= positions - 1: the drafter was trained with that many)."""
        if not 0 <= n < self.positions:
            raise ValueError(f"this drafter was trained with {self.positions - 1} mask tokens, asked for {n}")
        return [self.mask_id] * n

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        v = self.mask_id
        out = self.table(ids.clamp(max=v - 1))
        is_mask = ids == v
        if bool(is_mask.any()):
            out = torch.where(is_mask[..., None], self.mask.to(out.dtype), out)
        return out


def masked_embedding(model) -> MaskedEmbedding:
    emb = model.get_input_embeddings()
    if not isinstance(emb, MaskedEmbedding):
        raise ValueError("this model has no mask tokens: build it with add_mask_tokens() or load_parallel_draft()")
    return emb


def add_mask_token(draft, positions: int) -> MaskedEmbedding:
    """Give ``draft`` (a draft_model.build_draft_model network) a mask token, to draft ``positions`` per forward."""
    emb = draft.get_input_embeddings()
    table = emb.table if isinstance(emb, MaskedEmbedding) else emb
    masked = MaskedEmbedding(table, positions)
    draft.model.embed_tokens = masked
    return masked


# ---- the shipped form: masks + low-rank factors on top of the draft model ----------------------

def low_rank_state(factors: dict, mask: torch.Tensor) -> dict:
    """What is shipped: the ``mask`` embedding [H] and, per projection name, ``name.A`` [r, in] and ``name.B`` [out, r]."""
    state = {"mask": mask.detach()}
    for name, (a, b) in factors.items():
        state[f"{name}.A"], state[f"{name}.B"] = a.detach(), b.detach()
    return state


def save_parallel_draft(factors: dict, mask: torch.Tensor, positions: int, scale: float, path=PARD_WEIGHTS,
                        meta: dict | None = None) -> Path:
    """Write the mask embedding and the low-rank factors (bf16) with ``meta`` (lists stored as JSON)."""
    meta = {k: (json.dumps(v) if isinstance(v, (list, dict, tuple)) else v) for k, v in (meta or {}).items()}
    meta.update(positions=int(positions), scale=float(scale))
    return save_weights(low_rank_state(factors, mask), path, meta)


def pard_metadata(path=PARD_WEIGHTS) -> dict:
    """The weights' metadata with JSON values decoded (rank_accuracy, agreement per offset, ...)."""
    return decoded_metadata(path)


def merge_low_rank(draft, state: dict, scale: float) -> None:
    """Add ``scale · B @ A`` to every projection named in ``state`` (in place, fp32 arithmetic)."""
    names = sorted({k[:-2] for k in state if k.endswith((".A", ".B"))})
    modules = dict(draft.named_modules())
    for name in names:
        if name not in modules:
            raise RuntimeError(f"the low-rank factors name {name}, which this draft does not have")
        w = modules[name].weight
        delta = scale * (state[f"{name}.B"].float() @ state[f"{name}.A"].float())
        if delta.shape != w.shape:
            raise RuntimeError(f"{name}: a {tuple(delta.shape)} update for a {tuple(w.shape)} weight")
        with torch.no_grad():
            w.copy_((w.float() + delta.to(w.device)).to(w.dtype))


def load_parallel_draft(target, path=PARD_WEIGHTS):
    """The shipped parallel drafter: the shipped draft model with its low-rank update merged in and its
    mask tokens, on the target's device and dtype, frozen."""
    require_embedded(target, "parallel drafter")
    path = require_file(path, "parallel-draft")
    meta = pard_metadata(path)
    draft = load_draft_model(target)  # a fresh copy: merging never touches another proposer's draft
    state = load_weights(path)
    merge_low_rank(draft, state, float(meta["scale"]))
    masked = add_mask_token(draft, int(meta["positions"]))
    param = next(target.parameters())
    with torch.no_grad():
        masked.mask.copy_(state["mask"].to(param.dtype))
    draft.to(param.device).eval()
    draft.requires_grad_(False)
    return draft


# ---- the proposer -----------------------------------------------------------------------------

class ParallelDraftProposer(Proposer):
    """Drafts a chain of up to ``k`` tokens, or a tree, from ONE forward of a draft model with mask tokens.

    draft_model: a causal LM whose input embeddings are a :class:`MaskedEmbedding` (load_parallel_draft).
    Chain mode (``choices=None``): position j's top token (or, when sampling, a draw from its q_j),
    j = 0 .. min(k, trained positions) - 1. Tree mode: ``choices`` (rank paths, medusa.derive_choices
    from the per-position rank accuracies in the weights' metadata); node i is the ``rank``-th
    candidate of position ``depth - 1``; k is the node budget. draft_vocab: a reduced vocabulary
    (vocab.py) for the projection. draft_sampling (base.DRAFT_SAMPLING): a chain "sample"s q_j by
    default; a tree is deterministic ("greedy", one-hot verification).
    """

    name = "pard"

    def __init__(self, draft_model, k: int | None = None, draft_vocab: torch.Tensor | None = None, choices=None,
                 draft_sampling: str | None = None):
        self.draft_sampling = resolve_draft_sampling(draft_sampling, "sample" if choices is None else "greedy",
                                                     choices is None, "a parallel-draft tree")
        self.model = draft_model
        self.max_positions = masked_embedding(draft_model).positions
        self.tree = None
        if choices is not None:
            self.tree = trees.tree_from_choices(choices)
            depth = max(len(c) for c in self.tree.choices)
            if depth > self.max_positions:
                raise ValueError(f"choices reach depth {depth} but one forward drafts {self.max_positions} "
                                 f"positions ({self.max_positions - 1} mask tokens)")
            n = len(self.tree.choices)
            k = n if k is None else k
            if isinstance(k, int) and not isinstance(k, bool) and 1 <= k < n:
                raise ValueError(f"the tree has {n} nodes, more than k={k}; derive a smaller one with "
                                 f"medusa.derive_choices(rank_accuracy, budget={k})")
            self._depths = trees.tree_depths(self.tree.parents)
            self._max_rank = int(self.tree.ranks.max()) + 1
            self._tree_depth = depth
        super().__init__(self.max_positions if k is None else k)
        if self.tree is None and self.k > self.max_positions:
            raise ValueError(f"k={self.k}: this drafter was trained with {self.max_positions - 1} mask tokens, so "
                             f"one forward drafts at most {self.max_positions} tokens")
        self.head = None if draft_vocab is None else VocabHead(draft_model.get_output_embeddings().weight, draft_vocab)
        if self.tree is not None and self.head is not None and self._max_rank > self.head.size:
            raise ValueError(f"choices use rank {self._max_rank - 1} but the draft vocabulary has only "
                             f"{self.head.size} tokens")
        self.shared_tokens = None  # the batched drafter's fit_logits reads these two
        self.target_size = vocab_size_of(draft_model)
        self.cache = None

    def check_compatible(self, target) -> None:
        check_same_vocabulary(target, self.model, "parallel drafter")
        self.target_size = vocab_size_of(target)
        dt, dd = next(target.parameters()).device, next(self.model.parameters()).device
        if dt != dd:
            raise ValueError(f"the parallel drafter is on {dd} but the target is on {dt}; move them to one device")

    @property
    def _device(self):
        return next(self.model.parameters()).device

    def positions(self) -> int:
        """How many positions the next forward drafts: the chain's length or the tree's depth."""
        return self._tree_depth if self.tree is not None else min(self.k, self.max_positions)

    def begin(self, state: DecodeState) -> None:
        self.cache = kv.new_cache(self.model)

    def position_logits(self, pending: list, n: int) -> torch.Tensor:
        """Feed ``pending`` (committed ids the cache lacks) and n − 1 masks in one forward; the logits
        [n, V'] of positions 0 .. n-1 (V': the draft vocabulary). The masks leave the cache again."""
        ids = pending + masked_embedding(self.model).mask_ids(n - 1)
        x = torch.tensor([ids], dtype=torch.long, device=self._device)
        if self.head is None:
            out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True, logits_to_keep=n)
            self.cache, logits = out.past_key_values, fit_logits(out.logits[0], self.target_size, None)
        else:
            h, self.cache = decoder.last_hidden(self.model, x, cache=self.cache)
            logits = self.head.logits(h[0, -n:])
        kv.crop_to(self.cache, kv.cache_len(self.cache) - (n - 1))
        return logits

    def draft_from_logits(self, logits: torch.Tensor, state: DecodeState) -> Draft:
        """A chain (choose_tokens: each position independently) or the tree's nodes from [n, V'] logits."""
        if self.tree is None:  # q_j over the full vocabulary when sampling (the draft's vocabulary is the target's)
            return choose_tokens(logits, state, self._device, self.head, self.draft_sampling)
        index = logits.topk(self._max_rank, dim=-1).indices  # [depth, R]
        top = index if self.head is None else self.head.to_token(index)
        return Draft(top[self._depths - 1, self.tree.ranks].long().to(self._device), None, self.tree.parents.clone())

    def propose(self, state: DecodeState) -> Draft:
        if self.cache is None:
            raise RuntimeError("propose() before begin(): the engine calls begin() once per request")
        pending = state.token_list[kv.cache_len(self.cache):]
        return self.draft_from_logits(self.position_logits(pending, self.positions()), state)

    def on_verified(self, state: DecodeState, outcome: StepOutcome) -> None:
        """Nothing to roll back: the cache holds committed tokens only (the masks left it in propose)."""

    def batch_proposer(self):
        """All rows draft in one forward per step (BatchedParallelDraftProposer)."""
        return BatchedParallelDraftProposer(self)

    def __repr__(self) -> str:
        mode = "chain" if self.tree is None else f"tree of {len(self.tree.choices)} nodes"
        vocab = "" if self.head is None else f", draft_vocab={self.head.size}"
        return with_sizing(self, (f"ParallelDraftProposer(k={self.k}, {mode}, masks={self.max_positions - 1}, "
                f"layers={self.model.config.num_hidden_layers}{vocab})"))


class BatchedParallelDraftProposer(BatchedDraftModelProposer):
    """A ParallelDraftProposer for many rows: each step, one forward feeds every row's pending tokens
    and the mask tokens, then the masks are rolled back out of every row's cache. Rows joining a
    running batch are prefilled as for the draft model (BatchedDraftModelProposer.add_rows)."""

    def propose(self, states: list) -> list:
        if self.cache is None:
            raise RuntimeError("propose() before begin(): the engine calls begin() once per batch")
        p = self.proposer
        n = p.positions()
        masks = masked_embedding(p.model).mask_ids(n - 1)
        rows = [s.token_list[length:] + masks for s, length in zip(states, self.cache.lengths)]
        if p.head is None:
            out = self.cache.forward(rows, logits_to_keep=n)
            logits = fit_logits(out.logits, p.target_size, None)  # [B, n, V]
        else:
            out = self.cache.forward(rows, module=p.model.model)
            logits = p.head.logits(out.last_hidden_state[:, -n:])  # [B, n, V']
        self.cache.rollback([length - (n - 1) for length in self.cache.lengths])
        return [p.draft_from_logits(logits[b], s) for b, s in enumerate(states)]

    def on_verified(self, states: list, outcomes: list) -> None:
        # The caches hold committed tokens only: the accepted drafts and the bonus are next step's inputs.
        self.cache.maybe_compact()


def load_pard_proposer(target, k: int = 4, tree: bool = False, reduced_vocab: bool = True, path=PARD_WEIGHTS,
                       choices=None, **kwargs) -> ParallelDraftProposer:
    """The shipped parallel drafter as a proposer (registry builder: ``builder(target, k, **kwargs)``).

    tree=False: a chain of k tokens (at most the trained positions). tree=True: a tree of ``k``
    nodes derived (medusa.derive_choices) from the held-out per-position rank accuracies in the
    weights' metadata, or ``choices``. reduced_vocab: draft among the shipped 8,192-token vocabulary.
    """
    from .medusa import derive_choices
    from .shipped import shipped_vocab

    draft = load_parallel_draft(target, path)
    if tree and choices is None:
        acc = pard_metadata(path).get("rank_accuracy")
        if acc is None:
            raise ValueError(f"{Path(path).name} has no rank_accuracy metadata to derive a tree from; pass choices")
        choices = derive_choices(acc, k)
    return ParallelDraftProposer(draft, k=k, draft_vocab=shipped_vocab(reduced_vocab),
                                 choices=choices if tree else None, **kwargs)


__all__ = ["PARD_WEIGHTS", "PROJECTIONS", "MaskedEmbedding", "add_mask_token", "masked_embedding", "save_parallel_draft",
           "pard_metadata", "merge_low_rank", "load_parallel_draft", "ParallelDraftProposer",
           "BatchedParallelDraftProposer", "load_pard_proposer"]
