"""Medusa-1: extra decoding heads on the frozen target's last hidden state (Cai et al., 2024).

The target already predicts the next token from its last (normed) hidden state. Medusa adds a few
small *heads* that read the same hidden state and guess the tokens after that: head 0 two places
ahead, head 1 three places ahead, and so on. They cost almost nothing to run (no extra layers over
the sequence, no cache), and their guesses become a chain or a candidate *tree* that the target
verifies in one forward (trees.py). Medusa-1 keeps the target frozen and trains only the heads
(``python -m specdecode_ref.training medusa``), on the target's own answers: cheap, because the
feature is stored in the distillation corpus (distill.py) and no target forward is needed.

**A head.** As in FasterDecoding/Medusa (``medusa/model/medusa_model.py``): a stack of
``ResBlock``s, ``x + SiLU(Linear(x))`` (the linear initialised to zero weight, so an untrained
head starts as the identity), then a vocabulary projection. Here the projection is the TARGET's
lm_head, shared and frozen, optionally restricted to the reduced draft vocabulary
(vocab.VocabHead). Medusa gives each head its own 576 x 49,152 projection; for SmolLM2 that
would be 56 MB of bf16 weights *per head*, over the course's 60 MB budget for all shipped weights,
and one more ~2.7 ms projection per head per step on this CPU. Sharing it, all heads go through
one projection call ([num_heads, H] @ W^T, memory-bound, so about the cost of one row), and only
the ResBlocks (576 x 577 numbers each, ~0.66 MB bf16) are shipped.

**Indexing (what each head predicts, and from where).** Number the committed tokens 0..N-1. After
a verification step the sequence ends with the target's own token b (bonus or correction) at
position N-1. The target produced b from its hidden state at position N-2: the last *scored and
accepted* position, i.e. ``StepOutcome.hidden_states[-1][-1]`` (the engine hands over the root and
the accepted path; the last layer is the normed state). Read at position t, the target predicts
t+1 and Medusa head i (0-based) predicts t+2+i; at t = N-2 the target's guess is b (already
committed) and head i guesses position N+i, i.e. the tokens right after b. So the next draft is
the chain ``[head 0, head 1, ...]`` at positions N, N+1, ..., or a tree of the heads' top-k
candidates (depth d uses head d-1). After the prefill the same holds with
``DecodeState.prompt_hidden_states[-1][-1]``: it sits at position P-1, produced the first new token
(already sampled by the engine, N = P+1), and head i predicts position P+1+i = N+i.

Note what the heads do *not* see: the bonus token b itself (Medusa-1 heads read one feature; the
tokens at N+i are guessed without knowing b). That is why their accuracy drops quickly with i, and
what EAGLE fixes by feeding the drafted tokens back (notebook 08).

**Trees.** ``choices`` (Medusa's ``medusa_choices``) lists paths of top-k ranks, e.g. ``(0, 1)`` =
head 0's best candidate, then head 1's second best. Medusa ships hand-tuned lists; here
:func:`derive_choices` builds one from *measured* per-head rank accuracies (stored in the weights'
metadata), greedily adding the node with the highest estimated probability of being accepted.

**Sampling.** Proposals are deterministic (top-k), so ``Draft.probs`` is None: the engine's
lossless verification treats each candidate as one-hot (accept with probability r(x), remove x
from the residual), which keeps the target's distribution exactly. ``generate(...,
tree_acceptance="typical")`` gives Medusa's own *typical acceptance* instead (verify.typical_accept):
it accepts more, but it is LOSSY -- the output no longer follows the target's distribution.

**Hydra: sequentially dependent heads** (Ankner et al., 2024, "Hydra: Sequentially-Dependent Draft
Heads for Medusa Decoding"; zankner/Hydra, ``hydra/model/hydra_heads/``). Option
``hydra=True`` of the same family. A Medusa head guesses position N+i from the feature alone;
a Hydra head also reads the tokens *before* the one it guesses: the bonus token b (position N-1)
and the tokens the earlier heads drafted on its path (positions N..N+i-1). Head i's input is the
concatenation ``[feature, E(b), E(d_0), ..., E(d_{i-1})]`` ((i+2)·H numbers, E = the target's input
embeddings, shared and frozen), and an MLP turns it into the feature the lm_head reads. So a
tree node's children depend on the path to it: drafting evaluates head d once per node at depth d
(batched over the nodes of that depth), and a chain is the one-path case. Read :class:`HydraHeads`
for the head itself and how it departs from the paper's, to fit the course's weight budget.
Trees are still chosen by :func:`derive_choices`: a Hydra head's rank accuracies are measured with
the true tokens on its path, i.e. *given that the path so far is right* -- exactly the factor the
derivation multiplies along a path (and no longer an independence assumption).

Counterparts: FasterDecoding/Medusa (``medusa_model.py``: ResBlock, heads; ``utils.py``:
``generate_medusa_buffers``, ``evaluate_posterior`` for typical acceptance); vLLM
``vllm/model_executor/models/medusa.py`` and ``vllm/v1/spec_decode/medusa.py``.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .. import trees
from .base import DecodeState, Draft, Proposer, StepOutcome, resolve_draft_sampling, with_sizing
from .drafting import choose_tokens
from .shipped import (WEIGHTS_DIR, decoded_metadata, load_weights, require_embedded, require_file, require_same_target, save_weights,
                      shipped_vocab, weights_metadata)
from .vocab import VocabHead

MEDUSA_WEIGHTS = WEIGHTS_DIR / "smollm2-135m-medusa.safetensors"
HYDRA_WEIGHTS = WEIGHTS_DIR / "smollm2-135m-hydra.safetensors"  # written by `training medusa --hydra`
DEFAULT_TREE_NODES = 8  # the default node budget of a derived tree (load_medusa_proposer)


class ResBlock(torch.nn.Module):
    """``x + SiLU(Linear(x))``, the linear zero-initialised (weight) as in Medusa: identity at start."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, hidden_size)
        torch.nn.init.zeros_(self.linear.weight)

    def forward(self, x):
        return x + torch.nn.functional.silu(self.linear(x))


