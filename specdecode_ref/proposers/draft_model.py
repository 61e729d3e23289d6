"""The classic two-model proposer: a small causal LM drafts k tokens one at a time.

Leviathan et al. (2023) and Chen et al. (2023) introduced it; transformers calls it assisted
generation (``generation/candidate_generator.py``, ``AssistedCandidateGenerator``) and vLLM runs it
as the "draft_model" method (``vllm/v1/spec_decode``).

The draft keeps its own KV cache with the engine's invariant: it holds every committed token except
the last. ``propose`` feeds the tokens the cache has not seen, then drafts; ``on_verified`` crops the
cache back to the committed prefix -- the entries for accepted drafts stay, because the draft
computed them on exactly the tokens that were committed.

The embedded draft for SmolLM2-135M is four decoder layers initialised from the target's first four
layers, sharing the target's embeddings and (tied) lm_head, then distilled on the target's own
answers (``python -m specdecode_ref.training draft``). Only its layers and final norm are shipped.
(Of the initialisations tried -- layers 0-3, 0-2 + 29, 0-1 + 28-29, 0/10/20/29 -- the first four
layers start at the lowest held-out loss: 16.2 nats against 17.1-31.5 on the first corpus.)
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .. import decoder, kv
from ..ragged_cache import RaggedCache
from ..sampling import logits_to_probs
from .base import BatchProposer, DecodeState, Draft, Proposer, StepOutcome, resolve_draft_sampling, with_sizing
from .drafting import draft_chain
from .shipped import WEIGHTS_DIR, load_weights, require_embedded, require_file, save_weights, weights_metadata
from .vocab import VocabHead

DRAFT_WEIGHTS = WEIGHTS_DIR / "smollm2-135m-draft.safetensors"
DEFAULT_INIT_LAYERS = (0, 1, 2, 3)  # the target layers a draft starts from (lowest held-out loss after training)


def vocab_size_of(model) -> int:
    return int(model.get_input_embeddings().weight.shape[0])


def check_same_vocabulary(target, draft, what: str = "draft model", shared_tokens: int | None = None) -> None:
    """Speculative decoding compares token ids: both models must use the same vocabulary.

    Some families pad their embedding matrices to different sizes (Qwen2.5-0.5B has 151,936 rows,
    Qwen2.5-7B 152,064, for one tokenizer of 151,665 tokens). ``shared_tokens`` (e.g.
    ``len(tokenizer)``) says ids below it mean the same token in both; the rows above are padding
    that the proposer then never drafts.
    """
    vt, vd = vocab_size_of(target), vocab_size_of(draft)
    if shared_tokens is not None:
        if not 0 < shared_tokens <= min(vt, vd):
            raise ValueError(f"shared_tokens={shared_tokens} must be in [1, {min(vt, vd)}]: the target has "
                             f"{vt} embedding rows and the {what} {vd}")
        return
    ct, cd = getattr(target.config, "vocab_size", None), getattr(draft.config, "vocab_size", None)
    if ct == cd and vt == vd:
        return
    hint = ""
    if getattr(target.config, "model_type", None) == getattr(draft.config, "model_type", 0):
        hint = (" If both come from one model family whose embeddings are padded to different sizes "
                "(e.g. Qwen2.5-0.5B with Qwen2.5-7B), pass shared_tokens=len(tokenizer).")
    raise ValueError(
        f"the {what} has a vocabulary of {cd} tokens (embeddings {vd}) but the target has "
        f"{ct} (embeddings {vt}): draft and target must share one tokenizer. Pick a draft from the "
        f"same model family (e.g. SmolLM2-135M for SmolLM2-1.7B).{hint}")


def fit_logits(logits: torch.Tensor, target_size: int, shared_tokens: int | None) -> torch.Tensor:
    """The draft's logits over the target's ids: padding rows (ids >= shared_tokens) get -inf, and
    the vector is cropped or -inf-padded to the target's size, so q and p line up id for id."""
    if shared_tokens is None and logits.shape[-1] == target_size:
        return logits
    n = min(logits.shape[-1], target_size) if shared_tokens is None else shared_tokens
    out = logits.new_full((*logits.shape[:-1], target_size), float("-inf"))
    out[..., :n] = logits[..., :n]
    return out


def build_draft_model(target, init_layers=DEFAULT_INIT_LAYERS):
    """A small LlamaForCausalLM made of copies of the target's ``init_layers``, sharing the target's
    embeddings and lm_head (so it costs no extra vocabulary weights)."""
    init_layers = [int(i) for i in init_layers]
    n_target = decoder.num_layers(target)
    if not init_layers or any(i < 0 or i >= n_target for i in init_layers):
        raise ValueError(f"init_layers must be indices in [0, {n_target}), got {init_layers}")
    draft = decoder.model_from_layers(target, init_layers)  # each layer renumbered for the draft's cache
    draft.config.init_layers = init_layers
    return draft.eval()


def trainable_state(draft) -> dict:
    """The draft's own weights (layers and final norm), without the shared embeddings / lm_head."""
    return {k: v for k, v in draft.state_dict().items() if not decoder.is_shared_param(k)}


