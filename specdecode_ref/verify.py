"""Verification: decide which drafted tokens the target keeps, and which token it adds.

Both chain functions take a batch of drafts of K tokens and the target's scores at the K+1
positions (the last committed token plus the K drafts) and return ``(tokens [B, K+1],
num_accepted [B])``: row b emits ``tokens[b, :num_accepted[b] + 1]`` (the accepted drafts, then
the recovered or bonus token) and the rest of the row is PLACEHOLDER_TOKEN_ID. Draft rows shorter
than K may be padded with PLACEHOLDER_TOKEN_ID (never accepted; the token at that position is then
sampled from the target alone). Shapes: B requests, K drafted tokens, V the vocabulary.

Production counterparts: vLLM ``vllm/v1/sample/rejection_sampler.py``; transformers
``generation/utils.py`` (``_speculative_sampling``).
"""
from __future__ import annotations

import math

import torch

from .trees import ROOT, validate_parents

# Fills the unused tail of every output row and pads draft rows shorter than K; never a real token
# id. vLLM's name for the same value: ``vllm/v1/sample/rejection_sampler.py``.
PLACEHOLDER_TOKEN_ID = -1

#: How a sampled chain draft is verified: "token" (rejection_sample, token by token) or "block"
#: (block_verify, the draft as a whole). Greedy decoding verifies greedily either way.
VERIFICATION = ("token", "block")


def check_verification(verification) -> str:
    if verification not in VERIFICATION:
        raise ValueError(f"verification must be one of {VERIFICATION}, got {verification!r}")
    return verification


def refuse_block_for_tree(verification: str) -> None:
    """Block verification judges one chain; a tree has several candidate continuations per node."""
    if verification == "block":
        raise ValueError("verification='block' verifies chain drafts; this proposer drafted a tree (its lossless "
                         "tree verification is verify.tree_rejection_sample): use verification='token'")


def check_verify_inputs(scores: torch.Tensor, draft_tokens: torch.Tensor, name: str):
    """Clear errors for a chain verifier's inputs: scores [B, K+1, V] (named ``name`` in messages)
    and draft_tokens [B, K] of ids inside the vocabulary."""
    if scores.dim() != 3:
        raise ValueError(f"{name} must be [B, K+1, V], got shape {tuple(scores.shape)}")
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [B, K], got shape {tuple(draft_tokens.shape)}")
    b, k1, v = scores.shape
    if draft_tokens.shape != (b, k1 - 1):
        raise ValueError(
            f"draft_tokens {tuple(draft_tokens.shape)} does not match {name} {tuple(scores.shape)}: "
            "expected [B, K] with K+1 target positions")
    if draft_tokens.dtype != torch.long:
        raise ValueError(f"draft_tokens must be a LongTensor, got {draft_tokens.dtype}")
    if (draft_tokens >= v).any():
        raise ValueError(f"draft token id >= vocabulary size {v}: do draft and target share a vocabulary?")


def accepted_length(accept: torch.Tensor) -> torch.Tensor:
    """Length of the all-True prefix of each row: [B, K] bool -> [B] long."""
    return torch.cumprod(accept.long(), dim=1).sum(dim=1)


def assemble_output(draft_tokens, num_accepted, next_tokens):
    """[B, K] drafts, [B] accepted lengths, [B] next tokens -> the output rows [B, K+1]."""
    b, k = draft_tokens.shape
    pos = torch.arange(k + 1, device=draft_tokens.device).expand(b, k + 1)
    padded = torch.cat([draft_tokens, draft_tokens.new_full((b, 1), PLACEHOLDER_TOKEN_ID)], dim=1)
    out = torch.where(pos < num_accepted[:, None], padded, torch.full_like(padded, PLACEHOLDER_TOKEN_ID))
    out.scatter_(1, num_accepted[:, None], next_tokens[:, None])
    return out