class MedusaHeads(torch.nn.Module):
    """``num_heads`` heads, each a stack of ``num_layers`` ResBlocks. forward: [..., H] -> [..., num_heads, H]
    (the features the shared lm_head turns into logits; head i predicts i+2 places ahead)."""

    def __init__(self, hidden_size: int, num_heads: int = 3, num_layers: int = 1):
        super().__init__()
        if num_heads < 1 or num_layers < 1:
            raise ValueError(f"num_heads and num_layers must be >= 1, got {num_heads}, {num_layers}")
        self.hidden_size, self.num_heads, self.num_layers = int(hidden_size), int(num_heads), int(num_layers)
        self.heads = torch.nn.ModuleList(
            torch.nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)]) for _ in range(num_heads))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.stack([head(h) for head in self.heads], dim=-2)


class HydraHead(torch.nn.Module):
    """One Hydra head: ``h + Out(SiLU(In([h; E(x_1); ...; E(x_n)])))``, then ``num_layers - 1`` ResBlocks.

    h: the target's feature [..., H]; the x's: the n = index + 1 tokens before the predicted one.
    zankner/Hydra's first (MLP-head) block is ``R(x) + SiLU(L(x))`` with two full (n+1)·H x H linears on the
    concatenation x. Here the residual is the feature h itself and the concatenation passes through a
    ``width``-wide bottleneck: for SmolLM2 (H = 576) three heads then weigh ~3.5 MB in bf16 instead
    of ~12 MB. ``Out`` starts at zero, so an untrained head starts as the identity on h (as a
    Medusa ResBlock does).
    """

    def __init__(self, hidden_size: int, index: int, num_layers: int = 1, width: int = 256):
        super().__init__()
        self.num_inputs = index + 1
        self.mix = torch.nn.Linear((self.num_inputs + 1) * hidden_size, width)
        self.out = torch.nn.Linear(width, hidden_size)
        torch.nn.init.zeros_(self.out.weight)
        torch.nn.init.zeros_(self.out.bias)
        self.blocks = torch.nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers - 1)])

    def forward(self, h: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """h [..., H], prev [..., num_inputs, H] (embeddings, oldest first) -> [..., H]."""
        if prev.shape[-2] != self.num_inputs:
            raise ValueError(f"this head reads the {self.num_inputs} tokens before the one it predicts, "
                             f"got {prev.shape[-2]}")
        x = torch.cat([h, prev.flatten(-2)], dim=-1)
        return self.blocks(h + self.out(torch.nn.functional.silu(self.mix(x))))


class HydraHeads(torch.nn.Module):
    """``num_heads`` Hydra heads (see :class:`HydraHead`); head i predicts i+2 places after the
    feature's position, reading the feature and the embeddings of the i+1 tokens in between.

    forward (teacher forcing): h [..., H] and prev [..., num_heads, H], the embeddings of the tokens
    right after the feature's position -> [..., num_heads, H]; head i reads prev[..., :i+1, :].
    :meth:`head` runs one head, as drafting does (head i needs head i-1's token first).
    """

    def __init__(self, hidden_size: int, num_heads: int = 3, num_layers: int = 1, width: int = 256):
        super().__init__()
        if num_heads < 1 or num_layers < 1 or width < 1:
            raise ValueError(f"num_heads, num_layers and width must be >= 1, got {num_heads}, {num_layers}, {width}")
        self.hidden_size, self.num_heads, self.num_layers = int(hidden_size), int(num_heads), int(num_layers)
        self.width = int(width)
        self.heads = torch.nn.ModuleList(HydraHead(hidden_size, i, num_layers, width) for i in range(num_heads))

    def head(self, i: int, h: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """Head i on features h [..., H] and prev [..., i+1, H] -> [..., H]."""
        return self.heads[i](h, prev)

    def forward(self, h: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        if prev.shape[-2] < self.num_heads:
            raise ValueError(f"prev must hold the embeddings of {self.num_heads} tokens, got {prev.shape[-2]}")
        return torch.stack([head(h, prev[..., : i + 1, :]) for i, head in enumerate(self.heads)], dim=-2)


def project(target, features: torch.Tensor) -> torch.Tensor:
    """Logits through the target's lm_head, frozen (detached: training never updates the target)."""
    head = target.get_output_embeddings()
    bias = None if getattr(head, "bias", None) is None else head.bias.detach()
    return torch.nn.functional.linear(features, head.weight.detach(), bias)


# ---- choosing the tree ------------------------------------------------------------------------

def derive_choices(head_rank_accuracy, budget: int, max_depth: int | None = None) -> list:
    """A Medusa tree (``medusa_choices``-style list of rank paths) of ``budget`` nodes, built from
    measured accuracies.

    head_rank_accuracy: [num_heads][R]; entry [i][r] = P(the correct token is head i's rank-r
    candidate), measured on held-out data (stored as ``rank_accuracy`` in the weights' metadata;
    its cumulative sum over r is the top-k accuracy). A node's path (r_1, ..., r_d) is accepted
    only if every candidate on it is right, estimated as the product prod_j acc[j-1][r_j] (Medusa's
    independence assumption). The expected number of accepted tokens of a tree is the sum of its
    nodes' path probabilities, and a child never scores above its parent, so adding, one at a
    time, the not-yet-chosen child (of the root or of a chosen node) with the highest estimate
    maximises it greedily. Returns the choices in the order they were added (ties: lower ranks,
    then shallower, first).
    """
    acc = [[float(a) for a in row] for row in head_rank_accuracy]
    if not acc or any(not row for row in acc):
        raise ValueError("head_rank_accuracy must be a non-empty [num_heads][R] table")
    if any(a < 0 or a > 1 for row in acc for a in row):
        raise ValueError("accuracies must lie in [0, 1]")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise ValueError(f"budget must be an int >= 1, got {budget!r}")
    depth_limit = len(acc) if max_depth is None else min(len(acc), int(max_depth))
    chosen: list = []
    frontier = {(r,): acc[0][r] for r in range(len(acc[0]))}  # candidate path -> estimated probability
    while frontier and len(chosen) < budget:
        path = max(frontier, key=lambda c: (frontier[c], [-x for x in c], -len(c)))
        value = frontier.pop(path)
        chosen.append(path)
        if len(path) < depth_limit:
            row = acc[len(path)]
            for r in range(len(row)):
                frontier[path + (r,)] = value * row[r]
    return chosen


def expected_accepted(head_rank_accuracy, choices) -> float:
    """Estimated accepted drafts per step of a tree (sum of its nodes' path probabilities; the bonus
    token not counted), under the same independence assumption as :func:`derive_choices`."""
    total = 0.0
    for c in choices:
        p = 1.0
        for d, r in enumerate(c):
            p *= float(head_rank_accuracy[d][r])
        total += p
    return total


# ---- weights ----------------------------------------------------------------------------------

def save_medusa_heads(heads, path=MEDUSA_WEIGHTS, meta: dict | None = None, target=None) -> Path:
    """Write the heads (MedusaHeads or HydraHeads, bf16) with their shape and kind (``hydra``), and
    ``meta`` (e.g. ``rank_accuracy``, ``top1``, ``top5`` per head, ``choices``: lists are stored as
    JSON) in the safetensors metadata. With ``target`` also the shape of the target they were
    trained for (checked on load)."""
    meta = {k: (json.dumps(v) if isinstance(v, (list, dict, tuple)) else v) for k, v in (meta or {}).items()}
    meta.update(num_heads=heads.num_heads, num_layers=heads.num_layers, hidden_size=heads.hidden_size)
    hydra = isinstance(heads, HydraHeads)
    meta["hydra"] = json.dumps(hydra)
    meta.pop("hydra_width", None)
    if hydra:
        meta["hydra_width"] = heads.width
    if target is not None:
        meta.update(target_vocab_size=target.config.vocab_size, target_layers=target.config.num_hidden_layers)
    return save_weights(heads.state_dict(), path, meta)


def medusa_metadata(path=MEDUSA_WEIGHTS) -> dict:
    """The weights' metadata with JSON values decoded (rank_accuracy, top1, top5, choices, ...)."""
    return decoded_metadata(path)


def load_medusa_heads(target, path=MEDUSA_WEIGHTS):
    """Heads from ``path`` (default: the shipped Medusa heads, trained for the embedded SmolLM2-135M)
    on the target's device and dtype, frozen: HydraHeads if the file's metadata says ``hydra``,
    else MedusaHeads."""
    path = Path(path)
    if path.resolve() in (MEDUSA_WEIGHTS.resolve(), HYDRA_WEIGHTS.resolve()):
        require_embedded(target, "Medusa heads")
    require_file(path, "medusa --hydra" if path.resolve() == HYDRA_WEIGHTS.resolve() else "medusa")
    meta = medusa_metadata(path)
    hidden = int(meta["hidden_size"])
    if hidden != target.config.hidden_size or \
            int(meta.get("target_vocab_size", target.config.vocab_size)) != target.config.vocab_size:
        raise ValueError(f"{path.name} holds Medusa heads for a target with hidden size {hidden} and vocabulary "
                         f"{meta.get('target_vocab_size', '?')}; this target has {target.config.hidden_size} and "
                         f"{target.config.vocab_size}: heads read one model's features, train them for yours")
    if meta.get("hydra", False) is True:
        heads = HydraHeads(hidden, int(meta["num_heads"]), int(meta["num_layers"]), int(meta["hydra_width"]))
    else:
        heads = MedusaHeads(hidden, int(meta["num_heads"]), int(meta["num_layers"]))
    param = next(target.parameters())
    heads.load_state_dict(load_weights(path))
    return heads.to(param.device, param.dtype).eval().requires_grad_(False)


# ---- the proposer -----------------------------------------------------------------------------

class MedusaProposer(Proposer):
    """Drafts with Medusa heads on the target's last hidden state (see the module docstring).

    Chain mode (``choices=None``): the top-1 token of heads 0..k-1 (at most ``num_heads`` tokens).
    Tree mode: ``choices`` (rank paths, e.g. from :func:`derive_choices`) give the tree; node i is
    the ``rank``-th candidate of head ``depth - 1``; k is the node budget (default len(choices)).
    draft_vocab: optional reduced vocabulary (token ids) for the shared projection.
    Deterministic: ``Draft.probs`` is None (lossless one-hot verification; "typical" is lossy).
    draft_sampling (base.DRAFT_SAMPLING): a chain may instead "sample" each head's q; a tree is "greedy".
    """

    name = "medusa"
    needs_hidden_states = True  # the feature: the target's last normed hidden state

    def __init__(self, target, heads: MedusaHeads, k: int | None = None, choices=None, draft_vocab=None,
                 draft_sampling: str | None = None):
        self.draft_sampling = resolve_draft_sampling(draft_sampling, "greedy", choices is None, "a Medusa tree")
        self.target = target
        self.heads = heads
        self.num_heads = heads.num_heads
        self.tree = None
        if choices is not None:
            self.tree = trees.tree_from_choices(choices)
            if not len(self.tree.choices):
                raise ValueError("choices is empty: pass None for chain mode")
            depth = max(len(c) for c in self.tree.choices)
            if depth > self.num_heads:
                raise ValueError(f"choices reach depth {depth} but there are only {self.num_heads} Medusa heads "
                                 "(depth d uses head d-1)")
            n = len(self.tree.choices)
            k = n if k is None else k
            if isinstance(k, int) and not isinstance(k, bool) and 1 <= k < n:
                raise ValueError(f"the tree has {n} nodes, more than k={k}; derive a smaller one with "
                                 f"derive_choices(accuracy, budget={k})")
            self._max_rank = int(self.tree.ranks.max()) + 1
            self._depths = trees.tree_depths(self.tree.parents)
        super().__init__(self.num_heads if k is None else k)
        self.head = VocabHead(target.get_output_embeddings().weight, draft_vocab)
        if self.tree is not None and self._max_rank > self.head.size:
            raise ValueError(f"choices use rank {self._max_rank - 1} but the draft vocabulary has only "
                             f"{self.head.size} tokens")
        self._feature = None

    def check_compatible(self, target) -> None:
        require_same_target(self.target, target, "a MedusaProposer reads the hidden states of the target it was "
                            "built for (and shares its lm_head); pass that same model to generate()")

    @property
    def _device(self):
        return next(self.target.parameters()).device

    def begin(self, state: DecodeState) -> None:
        if state.prompt_hidden_states is None:
            raise RuntimeError("MedusaProposer needs the prompt's hidden states (needs_hidden_states)")
        # Position P-1: it produced the first new token (position P); head i predicts P+1+i.
        self._feature = state.prompt_hidden_states[-1][-1]

    def head_logits(self, feature: torch.Tensor) -> torch.Tensor:
        """[num_heads, draft vocab] logits of all heads from one feature [H], in one projection call."""
        return self.head.logits(self.heads(feature.to(self.head.weight.dtype)))

    def propose(self, state: DecodeState) -> Draft:
        if self._feature is None:
            raise RuntimeError("propose() before begin()")
        logits = self.head_logits(self._feature)
        if self.tree is None:
            n = min(self.k, self.num_heads)
            return choose_tokens(logits[:n], state, self._device, self.head, self.draft_sampling)
        top = self.head.to_token(logits.topk(self._max_rank, dim=-1).indices)  # [num_heads, R]
        tokens = top[self._depths - 1, self.tree.ranks]
        return Draft(tokens.long().to(self._device), None, self.tree.parents.clone())

    def on_verified(self, state: DecodeState, outcome: StepOutcome) -> None:
        # hidden_states: root + accepted path; the last row is position N-2, which produced the
        # step's last token (position N-1). Head i then predicts position N+i.
        if not outcome.emitted:  # a draft a server dropped unscored: nothing changed
            return
        if outcome.hidden_states is None:
            raise RuntimeError("MedusaProposer needs the verified positions' hidden states (needs_hidden_states)")
        self._feature = outcome.hidden_states[-1][-1]

    def __repr__(self) -> str:
        n = None if self.tree is None else len(self.tree.choices)
        mode = "chain" if n is None else f"tree of {n} node{'' if n == 1 else 's'}"
        return with_sizing(self, f"MedusaProposer(k={self.k}, heads={self.num_heads}, {mode}, draft_vocab={self.head.size})")


class HydraProposer(MedusaProposer):
    """Drafts with Hydra heads (module docstring): head i reads the feature, the bonus token and the
    i tokens drafted before it on its path.

    Chain mode (``choices=None``): head 0 on [b], then head 1 on [b, d_0], ... (one head call per
    token, since each needs the previous token). Tree mode: for depth d = 1, 2, ..., head d-1 runs
    once, batched over the depth-(d-1) nodes that have children (the root first), each row reading
    the tokens on the path to its node; a child is its parent's ``rank``-th candidate. Arguments and
    ``Draft`` as :class:`MedusaProposer` (deterministic, ``probs`` None).
    """

    name = "hydra"

    def __init__(self, target, heads: HydraHeads, k: int | None = None, choices=None, draft_vocab=None):
        if not isinstance(heads, HydraHeads):
            raise TypeError(f"HydraProposer needs HydraHeads, got {type(heads).__name__}: use MedusaProposer")
        super().__init__(target, heads, k=k, choices=choices, draft_vocab=draft_vocab)
        self.embed = target.get_input_embeddings().weight  # E: the target's token embeddings, frozen
        self._levels = [] if self.tree is None else self._plan_levels()

    def _plan_levels(self) -> list:
        """Per depth d: (path [U, d-1] node indices to each parent, root side first; children [m];
        row of each child's parent in path [m]; rank of each child [m]; candidates to take)."""
        parents, depths, ranks = self.tree.parents.tolist(), self._depths.tolist(), self.tree.ranks.tolist()
        levels = []
        for d in range(1, max(depths) + 1):
            children = [c for c in range(len(parents)) if depths[c] == d]
            heads_of = list(dict.fromkeys(parents[c] for c in children))  # parents in first-seen order
            path = [[] if u == trees.ROOT else trees.path_to(self.tree.parents, u) for u in heads_of]
            levels.append((torch.tensor(path, dtype=torch.long).reshape(len(heads_of), d - 1),
                           torch.tensor(children, dtype=torch.long),
                           torch.tensor([heads_of.index(parents[c]) for c in children], dtype=torch.long),
                           torch.tensor([ranks[c] for c in children], dtype=torch.long),
                           max(ranks[c] for c in children) + 1))
        return levels

    def path_logits(self, feature: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        """Logits [n, draft vocab] of head d-1 for n paths [n, d] of token ids (the bonus token
        first, then the drafted tokens before the predicted one), all from one feature [H]."""
        n, d = paths.shape
        h = feature.to(self.head.weight.dtype).expand(n, -1)
        prev = self.embed[paths].to(self.head.weight.dtype)
        return self.head.logits(self.heads.head(d - 1, h, prev))

    def propose(self, state: DecodeState) -> Draft:
        if self._feature is None:
            raise RuntimeError("propose() before begin()")
        device = self._device
        bonus = torch.tensor([state.token_list[-1]], dtype=torch.long, device=device)  # position N-1
        if self.tree is None:
            path = bonus
            for _ in range(min(self.k, self.num_heads)):
                best = self.head.to_token(self.path_logits(self._feature, path[None]).argmax(-1))
                path = torch.cat([path, best.long().to(device)])
            return Draft(path[1:])
        tokens = torch.zeros(len(self.tree.choices), dtype=torch.long, device=device)
        for path, children, row, rank, take in self._levels:
            paths = torch.cat([bonus.expand(path.shape[0], 1), tokens[path.to(device)]], dim=1)
            top = self.head.to_token(self.path_logits(self._feature, paths).topk(take, dim=-1).indices)
            tokens[children.to(device)] = top[row.to(device), rank.to(device)].long()
        return Draft(tokens, None, self.tree.parents.clone())

    def __repr__(self) -> str:
        return super().__repr__().replace("MedusaProposer", "HydraProposer", 1)


def load_medusa_proposer(target, k: int = DEFAULT_TREE_NODES, tree: bool = True, reduced_vocab: bool = True,
                         path=MEDUSA_WEIGHTS, choices=None, **kwargs) -> MedusaProposer:
    """The shipped Medusa heads as a proposer (registry builder: ``builder(target, k, **kwargs)``);
    a HydraProposer when ``path`` holds Hydra heads (e.g. ``path=HYDRA_WEIGHTS``).

    tree=True: a tree of ``k`` nodes derived (derive_choices) from the held-out rank accuracies in
    the weights' metadata, or ``choices`` if given. tree=False: a chain of min(k, num_heads) tokens.
    reduced_vocab: draft among the shipped frequency-ranked draft vocabulary (vocab.py).
    """
    heads = load_medusa_heads(target, path)
    vocab = shipped_vocab(reduced_vocab)
    if tree and choices is None:
        acc = medusa_metadata(path).get("rank_accuracy")
        if acc is None:
            raise ValueError(f"{Path(path).name} has no rank_accuracy metadata to derive a tree from; pass choices")
        choices = derive_choices(acc, k)
    if not tree:
        choices = None
    cls = HydraProposer if isinstance(heads, HydraHeads) else MedusaProposer
    return cls(target, heads, k=k, choices=choices, draft_vocab=vocab, **kwargs)


def load_hydra_proposer(target, k: int = DEFAULT_TREE_NODES, tree: bool = True, **kwargs) -> HydraProposer:
    """The Hydra heads written by ``python -m specdecode_ref.training medusa --hydra`` as a proposer
    (as :func:`load_medusa_proposer`, reading ``HYDRA_WEIGHTS`` unless ``path`` is given)."""
    kwargs.setdefault("path", HYDRA_WEIGHTS)
    return load_medusa_proposer(target, k=k, tree=tree, **kwargs)
