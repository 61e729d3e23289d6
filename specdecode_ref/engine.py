"""The draft-verify-rollback loop, and plain autoregressive decoding through the same code path.

Invariant: the target's KV cache holds every committed token except the last one. ``generate``
repeats one step of four parts until EOS or max_new_tokens:

1. propose: the proposer drafts up to k tokens (a chain) or a tree (``_propose``);
2. score: one target forward over the last committed token plus the draft, k+1 positions;
3. verify: keep a prefix of the draft (a root-to-node path of a tree) and add one target token,
   then roll the target cache back to the committed length minus one (``_chain_step`` crops it,
   ``_tree_step`` compacts it to the accepted path);
4. commit: append the emitted tokens, stop at EOS or max_new_tokens, count them in SpecStats and
   let the proposer roll back its own state (``_Request.commit``).

Plain decoding is the same step with an empty draft, so ``autoregressive_generate`` and
``generate`` share every line that touches the target. A tree draft (trees.py) is scored with a
tree attention mask and depth-based position ids.

Counterparts: transformers ``generation/utils.py`` (``_assisted_decoding``), vLLM
``vllm/v1/spec_decode`` with ``vllm/v1/sample/rejection_sampler.py``.
"""
from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field

import torch

from . import kv, trees
from .metrics import SpecStats
from .proposers.base import DecodeState, Draft, Proposer, StepOutcome
from .sampling import GREEDY, SamplingParams, logits_to_probs, next_token
from .verify import greedy_verify, rejection_sample, tree_greedy_verify, tree_rejection_sample, typical_accept

# How each new token came to be (measure/viz.py colours them).
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


def check_positive_int(value, name: str) -> int:
    """``value`` as an int if it is a whole number >= 1 (numpy ints too; a bool or a float is not),
    else a ValueError naming ``name``."""
    number = as_int(value)
    if number is None or number < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return number


