"""Self-distillation data: the target's own answers to the training prompts, with its distributions.

A drafter is useful only if it predicts what *this* target will say, so every drafter in the course
learns from the target's own responses (Medusa-1, EAGLE and LayerSkip all train on self-distilled or
target-generated text for the same reason). Building the corpus has two passes:

1. **Generate** answers to the training prompts (``data/train_prompts.json``, disjoint from the
   benchmark suite) in batches: on a CPU a batch of 32 costs little more per step than a batch of
   1, so a batch makes ~15x more tokens per second than one request.
2. **Teacher pass**: one forward over each prompt+answer gives, at every answer position, the
   target's top-k next-token log-probabilities (the KL target; the full 49k-way distribution would
   not fit on disk) and, optionally, its last hidden state (the feature EAGLE and Medusa read).

The corpus is cached under ``models.cache_dir()/distill`` and rebuilt with
``python -m specdecode_ref.training data``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import decoder
from ..models import cache_dir
from .recipes import CORPUS

CORPUS_VERSION = 1


@dataclass
class Corpus:
    """Prompt+response sequences with the target's top-k distribution at each response position.

    ids[i]: LongTensor [T] (prompt then response). start[i]: index of the first response token.
    topk_ids[i], topk_logp[i]: [T - start, K] -- the target's top-k next-token ids and
    log-probabilities for predicting ids[start:], i.e. read at positions start-1 .. T-2.
    hidden[i]: the target's last (normed) hidden state [T, H] in bf16, or None.
    fused[i]: the target's hidden states entering the layers ``meta["fused_layers"]`` (low, middle,
    high: EAGLE-3's fused feature, decoder.fused_hidden) concatenated, [T, 3H] in bf16, or None.
    """

    ids: list
    start: list
    topk_ids: list
    topk_logp: list
    hidden: list | None = None
    meta: dict = field(default_factory=dict)
    fused: list | None = None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def num_response_tokens(self) -> int:
        return sum(int(t.numel()) - s for t, s in zip(self.ids, self.start))

    @property
    def num_tokens(self) -> int:
        return sum(int(t.numel()) for t in self.ids)

    def split(self, holdout_fraction: float = CORPUS.holdout_fraction, seed: int = 0):
        """(train, holdout) by sequence, reproducibly."""
        g = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(self), generator=g).tolist()
        n_hold = max(1, int(round(holdout_fraction * len(self))))
        hold, train = sorted(order[:n_hold]), sorted(order[n_hold:])
        return self.subset(train), self.subset(hold)

    def subset(self, indices) -> "Corpus":
        pick = lambda xs: None if xs is None else [xs[i] for i in indices]  # noqa: E731
        return Corpus(pick(self.ids), pick(self.start), pick(self.topk_ids), pick(self.topk_logp),
                      pick(self.hidden), dict(self.meta), pick(self.fused))

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({"version": CORPUS_VERSION, "ids": self.ids, "start": self.start, "topk_ids": self.topk_ids,
                    "topk_logp": self.topk_logp, "hidden": self.hidden, "meta": self.meta, "fused": self.fused}, tmp)
        tmp.rename(path)
        return path

    @staticmethod
    def load(path) -> "Corpus":
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no distillation corpus at {path}; build it with "
                                    "`python -m specdecode_ref.training data` (about 10 minutes on a 2-core CPU)")
        d = torch.load(path, weights_only=False)
        if d.get("version") != CORPUS_VERSION:
            raise ValueError(f"{path} was built by another version of distill.py; rebuild it")
        # "fused" is optional: corpora saved before it existed load with fused=None
        return Corpus(d["ids"], d["start"], d["topk_ids"], d["topk_logp"], d["hidden"], d["meta"], d.get("fused"))


#: The committed token ids of the course's corpus (``save_token_ids``); the teacher pass rebuilds the rest.
DEFAULT_IDS_PATH = Path(__file__).resolve().parent.parent / "data" / "distill_ids.npz"


def default_corpus_path(name: str = "smollm2-135m-instruct") -> Path:
    return cache_dir() / "distill" / f"{name}.pt"


def _eos_ids(model, tokenizer) -> set:
    from ..engine import eos_token_ids

    ids = set(eos_token_ids(model))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


@torch.inference_mode()
def generate_responses(model, tokenizer, conversations, max_new_tokens: int = CORPUS.max_new_tokens,
                       batch_size: int = CORPUS.batch_size, temperature: float = 0.0, max_prompt_tokens: int = 384,
                       seed: int = 0, desc: str = "generating", top_p: float = 1.0) -> list:
    """The target's answers to ``conversations`` (lists of chat messages), generated in batches.

    Returns a list of (prompt_ids, response_ids) LongTensor pairs; a response ends at the first EOS
    (kept) or after ``max_new_tokens``. temperature 0 is greedy; > 0 samples (seeded), from the
    top-p nucleus when ``top_p`` < 1 (what a served drafter faces at that setting).
    """
    from ..models import chat_ids

    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError("batch_size and max_new_tokens must be >= 1")
    prompts = [chat_ids(tokenizer, conv)[-max_prompt_tokens:] for conv in conversations]
    order = sorted(range(len(prompts)), key=lambda i: prompts[i].numel())  # similar lengths pad less
    eos = _eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    device = next(model.parameters()).device
    results: list = [None] * len(prompts)
    torch.manual_seed(seed)
    bar = tqdm(total=len(prompts), desc=desc, unit="prompt")
    for b in range(0, len(order), batch_size):
        idx = order[b: b + batch_size]
        width = max(prompts[i].numel() for i in idx)
        input_ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):  # left padding: every prompt ends at the same column
            p = prompts[i]
            input_ids[row, width - p.numel():] = p
            mask[row, width - p.numel():] = 1
        kwargs = dict(do_sample=temperature > 0, max_new_tokens=max_new_tokens, pad_token_id=pad,
                      eos_token_id=sorted(eos))
        if temperature > 0:
            kwargs.update(temperature=temperature, top_k=0, top_p=top_p)
        else:
            kwargs.update(temperature=None, top_k=None, top_p=None)
        out = model.generate(input_ids=input_ids.to(device), attention_mask=mask.to(device), **kwargs)
        for row, i in enumerate(idx):
            resp = out[row, width:].cpu().tolist()
            for j, t in enumerate(resp):
                if t in eos:
                    resp = resp[: j + 1]
                    break
            results[i] = (prompts[i].clone(), torch.tensor(resp, dtype=torch.long))
        bar.update(len(idx))
    bar.close()
    return results


@torch.inference_mode()
def teacher_pass(model, pairs, top_k: int = CORPUS.top_k, keep_hidden: bool = True, batch_tokens: int = 2048,
                 desc: str = "teacher pass", fused_layers=()) -> Corpus:
    """Score each prompt+response once with the target: top-k log-probs at response positions and,
    if ``keep_hidden``, the last hidden state at every position; with ``fused_layers`` (entries of the
    hidden-states tuple, e.g. (2, 15, 27)) also their concatenation (``Corpus.fused``, what a fused
    EAGLE-3-style head reads), from the same forward."""
    device = next(model.parameters()).device
    seqs = [(torch.cat([p, r]), p.numel()) for p, r in pairs if r.numel() > 0]
    order = sorted(range(len(seqs)), key=lambda i: seqs[i][0].numel())
    n = len(seqs)
    ids_out, start_out = [None] * n, [None] * n
    tk_ids, tk_logp = [None] * n, [None] * n
    hidden = [None] * n if keep_hidden else None
    fused_layers = tuple(int(i) for i in fused_layers)
    fused = [None] * n if fused_layers else None
    bar = tqdm(total=sum(s[0].numel() for s in seqs), desc=desc, unit="tok", unit_scale=True)
    i = 0
    while i < n:
        width = seqs[order[i]][0].numel()
        j = i
        while j < n and (j - i + 1) * max(width, seqs[order[j]][0].numel()) <= max(batch_tokens, width):
            width = max(width, seqs[order[j]][0].numel())
            j += 1
        idx = order[i:j]
        x = torch.zeros((len(idx), width), dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, k in enumerate(idx):  # right padding: positions start at 0 for every row
            s = seqs[k][0]
            x[row, : s.numel()] = s
            mask[row, : s.numel()] = 1
        h, f = decoder.hidden_states_at(model, x.to(device), mask.to(device), fused_layers)
        for row, k in enumerate(idx):
            s, st = seqs[k]
            T = s.numel()
            logits = decoder.lm_head(model, h[row, st - 1: T - 1]).float()
            logp = torch.log_softmax(logits, dim=-1)
            v, t = logp.topk(top_k, dim=-1)
            ids_out[k], start_out[k] = s, st
            tk_ids[k], tk_logp[k] = t.to(torch.int32).cpu(), v.to(torch.float16).cpu()
            if keep_hidden:
                hidden[k] = h[row, :T].to(torch.bfloat16).cpu()
            if fused_layers:
                fused[k] = f[row, :T].to(torch.bfloat16).cpu()
        bar.update(sum(seqs[k][0].numel() for k in idx))
        i = j
    bar.close()
    meta = {"top_k": top_k, **({"fused_layers": list(fused_layers)} if fused_layers else {})}
    return Corpus(ids_out, start_out, tk_ids, tk_logp, hidden, meta, fused)


def build_corpus(model, tokenizer, conversations, *, max_new_tokens: int = CORPUS.max_new_tokens,
                 batch_size: int = CORPUS.batch_size, temperatures=CORPUS.temperatures, top_k: int = CORPUS.top_k,
                 keep_hidden: bool = True, seed: int = 0, checkpoint_dir=None) -> Corpus:
    """Generate answers at each temperature (greedy answers are what greedy drafting faces; sampled
    ones add variety), then run the teacher pass over all of them.

    checkpoint_dir: where each temperature's answers are saved as soon as they exist and reused on a
    later call with the same settings, so an interrupted run (the generation is most of its half
    hour) resumes at the pass it stopped in.
    """
    t0 = time.perf_counter()
    pairs = []
    for n, temp in enumerate(temperatures):
        ckpt = None
        if checkpoint_dir is not None:
            ckpt = Path(checkpoint_dir) / (f"answers-T{temp:g}-seed{seed + n}-n{len(conversations)}"
                                           f"-max{max_new_tokens}.pt")
        if ckpt is not None and ckpt.exists():
            part = torch.load(ckpt)
            print(f"answers (T={temp:g}): {len(part)} reused from {ckpt}")
        else:
            part = generate_responses(model, tokenizer, conversations, max_new_tokens=max_new_tokens,
                                      batch_size=batch_size, temperature=temp, seed=seed + n,
                                      desc=f"answers (T={temp:g})")
            if ckpt is not None:
                ckpt.parent.mkdir(parents=True, exist_ok=True)
                torch.save(part, ckpt)
        pairs += part
    t_gen = time.perf_counter() - t0
    corpus = teacher_pass(model, pairs, top_k=top_k, keep_hidden=keep_hidden)
    corpus.meta.update({
        "num_conversations": len(conversations), "temperatures": list(temperatures),
        "max_new_tokens": max_new_tokens, "generate_s": round(t_gen, 1),
        "total_s": round(time.perf_counter() - t0, 1), "dtype": str(next(model.parameters()).dtype),
        "response_tokens": corpus.num_response_tokens, "tokens": corpus.num_tokens,
    })
    return corpus


def token_counts(corpus: Corpus, vocab_size: int) -> torch.Tensor:
    """How often each id appears as a response token (for a frequency-ranked draft vocabulary)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, st in zip(corpus.ids, corpus.start):
        counts += torch.bincount(ids[st:], minlength=vocab_size)[:vocab_size]
    return counts


