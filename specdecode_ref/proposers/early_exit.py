"""Self-speculative decoding: draft with the target's own first L layers and a small exit adapter.

The drafter is the target cut short: layers 0..L-1, then a trained *exit adapter* (one decoder
layer, initialised as a copy of the target's last layer), then the target's final norm and lm_head.
Without the adapter, the residual stream at layer L of SmolLM2 agrees with the final argmax only 4-13 %
of the time (notebook 06), which is why LayerSkip (Elhoushi et al., 2024) trains the model itself for
early exit; here the target stays frozen and only the adapter learns
(``python -m specdecode_ref.training early-exit``).

KV reuse (the LayerSkip idea). Draft and target share one KV cache. While drafting, layers 0..L-1
write the drafted tokens' keys and values into the target's own cache and the proposer keeps their
layer-L hidden states. Verification (``score``) then runs only layers L..N-1 for those positions,
starting from the saved hidden states: the first L layers are never recomputed for a drafted token.
This is exact because the draft's layers 0..L-1 *are* the target's, fed the same tokens. With
``reuse_kv=False`` the drafted entries are cropped and verification recomputes layers 0..L-1 for
every scored position, through the same layer loop: notebook 06 measures what reuse saves. The adapter's own attention keeps a one-layer cache with the same
invariant as the target's (every committed token except the last).

Counterparts: LayerSkip's self-speculation (facebookresearch/LayerSkip, ``self_speculation/``);
transformers' ``assistant_early_exit`` (``EarlyExitCandidateGenerator``), which shares weights but
not the cache.
"""
from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import torch

from .. import decoder, kv
from ..decoder import run_layers
from ..masks import causal_mask
from ..ragged_cache import RaggedCache
from .base import DecodeState, Draft, Proposer, StepOutcome, resolve_draft_sampling, with_sizing
from .draft_model import BatchedDraftModelProposer
from .drafting import draft_chain
from .shipped import (WEIGHTS_DIR, load_weights, require_embedded, require_file, require_same_target, save_weights,
                      weights_metadata)
from .vocab import VocabHead

EXIT_WEIGHTS = WEIGHTS_DIR / "smollm2-135m-exit-adapters.safetensors"


class ExitAdapter(torch.nn.Module):
    """One decoder layer plus a final norm, mapping the residual stream at the exit layer to
    something the target's lm_head can read. Its attention has its own one-layer KV cache."""

    def __init__(self, layer: torch.nn.Module, norm: torch.nn.Module, exit_layer: int):
        super().__init__()
        self.layer = layer
        self.layer.self_attn.layer_idx = 0
        self.norm = norm
        self.exit_layer = int(exit_layer)

    def forward(self, hidden, positions, mask, target, cache=None):
        """hidden [B, q, H] (the residual stream entering the exit layer), positions [B, q] -> the
        normed state [B, q, H] the target's lm_head reads."""
        rope = decoder.rotary(target, hidden, positions)
        return self.norm(decoder.run_layer(self.layer, hidden, positions, rope, cache, mask))


def build_adapter(target, exit_layer: int) -> ExitAdapter:
    """An adapter initialised from the target's last layer and final norm (both copied)."""
    decoder.require_llama_style(target, "early exit")
    n = decoder.num_layers(target)
    if not 1 <= exit_layer < n:
        raise ValueError(f"exit_layer must be in [1, {n - 1}] for a {n}-layer target, got {exit_layer}")
    return ExitAdapter(decoder.copy_layer(target, n - 1), decoder.copy_final_norm(target), exit_layer)


def save_adapters(adapters: dict, path=EXIT_WEIGHTS, meta: dict | None = None):
    state = {f"exit{L}.{k}": v for L, a in adapters.items() for k, v in a.state_dict().items()}
    return save_weights(state, path, {**(meta or {}), "exits": json.dumps(sorted(int(L) for L in adapters))})


def shipped_exits(path=EXIT_WEIGHTS) -> list:
    return json.loads(weights_metadata(path)["exits"])


def load_adapter(target, exit_layer: int | None = None, path=EXIT_WEIGHTS) -> ExitAdapter:
    """The shipped adapter for ``exit_layer`` (default: the first shipped one)."""
    require_embedded(target, "exit adapter")
    path = require_file(path, "early-exit")
    exits = shipped_exits(path)
    exit_layer = exits[0] if exit_layer is None else int(exit_layer)
    if exit_layer not in exits:
        raise ValueError(f"no shipped adapter for exit layer {exit_layer}; shipped: {exits}")
    adapter = build_adapter(target, exit_layer)
    prefix = f"exit{exit_layer}."
    param = next(target.parameters())
    state = {k[len(prefix):]: v for k, v in load_weights(path, param).items() if k.startswith(prefix)}
    adapter.load_state_dict(state)
    return adapter.to(param.device).eval().requires_grad_(False)