def as_int(value) -> int | None:
    """``value`` as an int if it is one (numpy ints too), else None: a bool, a float (even 2.0) or a
    string is not, so that nothing is silently rounded or parsed."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_seed(value, name: str = "seed") -> int:
    """``value`` as an int seed (None means 0); anything else a ValueError naming ``name``."""
    seed = 0 if value is None else as_int(value)
    if seed is None:
        raise ValueError(f"{name} must be an int, got {value!r}")
    return seed


def as_prompt(input_ids) -> torch.Tensor:
    """The checks a prompt needs without a model: 1-D (or [1, L]), not empty, integer token ids
    (a list of floats is refused, not truncated). Returns a 1-D LongTensor."""
    if not isinstance(input_ids, torch.Tensor):
        try:
            input_ids = torch.as_tensor(input_ids)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"input_ids must be a 1-D tensor or list of integer token ids, "
                            f"got {type(input_ids).__name__}") from None
    if input_ids.dim() == 2:
        if input_ids.shape[0] != 1:
            raise ValueError(f"input_ids must be 1-D (or [1, L]), got a batch of {input_ids.shape[0]} rows: generate() "
                             "decodes one request at a time (generate_batch takes a list of prompts)")
        input_ids = input_ids[0]
    if input_ids.dim() != 1:
        raise ValueError(f"input_ids must be 1-D (or [1, L]), got shape {tuple(input_ids.shape)}")
    if input_ids.numel() == 0:
        raise ValueError("the prompt is empty: generation needs at least one input token (got an empty prompt)")
    if input_ids.dtype in (torch.uint8, torch.int8):
        raise ValueError(f"input_ids are {input_ids.dtype}, too narrow for token ids (a vocabulary of thousands "
                         "wraps around in it before the ids reach here); pass int64 (torch.long) token ids")
    if input_ids.dtype not in (torch.long, torch.int, torch.int32, torch.int16):
        raise ValueError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    return input_ids.long()


def _validate(model, input_ids, max_new_tokens):
    input_ids = as_prompt(input_ids)
    check_positive_int(max_new_tokens, "max_new_tokens")
    vocab = model.get_input_embeddings().weight.shape[0]
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        raise ValueError(f"token ids must lie in [0, {vocab}); got min {int(input_ids.min())}, "
                         f"max {int(input_ids.max())}")
    window = context_window(model)
    if window is not None and input_ids.numel() + max_new_tokens > window:
        raise ValueError(
            f"prompt of {input_ids.numel()} tokens + max_new_tokens={max_new_tokens} exceeds the model's "
            f"context window of {window} tokens; shorten the prompt or ask for fewer tokens")
    return input_ids


def _to_device(ids, device) -> torch.Tensor:
    """Token ids (a list or tensor) as a LongTensor on ``device``. A Python list copied straight to
    a GPU is a synchronous copy: the host waits for every kernel queued before it. Through pinned
    memory the copy is queued like a kernel, so a step syncs only where the engine reads a token."""
    if isinstance(ids, torch.Tensor) or device.type != "cuda":
        return torch.as_tensor(ids, dtype=torch.long, device=device)
    return torch.tensor(ids, dtype=torch.long).pin_memory().to(device, non_blocking=True)


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
        """Score ``ids`` [n] after the cached prefix; returns (logits [n or 1, V], hidden states:
        per layer [n, H], or None).

        attention_mask / position_ids: a custom 4D mask [1, 1, n, past + n] and the matching
        positions [1, n] (tree drafts, see trees.py); None lets the model build the ordinary causal ones.
        """
        t0 = time.perf_counter()
        x = _to_device(ids, self.device).reshape(1, -1)
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


@dataclass
class _Verdict:
    """What verification decided in one step, before EOS and max_new_tokens cut it."""

    emitted: list  # the accepted drafted tokens, then one token from the target
    num_accepted: int
    kinds: list  # ACCEPTED per accepted draft, then TARGET / RECOVERED / BONUS
    hidden: tuple | None  # per layer [num_accepted + 1, H]: the target at the root and the accepted tokens
    accepted_nodes: list | None = None  # tree drafts: the accepted path, root side first


def _last_kind(num_drafted: int, ends_at_leaf: bool) -> str:
    """The step's own token: plain decoding (nothing drafted), a bonus (the whole chain, or a
    root-to-leaf path, was accepted: nothing was left to reject) or a recovered token."""
    return TARGET if num_drafted == 0 else (BONUS if ends_at_leaf else RECOVERED)


def _chain_step(target: _Target, state: DecodeState, draft: Draft, sampling: SamplingParams, generator,
                scorer) -> _Verdict:
    """Score [last committed] + a chain of n >= 0 drafted tokens, verify, crop the target cache.
    n = 0 is plain decoding: the target's next token alone."""
    n, committed = len(draft), len(state.token_list)
    ids = [state.token_list[-1]] + draft.tokens.tolist()
    # Score: the n+1 positions in one forward, or by the proposer's own scorer (early exit).
    logits, hidden = target.forward(ids) if scorer is None else target.score_with(scorer, state, ids)
    # Verify: the accepted prefix, then one target token (recovered, or a bonus if all passed).
    if n == 0:
        emitted, num_accepted = [int(next_token(logits[-1], sampling, generator))], 0
    else:
        draft_tokens = draft.tokens.to(target.device).long()[None]
        if sampling.is_greedy:
            out, acc = greedy_verify(logits[None], draft_tokens)
        else:
            q = None if draft.probs is None else draft.probs[None]
            out, acc = rejection_sample(logits_to_probs(logits, sampling)[None], draft_tokens, q, generator)
        num_accepted = int(acc[0])
        emitted = out[0, : num_accepted + 1].tolist()
    # Roll the target cache back to the committed prefix (minus the newest token).
    kv.crop_to(target.cache, committed + num_accepted)
    hidden = None if hidden is None else tuple(h[: num_accepted + 1] for h in hidden)
    kinds = [ACCEPTED] * num_accepted + [_last_kind(n, num_accepted == n)]
    accepted_nodes = [] if draft.is_tree else None  # a tree the token budget clipped to nothing
    return _Verdict(emitted, num_accepted, kinds, hidden, accepted_nodes)


def _tree_step(target: _Target, state: DecodeState, draft: Draft, sampling: SamplingParams, generator,
               tree_acceptance: str) -> _Verdict:
    """Score [last committed] + a tree of n >= 1 nodes in one forward with a tree attention mask,
    verify, compact the target cache to the committed prefix plus the accepted path."""
    device, parents = target.device, draft.parents  # parents validated on the CPU by _clip_tree_draft
    past_len = kv.cache_len(target.cache)  # the committed tokens except the last one (the root)
    dtype = target.model.get_input_embeddings().weight.dtype
    tokens = draft.tokens.to(device).long()
    # Score: every node sees the prefix, the root and its own ancestors, at position past_len + depth.
    mask = trees.tree_attention_mask(parents, past_len, dtype=dtype, device=device)
    position_ids = trees.tree_position_ids(parents, past_len, device=device)
    logits, hidden = target.forward([state.token_list[-1]] + tokens.tolist(), attention_mask=mask,
                                    position_ids=position_ids)
    # Verify: the accepted root-to-node path, then one target token.
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
    ends_at_leaf = not bool((parents == last_slot - 1).any())
    kinds = [ACCEPTED] * len(path) + [_last_kind(len(draft), ends_at_leaf)]
    return _Verdict(emitted.tolist(), len(path), kinds, hidden, path)