def save_draft(draft, path=DRAFT_WEIGHTS, meta: dict | None = None) -> Path:
    return save_weights(trainable_state(draft), path,
                        {**(meta or {}), "init_layers": json.dumps(list(draft.config.init_layers))})


def load_draft_model(target, path=DRAFT_WEIGHTS):
    """The shipped, distilled draft for the embedded target (on the target's device and dtype)."""
    require_embedded(target, "draft model")
    path = require_file(path, "draft")
    meta = weights_metadata(path)
    draft = build_draft_model(target, json.loads(meta["init_layers"]))
    param = next(target.parameters())
    missing, unexpected = draft.load_state_dict(load_weights(path, param), strict=False)
    missing = [m for m in missing if not decoder.is_shared_param(m)]
    if missing or unexpected:
        raise RuntimeError(f"{path} does not fit the draft: missing={missing} unexpected={unexpected}")
    draft.to(param.device).eval()
    draft.requires_grad_(False)
    return draft


class DraftModelProposer(Proposer):
    """Drafts ``k`` tokens with a separate causal LM that shares the target's vocabulary.

    draft_vocab: optional LongTensor of token ids; the draft then picks only among them, through a
    vocabulary projection restricted to those rows (see vocab.py). Needs a model with
    ``.model`` (the decoder) and an output embedding, as every transformers causal LM has.
    draft_sampling: "sample" (draw from q, return q) or "greedy" (argmax, q one-hot) when the
    request samples (base.DRAFT_SAMPLING).
    """

    name = "draft"

    def __init__(self, draft_model, k: int = 4, draft_vocab: torch.Tensor | None = None,
                 shared_tokens: int | None = None, draft_sampling: str = "sample"):
        super().__init__(k)
        self.draft_sampling = resolve_draft_sampling(draft_sampling, who="the draft model")
        self.model = draft_model
        self.cache = None
        self.head = None
        self.shared_tokens = shared_tokens
        self.target_size = vocab_size_of(draft_model)
        if draft_vocab is not None:
            if shared_tokens is not None and int(draft_vocab.max()) >= shared_tokens:
                raise ValueError(f"draft_vocab holds ids >= shared_tokens={shared_tokens} (padding rows)")
            self.head = VocabHead(draft_model.get_output_embeddings().weight, draft_vocab)

    def check_compatible(self, target) -> None:
        check_same_vocabulary(target, self.model, shared_tokens=self.shared_tokens)
        self.target_size = vocab_size_of(target)
        dt, dd = next(target.parameters()).device, next(self.model.parameters()).device
        if dt != dd:
            raise ValueError(f"the draft model is on {dd} but the target is on {dt}; move them to one device")

    def begin(self, state: DecodeState) -> None:
        self.cache = kv.new_cache(self.model)

    def _logits(self, ids: list) -> torch.Tensor:
        """Feed ``ids`` after the cached prefix; return the logits at the last one (draft vocab)."""
        x = torch.tensor([ids], dtype=torch.long, device=next(self.model.parameters()).device)
        if self.head is None:
            out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True, logits_to_keep=1)
            self.cache = out.past_key_values
            return fit_logits(out.logits[0, -1], self.target_size, self.shared_tokens)
        h, self.cache = decoder.last_hidden(self.model, x, cache=self.cache)
        return self.head.logits(h[0, -1])

    def propose(self, state: DecodeState) -> Draft:
        if self.cache is None:
            raise RuntimeError("propose() before begin(): the engine calls begin() once per request")
        pending = state.token_list[kv.cache_len(self.cache):]
        if self.shared_tokens is not None and max(pending) >= vocab_size_of(self.model):
            raise ValueError(f"the target produced id {max(pending)}, a row the draft's padded vocabulary "
                             f"({vocab_size_of(self.model)} rows) does not have")
        # Without a reduced vocabulary _logits already fits the target's size; with one, q is
        # scattered to the draft's full vocabulary and then fitted.
        return draft_chain(self.k, self._logits(pending), lambda tok, i: self._logits([tok]), state,
                           next(self.model.parameters()).device, self.head,
                           widen=lambda full: fit_logits(full, self.target_size, None),
                           draft_sampling=self.draft_sampling)

    def on_verified(self, state: DecodeState, outcome: StepOutcome) -> None:
        # The cache holds the committed prefix, the last committed token and the drafts fed so far.
        # Entries up to the last accepted draft are exactly what the committed tokens produce.
        committed_before = len(state.token_list) - len(outcome.emitted)
        keep = min(kv.cache_len(self.cache), committed_before + outcome.num_accepted)
        kv.crop_to(self.cache, keep)

    def batch_proposer(self):
        """All rows draft together: one draft forward per draft position (BatchedDraftModelProposer)."""
        return BatchedDraftModelProposer(self)

    def __repr__(self) -> str:
        vocab = "" if self.head is None else f", draft_vocab={self.head.size}"
        mode = "" if self.draft_sampling == "sample" else f", draft_sampling={self.draft_sampling!r}"
        return with_sizing(self, f"DraftModelProposer(k={self.k}, layers={self.model.config.num_hidden_layers}{vocab}{mode})")