class EarlyExitProposer(Proposer):
    """Draft with the target's first ``adapter.exit_layer`` layers + the exit adapter.

    reuse_kv: verification skips layers 0..L-1 for drafted tokens (shared cache). draft_vocab: an
    optional frequency-ranked subset for the draft's vocabulary projection (vocab.py).
    draft_sampling: "sample" (draw from q, return q) or "greedy" (argmax, q one-hot) when the
    request samples (base.DRAFT_SAMPLING).
    """

    name = "early-exit"
    needs_hidden_states = True  # the prompt's layer-L states prefill the adapter's cache
    scores_draft = True  # the engine lets score() run the verification forward (KV reuse)

    def __init__(self, target, adapter: ExitAdapter, k: int = 3, draft_vocab=None, reuse_kv: bool = True,
                 draft_sampling: str = "sample"):
        super().__init__(k)
        self.draft_sampling = resolve_draft_sampling(draft_sampling, who="the early-exit drafter")
        self.target = target
        self.adapter = adapter
        self.L = adapter.exit_layer
        self.reuse_kv = reuse_kv
        self.head = VocabHead(target.get_output_embeddings().weight, draft_vocab)
        self.cache = None
        self.adapter_cache = None
        self._h = []  # layer-L hidden states of the tokens drafted this step: last committed, d1, ...
        self._scored_h = (0, None)  # (first position, layer-L states) of the last verification forward

    def check_compatible(self, target) -> None:
        require_same_target(self.target, target, "an EarlyExitProposer drafts with the layers of the target it "
                            "was built for; pass that same model to generate()")
        decoder.require_llama_style(target, "early exit")

    @property
    def _device(self):
        return next(self.target.parameters()).device

    def begin(self, state: DecodeState) -> None:
        if state.target_cache is None or state.prompt_hidden_states is None:
            raise RuntimeError("EarlyExitProposer needs the engine's shared cache and the prompt's hidden states")
        self.cache = state.target_cache
        self.adapter_cache = kv.new_cache()
        h = state.prompt_hidden_states[self.L][None]  # [1, P, H]: the residual stream entering layer L
        P = h.shape[1]
        pos = torch.arange(P, device=self._device)[None]
        self.adapter(h, pos, causal_mask(P, 0, self._device), self.target, self.adapter_cache)
        self._h = []

    def _draft_step(self, token: int, position: int) -> torch.Tensor:
        """Token at ``position`` through layers 0..L-1 (into the shared cache) and the adapter."""
        x = decoder.embed(self.target, torch.tensor([[token]], device=self._device))
        pos = torch.tensor([[position]], device=self._device)
        h = run_layers(self.target, x, pos, range(self.L), self.cache)
        self._h.append(h)
        out = self.adapter(h, pos, None, self.target, self.adapter_cache)
        return self.head.logits(out[0, -1])

    def propose(self, state: DecodeState) -> Draft:
        if self.cache is None:
            raise RuntimeError("propose() before begin()")
        n = len(state.token_list)
        self._h = []
        # Draft token i + 1 sits at position n + i: the last committed token is at n - 1.
        return draft_chain(self.k, self._draft_step(state.token_list[-1], n - 1),
                           lambda tok, i: self._draft_step(tok, n + i), state, self._device, self.head,
                           draft_sampling=self.draft_sampling)

    def score(self, state: DecodeState, ids: list):
        """The verification forward over ``ids`` = [last committed] + draft, in the shared cache.
        Returns the target's logits [len(ids), V]."""
        n = len(state.token_list)  # the cache holds n - 1 committed positions in layers L..N-1
        m = len(ids)
        early = range(self.L)
        pos = torch.arange(n - 1, n - 1 + m, device=self._device)[None]
        mask = causal_mask(m, n - 1, self._device) if m > 1 else None
        late = range(self.L, decoder.num_layers(self.target))
        if not self.reuse_kv or m > len(self._h) + 1:
            # Recompute layers 0..L-1 for every scored position, through the same layer loop as the
            # reuse path below: the two modes then differ only in that recomputation, which is what
            # notebook 06 times (the model's own forward would add a wrapper cost of its own).
            kv.crop_layers_to(self.cache, n - 1, early)
            h = run_layers(self.target, decoder.embed(self.target, torch.tensor([ids], device=self._device)), pos,
                           early, self.cache, mask)
            self._scored_h = (n - 1, h)
            return decoder.logits_from_residual(self.target, run_layers(self.target, h, pos, late, self.cache, mask))[0]
        # Layers 0..L-1 already hold the last committed token and d1..d_{k-1}; keep what is scored.
        have = min(m, len(self._h))
        kv.crop_layers_to(self.cache, n - 1 + have, early)
        hs = self._h[:have]
        if m > have:  # the last draft token never went through the early layers
            x = decoder.embed(self.target, torch.tensor([[ids[-1]]], device=self._device))
            hs.append(run_layers(self.target, x, torch.tensor([[n - 1 + have]], device=self._device), early,
                                 self.cache))
        h = torch.cat(hs, dim=1)
        self._scored_h = (n - 1, h)  # layer-L states of every scored position, for on_verified
        return decoder.logits_from_residual(self.target, run_layers(self.target, h, pos, late, self.cache, mask))[0]

    def on_verified(self, state: DecodeState, outcome: StepOutcome) -> None:
        committed_before = len(state.token_list) - len(outcome.emitted)
        keep = min(kv.cache_len(self.adapter_cache), committed_before + outcome.num_accepted)
        kv.crop_to(self.adapter_cache, keep)
        # When every draft was accepted, the last one never went through the adapter: catch up from
        # the layer-L states verification computed, so the adapter cache again holds every
        # committed token but the last.
        start, h = self._scored_h
        have, want = kv.cache_len(self.adapter_cache), len(state.token_list) - 1
        if have < want and start <= have and want <= start + h.shape[1]:
            pos = torch.arange(have, want, device=self._device)[None]
            self.adapter(h[:, have - start: want - start], pos, causal_mask(want - have, have, self._device),
                         self.target, self.adapter_cache)
        self._h = []

    def batch_proposer(self) -> "BatchedEarlyExitProposer":
        """All rows draft together through layers 0..L-1 and the adapter (BatchedEarlyExitProposer)."""
        return BatchedEarlyExitProposer(self)

    def __repr__(self) -> str:
        return with_sizing(self, (f"EarlyExitProposer(k={self.k}, exit_layer={self.L}, reuse_kv={self.reuse_kv}, "
                f"draft_vocab={self.head.size})"))