def _clip_tree_draft(draft: Draft, max_depth: int) -> Draft:
    """Drop tree nodes deeper than ``max_depth`` (they could not be emitted)."""
    parents = trees.validate_parents(draft.parents, len(draft))
    new_parents, keep = trees.clip_tree(parents, max_depth=max(max_depth, 0))
    if keep.numel() == len(draft):
        return Draft(draft.tokens, draft.probs, parents)
    keep_dev = keep.to(draft.tokens.device)
    probs = None if draft.probs is None else draft.probs[keep.to(draft.probs.device)]
    return Draft(draft.tokens[keep_dev], probs, new_parents)


def _propose(proposer: Proposer | None, state: DecodeState, request: "_Request", device,
             tree_acceptance: str) -> Draft:
    """The proposer's draft, checked, and cut to what this step could still emit."""
    if proposer is None:
        return Draft.empty(device)
    draft = request.timed(proposer.propose, state)
    _check_draft(proposer, draft)
    if tree_acceptance == "typical" and not state.sampling.is_greedy and not draft.is_tree and len(draft) > 0:
        draft = Draft(draft.tokens, draft.probs, trees.chain_parents(len(draft)))
    limit = request.draft_limit()
    if draft.is_tree:
        return _clip_tree_draft(draft, limit)
    if len(draft) > limit:
        return Draft(draft.tokens[:limit], None if draft.probs is None else draft.probs[:limit])
    return draft


class _Request:
    """The bookkeeping of one request, in one place: the new tokens and how each came to be,
    EOS and max_new_tokens, SpecStats, and what the proposer is told after every step."""

    def __init__(self, state: DecodeState, proposer: Proposer | None, max_new_tokens: int, eos: set, window):
        self.state, self.proposer = state, proposer
        self.max_new_tokens, self.eos, self.window = max_new_tokens, eos, window
        self.tokens: list = []
        self.kinds: list = []
        self.finish = "length"
        self.stats = SpecStats()

    @property
    def done(self) -> bool:
        return self.finish == "eos" or len(self.tokens) >= self.max_new_tokens

    def draft_limit(self) -> int:
        """The most drafted tokens (tree depth) that could still be emitted: one token of the
        step is the target's, and neither max_new_tokens nor the context window may be passed."""
        limit = self.max_new_tokens - len(self.tokens) - 1
        if self.window is not None:
            limit = min(limit, self.window - len(self.state.token_list))
        return limit

    def timed(self, fn, *args):
        """Call a proposer hook, charging its time to the draft."""
        t0 = time.perf_counter()
        out = fn(*args)
        self.stats.draft_time_s += time.perf_counter() - t0
        return out

    def append(self, tokens: list, kinds: list) -> list:
        """Commit ``tokens``: at most max_new_tokens in all, and nothing after the first EOS
        (which is kept). Returns what was committed."""
        tokens = tokens[: self.max_new_tokens - len(self.tokens)]
        for i, tok in enumerate(tokens):
            if tok in self.eos:
                tokens = tokens[: i + 1]
                self.finish = "eos"
                break
        self.tokens.extend(tokens)
        self.kinds.extend(kinds[: len(tokens)])
        self.state.token_list.extend(tokens)
        return tokens

    def commit(self, draft: Draft, verdict: _Verdict) -> None:
        """Commit one verification step and let the proposer roll its own state back."""
        emitted = self.append(verdict.emitted, verdict.kinds)
        self.stats.record_step(len(draft), verdict.num_accepted, len(emitted))
        if self.proposer is not None:
            outcome = StepOutcome(draft, verdict.num_accepted, emitted, verdict.hidden, verdict.accepted_nodes)
            self.timed(self.proposer.on_verified, self.state, outcome)

    def result(self, target: _Target, wall_time_s: float) -> GenerationResult:
        self.stats.wall_time_s = wall_time_s
        self.stats.target_forwards = target.forwards
        self.stats.target_time_s = target.time_s
        self.stats.new_tokens = len(self.tokens)
        return GenerationResult(torch.tensor(self.tokens, dtype=torch.long), self.stats, self.kinds, self.finish)