def greedy_verify(target_logits: torch.Tensor, draft_tokens: torch.Tensor):
    """Accept drafts while they equal the target's argmax; then emit the target's argmax.

    target_logits: [B, K+1, V], the target's scores after the last committed token and after each
    draft. draft_tokens: [B, K] long. Returns ``(tokens [B, K+1] long, num_accepted [B] long)``.
    """
    check_verify_inputs(target_logits, draft_tokens, "target_logits")
    argmax = target_logits.argmax(dim=-1)  # [B, K+1]
    num_accepted = accepted_length(argmax[:, :-1] == draft_tokens)
    next_tokens = argmax.gather(1, num_accepted[:, None]).squeeze(1)
    return assemble_output(draft_tokens, num_accepted, next_tokens), num_accepted


def rejection_sample(target_probs: torch.Tensor, draft_tokens: torch.Tensor,
                     draft_probs: torch.Tensor | None = None,
                     generator: torch.Generator | None = None):
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): output is distributed as p.

    Draft position i is accepted with probability min(1, p_i(x)/q_i(x)); at the first rejection the
    token is drawn from the residual max(p_i - q_i, 0) renormalised; if all K pass, a bonus token is
    drawn from p_K. ``draft_probs=None`` means a deterministic proposer (q one-hot on its token).
    All randomness comes from ``generator``: pass one per request and never reseed it per draw.

    target_probs: [B, K+1, V], already processed by the request's SamplingParams. draft_tokens:
    [B, K] long (PLACEHOLDER_TOKEN_ID pads a shorter row). draft_probs: [B, K, V], the q each
    token was drawn from, or None. Returns ``(tokens [B, K+1] long, num_accepted [B] long)``.
    """
    check_verify_inputs(target_probs, draft_tokens, "target_probs")
    b, k1, v = target_probs.shape
    k = k1 - 1
    p = target_probs.float()
    valid = draft_tokens >= 0  # PLACEHOLDER_TOKEN_ID pads short rows
    safe_tokens = draft_tokens.clamp(min=0)
    p_draft = p[:, :k].gather(2, safe_tokens[..., None]).squeeze(-1)  # [B, K]
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        if draft_probs.shape != (b, k, v):
            raise ValueError(f"draft_probs must be [B, K, V] = {(b, k, v)}, got {tuple(draft_probs.shape)}")
        q_draft = draft_probs.float().gather(2, safe_tokens[..., None]).squeeze(-1)
    u = torch.rand((b, k), generator=generator, device=p.device)
    # u < p/q written without the division; q = 0 cannot be drafted, p = 0 is never accepted.
    accept = (u * q_draft < p_draft) & valid
    num_accepted = accepted_length(accept)

    # Distribution of the one extra token at position num_accepted.
    rows = torch.arange(b, device=p.device)
    p_next = p[rows, num_accepted]  # [B, V]
    rejected = num_accepted < k  # else: bonus token from p_K
    idx = num_accepted.clamp(max=max(k - 1, 0))
    if k > 0:
        if draft_probs is None:
            q_next = torch.zeros_like(p_next)
            q_next[rows, safe_tokens[rows, idx]] = 1.0
        else:
            q_next = draft_probs[rows, idx].float()
        q_next = q_next * (rejected & valid[rows, idx])[:, None]  # padded slot or bonus: q = 0
        residual = (p_next - q_next).clamp(min=0.0)
        mass = residual.sum(dim=-1, keepdim=True)
        # p == q up to rounding leaves no residual mass: fall back to p (a rejection there has
        # probability ~0, so this cannot bias the output).
        residual = torch.where(mass > 1e-12, residual / mass.clamp(min=1e-30), p_next)
    else:
        residual = p_next
    next_tokens = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    return assemble_output(draft_tokens, num_accepted, next_tokens), num_accepted


def prefix_weights(ratio: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Block verification's weight of every prefix, [B, K] ratios p/q of the drafted tokens and
    [B, K] valid (False: padding) -> [B, K+1]: w_0 = 1, w_i = min(1, w_{i-1} p_i/q_i), 0 past
    the end of a row's draft. The weight carries along the draft: it is what lets a later token
    that q under-proposes make up for an earlier one it over-proposed."""
    w = [torch.ones(ratio.shape[0], device=ratio.device)]
    for i in range(ratio.shape[1]):
        w.append(torch.clamp(w[-1] * ratio[:, i], max=1.0) * valid[:, i])
    return torch.stack(w, dim=1)