class BatchedDraftModelProposer(BatchProposer):
    """A DraftModelProposer for many rows: one draft forward per draft position for all rows.

    Its cache keeps the engine's invariant per row (every committed token except the last): a
    step first feeds each row's pending tokens (1, or 2 after a fully accepted draft, or the whole
    prompt at the first step), left-padded, then k-1 single-token forwards; ``on_verified`` rolls
    each row back to its committed length minus one. Rows that join a running batch (``add_rows``,
    the scheduler) are prefilled in a forward of their own and their cache rows joined.

    A subclass drafts with another causal stack (early_exit.BatchedEarlyExitProposer: the target's
    first layers and the exit adapter) by overriding ``_new_cache`` and ``_last_logits``.
    """

    def __init__(self, proposer):
        super().__init__(proposer)
        self.cache = None
        self.head = proposer.head  # a VocabHead over the draft vocabulary, or None (the full vocabulary)

    def _new_cache(self, num_rows: int) -> RaggedCache:
        return RaggedCache(self.proposer.model, num_rows)

    def _last_logits(self, cache: RaggedCache, rows_ids: list) -> torch.Tensor:
        """Feed each row's ids after its cached prefix; the logits at each row's last id [B, V']."""
        p = self.proposer
        if p.head is None:
            out = cache.forward(rows_ids, logits_to_keep=1)
            return fit_logits(out.logits[:, -1], p.target_size, p.shared_tokens)
        out = cache.forward(rows_ids, module=p.model.model)
        return p.head.logits(out.last_hidden_state[:, -1])

    def _widen(self, full: torch.Tensor) -> torch.Tensor:
        return fit_logits(full, self.proposer.target_size, None)

    def _check_ids(self, pending: list) -> None:
        p = self.proposer
        if p.shared_tokens is not None:
            top = max(max(row) for row in pending)
            if top >= vocab_size_of(p.model):
                raise ValueError(f"the target produced id {top}, a row the draft's padded vocabulary "
                                 f"({vocab_size_of(p.model)} rows) does not have")

    def begin(self, states: list) -> None:
        self.cache = None
        self.add_rows(states)

    def add_rows(self, states: list) -> None:
        """New rows after the current ones. The first rows of a batch are prefilled lazily by the
        first ``propose`` (their whole prompt is pending); rows joining a running cache get their
        committed tokens but the last in a forward of their own, then join it (RaggedCache.join)."""
        if not states:
            return
        if self.cache is None or self.cache.num_rows == 0:
            self.cache = self._new_cache(len(states))
        elif self.cache.num_slots == 0:  # nobody has drafted yet: everyone is still pending
            self.cache = self._new_cache(self.cache.num_rows + len(states))
        else:
            new = self._new_cache(len(states))
            self._last_logits(new, [s.token_list[:-1] for s in states])
            self.cache.join(new)

    def _choose(self, logits: torch.Tensor, states: list):
        """The next draft token per row [B] and, when sampling, each row's q [B, V] (its own generator);
        the argmax and no q with draft_sampling="greedy" (drafting.choose_token's rule)."""
        sampling = states[0].sampling
        if sampling.is_greedy or self.proposer.draft_sampling == "greedy":
            index = logits.argmax(-1)
            return (index if self.head is None else self.head.to_token(index)), None
        full = logits if self.head is None else self._widen(self.head.full_logits(logits))
        q = logits_to_probs(full.float(), sampling)
        toks = [torch.multinomial(q[b], 1, generator=s.generator) for b, s in enumerate(states)]
        return torch.cat(toks), q

    def propose(self, states: list) -> list:
        if self.cache is None:
            raise RuntimeError("propose() before begin(): the engine calls begin() once per batch")
        pending = [s.token_list[length:] for s, length in zip(states, self.cache.lengths)]
        self._check_ids(pending)
        logits = self._last_logits(self.cache, pending)
        tokens, probs = [], []
        for i in range(self.k):
            tok, q = self._choose(logits, states)
            tokens.append(tok)
            if q is not None:
                probs.append(q)
            if i + 1 < self.k:
                logits = self._last_logits(self.cache, [[t] for t in tok.tolist()])
        tokens = torch.stack(tokens, dim=1).long()  # [B, k]
        probs = torch.stack(probs, dim=1) if probs else None  # [B, k, V]
        return [Draft(tokens[b], None if probs is None else probs[b]) for b in range(len(states))]

    def on_verified(self, states: list, outcomes: list) -> None:
        # Entries up to the last accepted draft are exactly what the committed tokens produce; the
        # invariant keeps every committed token but the last (a discarded draft emits nothing).
        self.cache.rollback([min(length, len(s.token_list) - 1) for s, length in zip(states, self.cache.lengths)])
        self.cache.maybe_compact()

    def keep_rows(self, rows: list) -> None:
        if not rows:
            self.cache = None
        else:
            self.cache.select_rows(rows)