def _check_draft(proposer: Proposer, draft: Draft) -> None:
    """A proposer's draft keeps its promises: at most k tokens, and q (if any) for each of them."""
    if len(draft) > proposer.k:
        raise ValueError(f"{proposer!r} drafted {len(draft)} tokens, more than its k={proposer.k}")
    if draft.probs is not None and draft.probs.shape[0] != len(draft):
        raise ValueError(f"draft probs cover {draft.probs.shape[0]} positions for {len(draft)} tokens")


def _check_sampling_and_proposer(model, sampling, proposer) -> SamplingParams:
    """Clear errors for the settings a request shares with a batch; returns the SamplingParams."""
    sampling = GREEDY if sampling is None else sampling
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    sampling.check()  # again: fields changed after construction would otherwise fail deep inside torch
    if proposer is not None and not isinstance(proposer, Proposer):
        raise TypeError(f"proposer must be a specdecode_ref.proposers.Proposer, got {type(proposer).__name__}")
    if proposer is not None:
        proposer.check_compatible(model)
    return sampling


def _check_arguments(model, input_ids, proposer, max_new_tokens, sampling, tree_acceptance):
    """Clear errors for bad input; returns (sampling, the prompt as a 1-D LongTensor)."""
    if tree_acceptance not in TREE_ACCEPTANCE:
        raise ValueError(f"tree_acceptance must be one of {TREE_ACCEPTANCE}, got {tree_acceptance!r}")
    sampling = _check_sampling_and_proposer(model, sampling, proposer)
    return sampling, _validate(model, input_ids, max_new_tokens)


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
    sampling, prompt = _check_arguments(model, input_ids, proposer, max_new_tokens, sampling, tree_acceptance)
    seed = check_seed(seed)
    device = next(model.parameters()).device
    generator = None
    if not sampling.is_greedy:  # one generator per request, never reseeded per draw
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
    target = _Target(model, want_hidden=proposer is not None and proposer.needs_hidden_states)
    state = DecodeState(target=model, sampling=sampling, generator=generator, prompt_len=prompt.numel(),
                        token_list=prompt.tolist())
    eos = set(eos_token_ids(model, eos_token_id)) if stop_on_eos else set()
    request = _Request(state, proposer, max_new_tokens, eos, context_window(model))
    scorer = proposer.score if proposer is not None and proposer.scores_draft else None

    _sync(device)
    t_start = time.perf_counter()
    # Prefill: the whole prompt; its last position gives the first new token.
    logits, state.prompt_hidden_states = target.forward(prompt, last_only=True)
    request.stats.prefill_time_s = target.time_s
    request.append([int(next_token(logits[-1], sampling, generator))], [TARGET])
    state.target_cache = target.cache
    if proposer is not None:
        request.timed(proposer.begin, state)

    while not request.done:
        # 1. Propose: up to k tokens (a chain) or a tree, cut to what could still be emitted.
        draft = _propose(proposer, state, request, device, tree_acceptance)
        # 2. Score the last committed token plus the draft in one target forward, 3. verify, and
        #    roll the target cache back to what verification kept.
        if draft.is_tree and len(draft) > 0:
            verdict = _tree_step(target, state, draft, sampling, generator, tree_acceptance)
        else:
            verdict = _chain_step(target, state, draft, sampling, generator, scorer)
        # 4. Commit the emitted tokens (up to EOS and max_new_tokens); the proposer rolls back.
        request.commit(draft, verdict)

    _sync(device)
    return request.result(target, time.perf_counter() - t_start)


def autoregressive_generate(model, input_ids, max_new_tokens: int = 128,
                            sampling: SamplingParams | None = None, seed: int | None = 0,
                            eos_token_id=None, stop_on_eos: bool = True) -> GenerationResult:
    """Plain decoding, one target forward per token: the baseline every proposer must match."""
    return generate(model, input_ids, proposer=None, max_new_tokens=max_new_tokens, sampling=sampling,
                    seed=seed, eos_token_id=eos_token_id, stop_on_eos=stop_on_eos)