def iterate_batches(corpus: Corpus, batch_tokens: int, generator: torch.Generator):
    """Yield lists of sequence indices of similar length (about ``batch_tokens`` tokens each),
    in a random order of batches: one epoch."""
    order = sorted(range(len(corpus)), key=lambda i: corpus.ids[i].numel())
    batches, cur, width = [], [], 0
    for i in order:
        w = max(width, corpus.ids[i].numel())
        if cur and w * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, w = [], corpus.ids[i].numel()
        cur.append(i)
        width = w
    if cur:
        batches.append(cur)
    perm = torch.randperm(len(batches), generator=generator).tolist()
    for p in perm:
        yield batches[p]


def pad_batch(corpus: Corpus, idx: list):
    """Right-padded ids [B, W], attention mask [B, W], and the response targets flattened:
    (row, position) of every prediction, the target's top-k ids and probabilities there."""
    width = max(corpus.ids[i].numel() for i in idx)
    x = torch.zeros((len(idx), width), dtype=torch.long)
    mask = torch.zeros((len(idx), width), dtype=torch.long)
    rows, cols, t_ids, t_logp = [], [], [], []
    for r, i in enumerate(idx):
        s, st = corpus.ids[i], corpus.start[i]
        x[r, : s.numel()] = s
        mask[r, : s.numel()] = 1
        n = s.numel() - st
        rows.append(torch.full((n,), r, dtype=torch.long))
        cols.append(torch.arange(st - 1, s.numel() - 1))
        t_ids.append(corpus.topk_ids[i].long())
        t_logp.append(corpus.topk_logp[i].float())
    return x, mask, torch.cat(rows), torch.cat(cols), torch.cat(t_ids), torch.cat(t_logp)


