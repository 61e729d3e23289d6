"""On the real embedded model (fp32): speculative output equals plain and Hugging Face decoding."""
import numpy as np
import pytest
import torch

from support import assert_law, chi2_pvalue, plant, twins
from specdecode_ref import SamplingParams, autoregressive_generate, chat_ids, generate, generate_batch
from specdecode_ref.proposers import load_proposer
from specdecode_ref.sampling import logits_to_probs
from specdecode_ref.measure.harness.workloads import load_workloads

CATEGORIES = ["summarization", "code", "qa", "rag_qa", "multi_turn"]


def prompts(per_category=2):
    wl = load_workloads(CATEGORIES, per_category=per_category)
    return [(c, p["id"], p["messages"]) for c in CATEGORIES for p in wl[c]]


def test_greedy_ngram_equals_plain_and_hf(embedded):
    model, tok = embedded
    # One prompt per category: every registered proposer's exactness on many prompts and paths is
    # tests/test_exactness_matrix.py's job; this test adds Hugging Face's own greedy decoding.
    # 24 tokens: prompt lookup drafts on every category by then (drafted > 0 below), and three
    # decoders' prefills dominate the time anyway.
    NEW = 24
    mismatches, drafted, cases = [], 0, prompts(per_category=1)
    assert len(cases) == len(CATEGORIES) and {c for c, _, _ in cases} == set(CATEGORIES)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    for category, pid, messages in cases:
        ids = chat_ids(tok, messages)
        plain = autoregressive_generate(model, ids, max_new_tokens=NEW, stop_on_eos=False)
        spec = generate(model, ids, proposer=load_proposer("ngram", model, k=5), max_new_tokens=NEW,
                        stop_on_eos=False)
        # Pass the attention mask: with pad == <|im_end|>, HF would otherwise infer one that masks
        # the chat template's own <|im_end|> tokens and shifts positions (a real pitfall).
        hf = model.generate(ids[None], attention_mask=torch.ones_like(ids[None]), max_new_tokens=NEW, do_sample=False, temperature=None, top_p=None,
                            top_k=None, eos_token_id=None, pad_token_id=eos)[0, ids.numel():]
        drafted += spec.stats.drafted
        assert len(plain.tokens) == NEW
        if not (spec.tokens.tolist() == plain.tokens.tolist() == hf.tolist()):
            mismatches.append(pid)
    assert not mismatches, f"outputs differ for {mismatches}"
    assert drafted > 0


@twins("resample_from_p")
def test_sampled_ngram_follows_target_on_real_prompt(embedded, bug, monkeypatch):
    """Joint law of the first two tokens (top-k 5): the second one goes through rejection sampling.
    (max_new_tokens=3: the engine never drafts tokens it could not emit, so with 2 it would not draft.)
    The draws come from one batch, row i seeded ``i``: a batch row draws exactly what ``generate``
    draws with that seed (checked here on a few rows, and in tests/test_batch.py), so this is the
    single-request engine's law, at a fifth of the cost of 250 separate calls (the prefill of every
    row dominates either way). The twin plants the classic bug (resample from p after a rejection)
    and must fail at the same size; it skips the row-by-row check against generate."""
    model, tok = embedded
    ids = torch.tensor(tok("one two three four five one two three four five one two three")["input_ids"])
    sampling = SamplingParams(temperature=1.0, top_k=5)
    with torch.no_grad():
        p1 = logits_to_probs(model(ids[None]).logits[0, -1], sampling)
        firsts = torch.nonzero(p1).squeeze(1)
        batch = torch.cat([ids.expand(len(firsts), -1), firsts[:, None]], 1)
        p2 = logits_to_probs(model(batch).logits[:, -1], sampling)
    joint = (p1[firsts, None] * p2).numpy()  # [n_first, V]
    index = {int(t): i for i, t in enumerate(firsts)}
    n = 250
    plant(monkeypatch, bug)
    results = generate_batch(model, [ids] * n, proposer=load_proposer("ngram", model, k=4), max_new_tokens=3,
                             sampling=sampling, seed=0)
    for seed in (0, 1, n - 1) if bug is None else ():
        alone = generate(model, ids, proposer=load_proposer("ngram", model, k=4), max_new_tokens=3,
                         sampling=sampling, seed=seed)
        assert alone.tokens.tolist() == results[seed].tokens.tolist(), f"row {seed}"
    counts = np.zeros_like(joint)
    for r in results:
        t1, t2 = r.tokens.tolist()[:2]
        counts[index[t1], t2] += 1
    drafted = sum(r.stats.drafted for r in results)
    accepted = sum(r.stats.accepted for r in results)
    assert drafted > 0 and 0 < accepted < drafted  # both acceptance and rejection happened
    assert_law(chi2_pvalue(counts, joint), bug)


def test_context_window_error_on_real_model(embedded):
    model, _ = embedded
    with pytest.raises(ValueError, match="context window of 8192"):
        generate(model, torch.zeros(8200, dtype=torch.long), max_new_tokens=4)