def stop_probabilities(residual_mass: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """h_i = r_i / (r_i + 1 - w_i): the probability that block verification keeps prefix i,
    given that it kept no longer one ([B, K+1] each). After the last drafted token r = w and h = w."""
    denom = residual_mass + 1.0 - w
    return torch.where(denom > 1e-12, residual_mass / denom.clamp(min=1e-30), torch.zeros_like(w))


def block_verify(target_probs: torch.Tensor, draft_tokens: torch.Tensor,
                 draft_probs: torch.Tensor | None = None,
                 generator: torch.Generator | None = None):
    """Block verification (Sun et al., 2024, "Block Verification Accelerates Speculative
    Decoding"): the draft is judged as a whole, not token by token. Output is distributed as p.

    Token-by-token verification stops at the first token whose ratio p/q draws a rejection, even
    when the tokens after it would have made up for it. Block verification carries a weight along
    the draft, w_0 = 1 and w_i = min(1, w_{i-1} p_i(X_i) / q_i(X_i)) (a token that q over-proposes
    lowers the weight of every prefix through it, one it under-proposes raises it again, up to 1),
    and keeps the LONGEST prefix i that passes its own test: prefix i (i < the draft's length)
    stops there with probability h_i = r_i / (r_i + 1 - w_i), where r_i is the mass of the
    residual max(w_i p_{i+1} - q_{i+1}, 0); the whole draft with h = w_K. At the chosen prefix
    the next token is drawn from that residual, normalised (all of the draft kept: from p, a
    bonus token). At temperature 0 with a one-hot draft it keeps exactly the token rule's prefix;
    in expectation it never keeps fewer tokens than the token rule (notebook 11 derives both).

    Same shapes, padding and randomness as :func:`rejection_sample`: target_probs [B, K+1, V],
    draft_tokens [B, K] (PLACEHOLDER_TOKEN_ID pads a shorter row), draft_probs [B, K, V] or None
    (q one-hot on each drafted token), one generator per request. Returns ``(tokens [B, K+1],
    num_accepted [B])``.
    """
    check_verify_inputs(target_probs, draft_tokens, "target_probs")
    b, k1, v = target_probs.shape
    k = k1 - 1
    p = target_probs.float()
    valid = draft_tokens >= 0
    safe_tokens = draft_tokens.clamp(min=0)
    if draft_probs is None:
        q = torch.zeros(b, k, v, device=p.device)
        q.scatter_(2, safe_tokens[..., None], 1.0)
    else:
        if draft_probs.shape != (b, k, v):
            raise ValueError(f"draft_probs must be [B, K, V] = {(b, k, v)}, got {tuple(draft_probs.shape)}")
        q = draft_probs.float().clone()
    q = q * valid[..., None]  # a padded position drafts nothing: q = 0 there
    p_draft = p[:, :k].gather(2, safe_tokens[..., None]).squeeze(-1)  # [B, K]
    q_draft = q.gather(2, safe_tokens[..., None]).squeeze(-1)
    ratio = torch.where(q_draft > 0, p_draft / q_draft.clamp(min=1e-30), torch.zeros_like(p_draft))
    w = prefix_weights(ratio, valid)  # [B, K+1]
    # The residual after each prefix: max(w_i p_{i+1} - q_{i+1}, 0), with q = 0 after the last draft.
    q_next = torch.cat([q, torch.zeros(b, 1, v, device=p.device)], dim=1)  # [B, K+1, V]
    residual = (w[..., None] * p - q_next).clamp(min=0.0)
    r = residual.sum(dim=-1)  # [B, K+1]
    h = stop_probabilities(r, w)
    # The longest prefix that passes its test (prefix 0 when none does).
    eta = torch.rand((b, k1), generator=generator, device=p.device)
    passes = (eta <= h) & (torch.arange(k1, device=p.device)[None] <= valid.sum(1, keepdim=True))
    index = torch.arange(k1, device=p.device).expand(b, k1)
    num_accepted = torch.where(passes, index, torch.zeros_like(index)).max(dim=1).values
    rows = torch.arange(b, device=p.device)
    chosen, mass = residual[rows, num_accepted], r[rows, num_accepted, None]
    # An empty residual (p == q up to rounding there) has probability ~0 of being chosen: fall back to p.
    dist = torch.where(mass > 1e-12, chosen / mass.clamp(min=1e-30), p[rows, num_accepted])
    next_tokens = torch.multinomial(dist, 1, generator=generator).squeeze(1)
    return assemble_output(draft_tokens, num_accepted, next_tokens), num_accepted


# ================================================================================================
# Tree verification (trees.py): one target forward scored the root (slot 0) and n tree nodes
# (slot i + 1 = node i); row s of the target's scores is its distribution after slot s, so node i
# is checked against row parents[i] + 1. Shapes: n tree nodes; the target's scores [n+1, V];
# parents [n] (trees.ROOT for a child of the root); draft_tokens [n] long. Each function returns
# ``(accepted, emitted)``: ``accepted`` the node indices of the accepted root-to-node path (a
# LongTensor [m], possibly empty), ``emitted`` the token ids the step commits (LongTensor [m+1]:
# the accepted tokens, then one token from the target).
# ================================================================================================

def _check_tree(scores: torch.Tensor, parents, draft_tokens: torch.Tensor, name: str):
    if scores.dim() != 2:
        raise ValueError(f"{name} must be [n+1, V] (the root, then the n tree nodes), got shape {tuple(scores.shape)}")
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dim() != 1:
        raise ValueError("draft_tokens must be a 1-D LongTensor [n] (one token per tree node)")
    if draft_tokens.dtype != torch.long:
        raise ValueError(f"draft_tokens must be a LongTensor, got {draft_tokens.dtype}")
    n = draft_tokens.numel()
    p = validate_parents(parents, n)
    if scores.shape[0] != n + 1:
        raise ValueError(f"{name} has {scores.shape[0]} rows for a tree of {n} nodes: expected n+1 = {n + 1} "
                         "(row 0 is the root, row i+1 node i)")
    v = scores.shape[1]
    if n and (int(draft_tokens.min()) < 0 or int(draft_tokens.max()) >= v):
        raise ValueError(f"draft token ids must lie in [0, {v}): do draft and target share a vocabulary?")
    return p.tolist(), draft_tokens.tolist()


def _deepest_good_path(parents: list, good, score=None) -> list:
    """Node indices from the root down to the deepest node whose whole path passes ``good(i)``;
    [] when no child of the root passes. Parents come first.

    Ties between equally deep nodes: without ``score``, the first such node; with ``score(i)`` (a
    per-node value, e.g. the log-probability of node i's token at its parent), the node whose path
    has the largest sum of scores, the first of those if several are equal."""
    good_depth = []  # length of the all-good path ending at node i, 0 if there is none
    path_score = []  # sum of score over the all-good path ending at node i (0 when none)
    best, best_len, best_score = ROOT, 0, float("-inf")  # the best such node so far (the root: nothing accepted)
    for i, par in enumerate(parents):
        ok = good(i) and (par == ROOT or good_depth[par] > 0)
        good_depth.append((1 if par == ROOT else good_depth[par] + 1) if ok else 0)
        path_score.append(((0.0 if par == ROOT else path_score[par]) + float(score(i))) if ok and score else 0.0)
        if good_depth[i] > best_len or (score is not None and good_depth[i] == best_len > 0
                                         and path_score[i] > best_score):
            best, best_len, best_score = i, good_depth[i], path_score[i]
    path = []
    while best != ROOT:
        path.append(best)
        best = parents[best]
    return path[::-1]


def tree_greedy_verify(target_logits: torch.Tensor, parents, draft_tokens: torch.Tensor):
    """Greedy verification of a candidate tree: the longest root-to-node path whose every token
    equals the target's argmax at its parent, then the target's argmax after that path.

    A node is *correct* when its token is the argmax of its parent's row; the accepted path is
    the deepest node whose whole path is correct (ties: the first such node). With distinct
    sibling tokens at most one child of a node can be correct, so the path is unique and the
    output equals plain greedy decoding, as for a chain.

    target_logits: [n+1, V] (row 0 the root, row i+1 node i). parents: [n]. draft_tokens: [n]
    long. Returns ``(accepted [m] long, emitted [m+1] long)``.
    """
    p, toks = _check_tree(target_logits, parents, draft_tokens, "target_logits")
    argmax = target_logits.argmax(dim=-1).tolist()
    path = _deepest_good_path(p, lambda i: toks[i] == argmax[p[i] + 1])
    last_slot = path[-1] + 1 if path else 0
    emitted = [toks[i] for i in path] + [argmax[last_slot]]
    device = target_logits.device
    return torch.tensor(path, dtype=torch.long, device=device), torch.tensor(emitted, dtype=torch.long, device=device)


def tree_rejection_sample(target_probs: torch.Tensor, parents, draft_tokens: torch.Tensor,
                          generator: torch.Generator | None = None, draft_probs: torch.Tensor | None = None):
    """Lossless multi-candidate speculative sampling over a tree (SpecInfer's multi-step
    speculative sampling; EAGLE's sampling mode). The emitted tokens are distributed exactly as
    if sampled one by one from the target.

    Walk down from the root. At the current slot, with target distribution p, keep a residual
    r = p and try the slot's children x_1, x_2, ... in node order:

    * accept x_j with probability min(1, r(x_j) / q_j(x_j)); on acceptance move to that child and
      start again there with its own row of ``target_probs``;
    * on rejection set r <- normalise(max(r - q_j, 0)) and try the next child;
    * when no child is left (all rejected, or a leaf), draw the step's last token from r.

    Which q_j: ``draft_probs=None`` means deterministic children (top-k candidates, Medusa trees,
    EAGLE-2): q_j is one-hot on x_j, so the test is "accept with probability r(x_j)" and the
    residual is r with x_j set to 0, renormalised. With ``draft_probs`` ([n, V]; row i the
    distribution node i was *drawn from*, i.e. the drafter's q at its parent), each child must
    have been sampled from its row independently of its siblings (i.i.d. from the same q for
    SpecInfer's sampled trees); children drawn without replacement need the one-hot rule above
    instead (treat them as deterministic).

    Why lossless (one slot; then induct down the accepted path, since each child's row is the
    target's conditional given that path). Claim: a stage that starts with residual r outputs a
    token distributed as r. The last stage just samples r. Stage j draws x ~ q_j independently
    of the earlier stages and accepts it with probability min(1, r/q_j): that alone emits y with
    probability min(q_j(y), r(y)). It rejects with probability 1 - sum_y min(q_j, r)
    = sum_y max(r - q_j, 0) =: m, and then (by induction) the next stage emits y with
    probability max(r(y) - q_j(y), 0) / m. Together: min(q_j, r) + max(r - q_j, 0) = r(y). Applied
    to the first stage (r = p) the slot emits y ~ p. For one-hot q_j the residual is r with x_j
    removed, the same rule. Every draw uses ``generator``, never the global RNG.

    target_probs: [n+1, V], processed by the request's SamplingParams. parents: [n].
    draft_tokens: [n] long. draft_probs: [n, V] or None. Returns ``(accepted node indices [m],
    emitted tokens [m+1])``, like :func:`tree_greedy_verify`.
    """
    p_list, toks = _check_tree(target_probs, parents, draft_tokens, "target_probs")
    n, v = len(toks), target_probs.shape[1]
    probs = target_probs.float()
    if draft_probs is not None:
        if draft_probs.shape != (n, v):
            raise ValueError(f"draft_probs must be [n, V] = {(n, v)} (row i: the q node i was drawn from), "
                             f"got {tuple(draft_probs.shape)}")
        draft_probs = draft_probs.float()
    kids: list = [[] for _ in range(n + 1)]
    for i, par in enumerate(p_list):
        kids[par + 1].append(i)
    device = probs.device
    path = []
    slot = 0
    while True:
        r = probs[slot]
        accepted = None
        for i in kids[slot]:
            x = toks[i]
            q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
            u = float(torch.rand((), generator=generator, device=device))
            r_x = float(r[x])
            if u * q_x < r_x:  # u < r/q without dividing; r(x) = 0 is never accepted
                accepted = i
                break
            if draft_probs is None:
                residual = r.clone()
                residual[x] = 0.0
            else:
                residual = (r - draft_probs[i]).clamp(min=0.0)
            mass = residual.sum()
            # r == q up to rounding leaves no residual mass; a rejection there has probability ~0,
            # so keeping r cannot bias the output.
            if float(mass) > 1e-12:
                r = residual / mass
        if accepted is None:
            last = int(torch.multinomial(r, 1, generator=generator))
            break
        path.append(accepted)
        slot = accepted + 1
    emitted = [toks[i] for i in path] + [last]
    return torch.tensor(path, dtype=torch.long, device=device), torch.tensor(emitted, dtype=torch.long, device=device)


TYPICAL_EPSILON, TYPICAL_DELTA = 0.09, 0.3  # Medusa's posterior_threshold and posterior_alpha


def typical_threshold(probs: torch.Tensor, epsilon: float = TYPICAL_EPSILON, delta: float = TYPICAL_DELTA):
    """min(epsilon, delta * exp(-H(p))) per row of probs [..., V] (H in nats): the probability a token
    needs to count as plausible under typical acceptance. Returns [...]."""
    if not epsilon >= 0 or not delta >= 0:
        raise ValueError(f"epsilon and delta must be >= 0, got epsilon={epsilon!r}, delta={delta!r}")
    probs = probs.float()
    entropy = -(probs * torch.log(probs.clamp(min=1e-30))).sum(dim=-1)
    return torch.minimum(torch.full_like(entropy, float(epsilon)), delta * torch.exp(-entropy))


def typical_accept(target_probs: torch.Tensor, parents, draft_tokens: torch.Tensor,
                   generator: torch.Generator | None = None, epsilon: float = TYPICAL_EPSILON,
                   delta: float = TYPICAL_DELTA):
    """Medusa's typical acceptance (Cai et al. 2024). LOSSY: the output does NOT follow the target.

    A node x is *typical* when p(x) > min(epsilon, delta * exp(-H(p))), with p the target's
    distribution at its parent and H its entropy (nats): a confident target (low entropy) demands
    a probable token, a hesitant one accepts anything reasonably likely. The accepted path is the
    longest path of typical nodes; among equally long ones, as in Medusa's ``evaluate_posterior``,
    the path whose tokens the target finds most likely (the largest sum of log p over the path;
    the first of those on an exact tie). The step's last token is drawn from p after that path.
    Defaults: Medusa's (``posterior_threshold``, ``posterior_alpha``), see :func:`typical_threshold`.

    It accepts more than rejection sampling (any typical token passes, with probability 1), which
    is its point, but the price is the distribution: a drafted token with p(x) = 0.3 is emitted
    every time it is drafted instead of 30 % of the time. Use it only where "plausible text" is
    enough; :func:`tree_rejection_sample` is the lossless alternative. With a greedy (one-hot) p
    it reduces to :func:`tree_greedy_verify`.

    target_probs: [n+1, V]. parents: [n]. draft_tokens: [n] long. Returns ``(accepted [m],
    emitted [m+1])``, like :func:`tree_greedy_verify`.
    """
    p_list, toks = _check_tree(target_probs, parents, draft_tokens, "target_probs")
    threshold = typical_threshold(target_probs, epsilon, delta)  # [n+1]
    probs = target_probs.float()
    node_p = [float(probs[p_list[i] + 1, toks[i]]) for i in range(len(toks))]  # p(node | its parent)
    path = _deepest_good_path(p_list, lambda i: node_p[i] > float(threshold[p_list[i] + 1]),
                              score=lambda i: math.log(node_p[i]))  # typical nodes have p > 0
    last_slot = path[-1] + 1 if path else 0
    last = int(torch.multinomial(probs[last_slot], 1, generator=generator))
    device = probs.device
    emitted = [toks[i] for i in path] + [last]
    return torch.tensor(path, dtype=torch.long, device=device), torch.tensor(emitted, dtype=torch.long, device=device)