def layer_at(layer: torch.nn.Module, layer_idx: int) -> torch.nn.Module:
    """The decoder ``layer`` (same weights, nothing copied) reading and writing cache layer
    ``layer_idx``: the adapter keeps index 0 in its own one-layer cache, and index L when it
    follows the target's first L layers in one cache."""
    view = copy.copy(layer)
    view._modules = dict(layer._modules)
    attn = copy.copy(layer.self_attn)
    attn.layer_idx = layer_idx
    view._modules["self_attn"] = attn
    return view


class ExitDraftStack:
    """The early-exit drafter as one causal stack over a batch cache: the target's layers 0..L-1
    (cache layers 0..L-1), the adapter's layer (cache layer L) and its norm. Called like a
    transformers decoder by ragged_cache.RaggedCache.forward; returns the normed last states."""

    def __init__(self, proposer: EarlyExitProposer):
        self.target, self.L = proposer.target, proposer.L
        self.layer = layer_at(proposer.adapter.layer, proposer.L)
        self.norm = proposer.adapter.norm

    def __call__(self, input_ids, attention_mask, position_ids, past_key_values, use_cache=True):
        h = decoder.embed(self.target, input_ids)
        h = run_layers(self.target, h, position_ids, range(self.L), past_key_values, attention_mask)
        rope = decoder.rotary(self.target, h, position_ids)
        h = decoder.run_layer(self.layer, h, position_ids, rope, past_key_values, attention_mask)
        return SimpleNamespace(past_key_values=past_key_values, last_hidden_state=self.norm(h))


class BatchedEarlyExitProposer(BatchedDraftModelProposer):
    """Early exit for many rows: one draft forward per draft position through the target's first
    L layers and the adapter, for all rows, in a padded cache of its own (ragged_cache.RaggedCache).

    The drafted tokens are those ``EarlyExitProposer`` drafts for each request alone; what a batch
    gives up is the KV reuse: the shared cache of one request becomes the batch's target cache,
    whose rows the verification forward fills for all layers, so the first L layers run again for
    the drafted tokens (the cost ``reuse_kv=False`` measures in notebook 06).
    """

    def __init__(self, proposer: EarlyExitProposer):
        super().__init__(proposer)
        self.stack = ExitDraftStack(proposer)

    def _new_cache(self, num_rows: int) -> RaggedCache:
        return RaggedCache(self.proposer.target, num_rows)

    def _last_logits(self, cache: RaggedCache, rows_ids: list) -> torch.Tensor:
        out = cache.forward(rows_ids, module=self.stack)
        return self.head.logits(out.last_hidden_state[:, -1])

    def _widen(self, full: torch.Tensor) -> torch.Tensor:
        return full  # the exit head projects onto the target's own vocabulary

    def _check_ids(self, pending: list) -> None:
        pass  # the target's own embeddings read every id it produces