def soft_cross_entropy(draft_logits: torch.Tensor, topk_ids: torch.Tensor, topk_logp: torch.Tensor):
    """KL(target || draft) up to a constant, on the target's top-k renormalised: the draft learns
    the target's whole (head of the) distribution, not only its argmax -- what sampling needs."""
    logq = torch.log_softmax(draft_logits.float(), dim=-1)
    p = torch.softmax(topk_logp, dim=-1)
    return -(p * logq.gather(-1, topk_ids)).sum(-1).mean()


def agreement(draft_logits: torch.Tensor, topk_ids: torch.Tensor) -> float:
    """Share of positions where the draft's argmax equals the target's (greedy acceptance proxy)."""
    return float((draft_logits.argmax(-1) == topk_ids[:, 0]).float().mean())


def log_every(step: int, total: int) -> bool:
    return step == total or step % max(1, total // 100) == 0


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def run_plan(model, tokenizer, conversations, plan, *, max_new_tokens: int = CORPUS.max_new_tokens,
             batch_size: int = CORPUS.batch_size, max_prompt_tokens: int = 768, checkpoint_dir=None) -> dict:
    """Generate every pass of a corpus plan (``corpus_plan.FULL_PLAN``): the target's answers to the
    training prompts, then to the follow-up and reuse chats built from earlier passes' answers.

    Returns ``{"pairs": [(prompt_ids, response_ids)], "groups": [base prompt index],
    "passes": [pass index], "seconds": {pass name: s}}``. ``groups`` lets a held-out split keep all
    answers to one training prompt on the same side. checkpoint_dir: each pass is saved as soon as
    it exists and reused by a later call, so an interrupted build resumes at the pass it stopped in.
    """
    from . import corpus_plan

    corpus_plan.check_plan(plan)
    done: dict = {}  # pass name -> (chats, groups, pairs)
    pairs, groups, passes, seconds = [], [], [], {}
    base_groups = list(range(len(conversations)))
    for k, p in enumerate(plan):
        if p.source == "base":
            chats, grp = conversations, base_groups
        else:
            src_chats, src_groups, src_pairs = done[p.from_pass]
            texts = [tokenizer.decode(r.tolist(), skip_special_tokens=True).strip() for _, r in src_pairs]
            if p.source == "follow_up":
                chats, grp = corpus_plan.follow_up_chats(src_chats, texts, seed=p.seed), list(src_groups)
            else:
                keep = [i for i, t in enumerate(texts) if len(t) >= 200]
                chats = corpus_plan.reuse_chats([texts[i] for i in keep], seed=p.seed)
                grp = [src_groups[i] for i in keep]
        ckpt = None
        if checkpoint_dir is not None:
            ckpt = Path(checkpoint_dir) / (f"pass-{p.name}-T{p.temperature:g}-p{p.top_p:g}-seed{p.seed}"
                                           f"-n{len(chats)}-max{max_new_tokens}.pt")
        t0 = time.perf_counter()
        if ckpt is not None and ckpt.exists():
            part = torch.load(ckpt)
            print(f"pass {p.name}: {len(part)} answers reused from {ckpt}")
        else:
            part = generate_responses(model, tokenizer, chats, max_new_tokens=max_new_tokens, batch_size=batch_size,
                                      temperature=p.temperature, top_p=p.top_p, seed=p.seed,
                                      max_prompt_tokens=max_prompt_tokens,
                                      desc=f"pass {k + 1}/{len(plan)}: {p.name}")
            if ckpt is not None:
                ckpt.parent.mkdir(parents=True, exist_ok=True)
                torch.save(part, ckpt)
        seconds[p.name] = round(time.perf_counter() - t0, 1)
        done[p.name] = (chats, grp, part)
        pairs += part
        groups += grp
        passes += [k] * len(part)
    return {"pairs": pairs, "groups": groups, "passes": passes, "seconds": seconds}


def save_token_ids(path, pairs, groups, passes, meta: dict | None = None) -> Path:
    """The corpus as token ids only (no distributions, no features): small enough to commit, and all
    that retraining needs, since the teacher pass rebuilds the rest in minutes.

    Stored compressed (numpy ``savez_compressed``): ids as uint16 (the vocabulary has 49,152 ids),
    each sequence's length and answer start, its base-prompt group and its pass index.
    """
    import json

    import numpy as np

    path = Path(path)
    seqs = [torch.cat([p, r]) for p, r in pairs]
    if seqs and max(int(s.max()) for s in seqs) >= 2 ** 16:
        raise ValueError("token ids do not fit in uint16")
    np.savez_compressed(path, tokens=np.concatenate([s.numpy() for s in seqs]).astype(np.uint16),
                        lengths=np.array([s.numel() for s in seqs], dtype=np.int32),
                        starts=np.array([p.numel() for p, _ in pairs], dtype=np.int32),
                        groups=np.array(groups, dtype=np.int32), passes=np.array(passes, dtype=np.int16),
                        meta=np.array(json.dumps(meta or {})))
    return path


def load_token_ids(path) -> dict:
    """What ``save_token_ids`` wrote: ``{"pairs", "groups", "passes", "meta"}``."""
    import json

    import numpy as np

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no token-id corpus at {path}; build one with "
                                "`python -m specdecode_ref.training data --generate`")
    d = np.load(path)
    tokens = torch.from_numpy(d["tokens"].astype(np.int64))
    ends = np.cumsum(d["lengths"])
    pairs = []
    for end, n, st in zip(ends, d["lengths"], d["starts"]):
        seq = tokens[end - n: end]
        pairs.append((seq[:st].clone(), seq[st:].clone()))
    return {"pairs": pairs, "groups": d["groups"].tolist(), "passes": d["passes"].tolist(),
            "meta": json.loads(str(d["meta"]))}


def split_by_group(groups: list, holdout_fraction: float = CORPUS.holdout_fraction, seed: int = 0):
    """(train, held-out) sequence indices such that all answers to one base prompt fall on the same
    side: with several answers per prompt, a random split by sequence would score the drafter on
    prompts it was trained on."""
    g = torch.Generator().manual_seed(seed)
    names = sorted(set(groups))
    order = torch.randperm(len(names), generator=g).tolist()
    n_hold = max(1, int(round(holdout_fraction * len(names))))
    hold = {names[i] for i in order[:n_hold]}
    train = [i for i, x in enumerate(groups) if x not in hold]
    held = [i for i, x in enumerate(groups) if x in hold]
    return train, held
