"""The draft-verify-rollback loop, and plain autoregressive decoding through the same code path.

Invariant: the target's KV cache holds every committed token except the last one. A step feeds
the last committed token plus the k drafted tokens in one forward, so the target scores k+1
positions; verification keeps a prefix of the draft and adds one target token; the cache is then
cropped back to the committed length minus one. Plain decoding is the same step with an empty
draft, so ``autoregressive_generate`` and ``generate`` share every line that touches the target.
A tree draft (trees.py) is scored the same way in one forward, with a tree attention mask and
depth-based position ids; the cache is then compacted to the prefix plus the accepted path.

Counterparts: transformers ``generation/utils.py`` (``_assisted_decoding``), vLLM
``vllm/v1/spec_decode`` with ``vllm/v1/sample/rejection_sampler.py``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from . import kv, trees
from .metrics import SpecStats
from .proposers.base import DecodeState, Draft, Proposer, StepOutcome
from .sampling import GREEDY, SamplingParams, logits_to_probs, next_token
from .verify import greedy_verify, rejection_sample, tree_greedy_verify, tree_rejection_sample, typical_accept

# How each new token came to be (see viz.py).
TARGET, ACCEPTED, RECOVERED, BONUS = "target", "accepted", "recovered", "bonus"


@dataclass
class GenerationResult:
    tokens: torch.Tensor  # 1-D LongTensor of the new tokens only
    stats: SpecStats
    token_kinds: list = field(default_factory=list)  # one of TARGET/ACCEPTED/RECOVERED/BONUS per token
    finish_reason: str = "length"  # "length" or "eos"

    def text(self, tokenizer, skip_special_tokens: bool = True) -> str:
        return tokenizer.decode(self.tokens.tolist(), skip_special_tokens=skip_special_tokens)


def eos_token_ids(model, eos_token_id=None) -> list:
    """The ids that end generation: ``eos_token_id`` if given (int or list), else the model's
    generation config, else its config; in that order, without duplicates."""
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos_token_id is None:
            eos_token_id = getattr(model.config, "eos_token_id", None)
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, int):
        return [eos_token_id]
    return list(dict.fromkeys(int(t) for t in eos_token_id))


def context_window(model) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


def _validate(model, input_ids, max_new_tokens):
    if not isinstance(input_ids, torch.Tensor):
        input_ids = torch.as_tensor(input_ids, dtype=torch.long)
    if input_ids.dim() == 2:
        if input_ids.shape[0] != 1:
            raise ValueError(f"generate() decodes one request at a time; got a batch of {input_ids.shape[0]}")
        input_ids = input_ids[0]
    if input_ids.dim() != 1:
        raise ValueError(f"input_ids must be 1-D (or [1, L]), got shape {tuple(input_ids.shape)}")
    if input_ids.numel() == 0:
        raise ValueError("the prompt is empty: generation needs at least one input token")
    if input_ids.dtype not in (torch.long, torch.int, torch.int32, torch.int16):
        raise ValueError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    vocab = model.get_input_embeddings().weight.shape[0]
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        raise ValueError(f"token ids must lie in [0, {vocab}); got min {int(input_ids.min())}, "
                         f"max {int(input_ids.max())}")
    window = context_window(model)
    if window is not None and input_ids.numel() + max_new_tokens > window:
        raise ValueError(
            f"prompt of {input_ids.numel()} tokens + max_new_tokens={max_new_tokens} exceeds the model's "
            f"context window of {window} tokens; shorten the prompt or ask for fewer tokens")
    return input_ids.long()


class _Target:
    """The target model with its KV cache: the one code path for plain and speculative decoding."""

    def __init__(self, model, want_hidden: bool):
        self.model = model
        self.cache = kv.new_cache(model)
        self.want_hidden = want_hidden
        self.device = next(model.parameters()).device
        self.forwards = 0
        self.time_s = 0.0

    def forward(self, ids: list | torch.Tensor, last_only: bool = False, attention_mask=None, position_ids=None):
        """Score ``ids`` after the cached prefix; returns (logits [n or 1, V], hidden states or None).

        attention_mask / position_ids: a custom 4D mask and the matching positions (tree drafts,
        see trees.py); None lets the model build the ordinary causal ones.
        """
        t0 = time.perf_counter()
        x = torch.as_tensor(ids, dtype=torch.long, device=self.device).reshape(1, -1)
        kwargs = {"logits_to_keep": 1} if last_only else {}
        if attention_mask is not None:
            kwargs.update(attention_mask=attention_mask, position_ids=position_ids)
        out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True,
                         output_hidden_states=self.want_hidden, **kwargs)
        self.cache = out.past_key_values
        self.forwards += 1
        hidden = tuple(h[0] for h in out.hidden_states) if self.want_hidden else None
        logits = out.logits[0]
        self.time_s += time.perf_counter() - t0
        return logits, hidden

    def score_with(self, scorer, state, ids: list):
        """Let a proposer run the verification forward itself in this cache (early exit reuses the
        draft's first-layer keys and values instead of recomputing them); timed and counted alike."""
        t0 = time.perf_counter()
        logits = scorer(state, ids)
        self.forwards += 1
        self.time_s += time.perf_counter() - t0
        return logits, None


TREE_ACCEPTANCE = ("lossless", "typical")


def _clip_tree_draft(draft: Draft, max_depth: int) -> Draft:
    """Drop tree nodes deeper than ``max_depth`` (they could not be emitted)."""
    parents = trees.validate_parents(draft.parents, len(draft))
    new_parents, keep = trees.clip_tree(parents, max_depth=max(max_depth, 0))
    if keep.numel() == len(draft):
        return Draft(draft.tokens, draft.probs, parents)
    keep_dev = keep.to(draft.tokens.device)
    probs = None if draft.probs is None else draft.probs[keep.to(draft.probs.device)]
    return Draft(draft.tokens[keep_dev], probs, new_parents)


def _tree_step(target: "_Target", state: DecodeState, draft: Draft, sampling: SamplingParams,
               generator, tree_acceptance: str):
    """One target forward over [last committed] + the tree, verification, cache compaction.

    Returns (accepted node indices, emitted tokens, hidden states of root + accepted path or None,
    whether the last token is a bonus, i.e. the accepted path ended at a leaf).
    """
    device = target.device
    parents = draft.parents  # validated on the CPU by _clip_tree_draft
    past_len = kv.cache_len(target.cache)  # the committed tokens except the last one (the root)
    dtype = target.model.get_input_embeddings().weight.dtype
    mask = trees.tree_attention_mask(parents, past_len, dtype=dtype, device=device)
    position_ids = trees.tree_position_ids(parents, past_len, device=device)
    tokens = draft.tokens.to(device).long()
    logits, hidden = target.forward([state.token_list[-1]] + tokens.tolist(), attention_mask=mask,
                                    position_ids=position_ids)
    if sampling.is_greedy:
        path, emitted = tree_greedy_verify(logits, parents, tokens)
    else:
        probs = logits_to_probs(logits, sampling)
        if tree_acceptance == "typical":
            path, emitted = typical_accept(probs, parents, tokens, generator)
        else:
            q = None if draft.probs is None else draft.probs.to(device)
            path, emitted = tree_rejection_sample(probs, parents, tokens, generator, q)
    path = path.tolist()
    # Keep the committed prefix, the root and the accepted path: the path's keys were computed at
    # positions past_len + depth, i.e. consecutive, exactly as if it had been fed as a chain.
    kv.keep_positions(target.cache, trees.kept_positions(past_len, path))
    if hidden is not None:
        slots = torch.tensor([0] + [i + 1 for i in path], dtype=torch.long, device=device)
        hidden = tuple(h.index_select(0, slots.to(h.device)) for h in hidden)
    last_slot = path[-1] + 1 if path else 0
    is_leaf = not bool((parents == last_slot - 1).any())
    return path, emitted.tolist(), hidden, is_leaf


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def generate(model, input_ids, proposer: Proposer | None = None, max_new_tokens: int = 128,
             sampling: SamplingParams | None = None, seed: int | None = 0,
             eos_token_id=None, stop_on_eos: bool = True, tree_acceptance: str = "lossless") -> GenerationResult:
    """Speculative decoding with ``proposer`` (plain decoding when None). Lossless: greedy output
    equals plain greedy decoding; sampled output follows the target's distribution.

    input_ids: 1-D (or [1, L]) prompt ids. sampling: SamplingParams (default greedy).
    seed: seeds the request's one torch.Generator. Generation stops after max_new_tokens tokens
    exactly, or at the first EOS (included in the output) unless stop_on_eos=False.

    Tree drafts (``Draft.parents`` set, see trees.py) are scored in one target forward with a tree
    attention mask; the target cache is then compacted to the accepted path. Nodes deeper than
    the token budget or the context window are dropped. tree_acceptance (sampling only; greedy
    always verifies greedily): "lossless" = multi-candidate rejection sampling
    (verify.tree_rejection_sample), "typical" = Medusa's typical acceptance (verify.typical_accept),
    which is LOSSY: the output no longer follows the target's distribution. "typical" also
    applies to chain drafts (verified as a one-branch tree).
    """
    if tree_acceptance not in TREE_ACCEPTANCE:
        raise ValueError(f"tree_acceptance must be one of {TREE_ACCEPTANCE}, got {tree_acceptance!r}")
    sampling = GREEDY if sampling is None else sampling
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    if proposer is not None and not isinstance(proposer, Proposer):
        raise TypeError(f"proposer must be a specdecode_ref.proposers.Proposer, got {type(proposer).__name__}")
    prompt = _validate(model, input_ids, max_new_tokens)
    if proposer is not None:
        proposer.check_compatible(model)
    eos = set(eos_token_ids(model, eos_token_id)) if stop_on_eos else set()
    window = context_window(model)

    device = next(model.parameters()).device
    generator = None
    if not sampling.is_greedy:
        generator = torch.Generator(device=device)
        generator.manual_seed(0 if seed is None else int(seed))

    stats = SpecStats()
    want_hidden = proposer is not None and proposer.needs_hidden_states
    target = _Target(model, want_hidden)
    state = DecodeState(target=model, sampling=sampling, generator=generator,
                        prompt_len=prompt.numel(), token_list=prompt.tolist())
    new_tokens: list = []
    kinds: list = []
    finish = "length"

    _sync(device)
    t_start = time.perf_counter()
    # Prefill: the whole prompt; its last position gives the first new token.
    logits, hidden = target.forward(prompt, last_only=True)
    first = int(next_token(logits[-1], sampling, generator))
    state.prompt_hidden_states = hidden
    stats.prefill_time_s = target.time_s
    new_tokens.append(first)
    kinds.append(TARGET)
    state.token_list.append(first)
    if first in eos:
        finish = "eos"
    # A proposer with ``scores_draft`` runs the verification forward itself (``score``).
    scorer = proposer.score if proposer is not None and getattr(proposer, "scores_draft", False) else None
    state.target_cache = target.cache
    if proposer is not None:
        t0 = time.perf_counter()
        proposer.begin(state)
        stats.draft_time_s += time.perf_counter() - t0

    while finish != "eos" and len(new_tokens) < max_new_tokens:
        remaining = max_new_tokens - len(new_tokens)
        draft = Draft.empty(device)
        if proposer is not None:
            t0 = time.perf_counter()
            draft = proposer.propose(state)
            stats.draft_time_s += time.perf_counter() - t0
            if len(draft) > proposer.k:
                raise ValueError(f"{proposer!r} drafted {len(draft)} tokens, more than its k={proposer.k}")
            if draft.probs is not None and draft.probs.shape[0] != len(draft):
                raise ValueError(f"draft probs cover {draft.probs.shape[0]} positions for {len(draft)} tokens")
            if tree_acceptance == "typical" and not sampling.is_greedy and not draft.is_tree and len(draft) > 0:
                draft = Draft(draft.tokens, draft.probs, trees.chain_parents(len(draft)))
            # Never draft past the token budget or the context window: they could not be emitted.
            limit = remaining - 1
            if window is not None:
                limit = min(limit, window - len(state.token_list))
            if draft.is_tree:
                draft = _clip_tree_draft(draft, limit)
            elif len(draft) > limit:
                draft = Draft(draft.tokens[:limit], None if draft.probs is None else draft.probs[:limit])
        n = len(draft)
        committed_before = len(state.token_list)
        path = None
        if draft.is_tree and n > 0:
            path, emitted, hidden, bonus = _tree_step(target, state, draft, sampling, generator, tree_acceptance)
            num_accepted = len(path)
            step_kinds = [ACCEPTED] * num_accepted + [BONUS if bonus else RECOVERED]
        else:
            ids = [state.token_list[-1]] + draft.tokens.tolist()
            if scorer is None:
                logits, hidden = target.forward(ids)
            else:
                logits, hidden = target.score_with(scorer, state, ids)
            if n == 0:
                emitted = [int(next_token(logits[-1], sampling, generator))]
                num_accepted = 0
            else:
                draft_tokens = draft.tokens.to(device).long()[None]
                if sampling.is_greedy:
                    out, acc = greedy_verify(logits[None], draft_tokens)
                else:
                    probs = logits_to_probs(logits, sampling)
                    q = None if draft.probs is None else draft.probs[None]
                    out, acc = rejection_sample(probs[None], draft_tokens, q, generator)
                num_accepted = int(acc[0])
                emitted = out[0, : num_accepted + 1].tolist()
            # Roll the target cache back to the committed prefix (minus the newest token).
            kv.crop_to(target.cache, committed_before + num_accepted)
            step_kinds = [ACCEPTED] * num_accepted + [TARGET if n == 0 else (BONUS if num_accepted == n else RECOVERED)]
            if draft.is_tree:  # a tree clipped to nothing by the token budget
                path = []
        # EOS inside the emitted tokens ends generation; max_new_tokens is exact.
        emitted = emitted[:remaining]
        for i, tok in enumerate(emitted):
            if tok in eos:
                emitted = emitted[: i + 1]
                finish = "eos"
                break
        stats.record_step(n, num_accepted, len(emitted))
        new_tokens.extend(emitted)
        kinds.extend(step_kinds[: len(emitted)])
        state.token_list.extend(emitted)
        if proposer is not None:
            t0 = time.perf_counter()
            step_hidden = None if hidden is None else tuple(h[: num_accepted + 1] for h in hidden)
            # Tree drafts also say which nodes were accepted (to roll back along the right branch).
            outcome = StepOutcome(draft, num_accepted, emitted, step_hidden, accepted_nodes=path)
            proposer.on_verified(state, outcome)
            stats.draft_time_s += time.perf_counter() - t0

    _sync(device)
    stats.wall_time_s = time.perf_counter() - t_start
    stats.target_forwards = target.forwards
    stats.target_time_s = target.time_s
    stats.new_tokens = len(new_tokens)
    return GenerationResult(torch.tensor(new_tokens, dtype=torch.long), stats, kinds, finish)


def autoregressive_generate(model, input_ids, max_new_tokens: int = 128,
                            sampling: SamplingParams | None = None, seed: int | None = 0,
                            eos_token_id=None, stop_on_eos: bool = True) -> GenerationResult:
    """Plain decoding, one target forward per token: the baseline every proposer must match."""
    return generate(model, input_ids, proposer=None, max_new_tokens=max_new_tokens, sampling=sampling,
                    seed=seed, eos_token_id=eos_token_id, stop_on_eos=stop_on_eos)
