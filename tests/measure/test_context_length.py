"""Acceptance against context length: the prompts grow only before the same request, the Wilson
interval is right, and a short run on the real model yields exact outputs and sane counters."""
from __future__ import annotations

import numpy as np
import pytest

from specdecode_ref.measure import context_length as C
from specdecode_ref.measure.harness.intervals import wilson


def test_contexts_grow_before_the_same_request(embedded):
    _, tok = embedded
    cases = C.long_context_prompts(tok, (0, 2, 5))
    lengths = [c["context_tokens"] for c in cases]
    assert lengths == sorted(lengths) and lengths[-1] > 4 * lengths[0]
    tails = [tok.decode(c["ids"][-120:]) for c in cases]
    summ, _ = C._passages()
    assert all(summ[0][-60:] in t for t in tails)  # the last document is the target passage every time
    assert "Summarize Document 1 " in tok.decode(cases[0]["ids"]) and "Summarize Document 6 " in tok.decode(cases[2]["ids"])
    with pytest.raises(ValueError, match="n_docs entries"):
        C.long_context_prompts(tok, (-1,))
    with pytest.raises(ValueError, match="target must index"):
        C.long_context_prompts(tok, (0,), target=99)


def test_a_short_run_is_exact_and_counts_drafts(embedded):
    model, tok = embedded
    df = C.acceptance_by_context(model, tok, ["ngram"], n_docs=(0, 1), targets=(0,), max_new_tokens=6, progress=False)
    assert len(df) == 2 and df.identical.all()
    assert (df.first_kept <= df.drafts).all() and (df.accepted <= df.drafted).all()
    table = C.summarize(df)
    assert list(table.n_docs) == [0, 1] and table.tau.ge(1.0).all()


def synthetic_rows(first_by_target_and_n: dict, drafts: int = 40):
    """Rows as acceptance_by_context writes them, one drafter, given first-position rates."""
    import pandas as pd

    rows = []
    for (t, n), rate in first_by_target_and_n.items():
        kept = int(round(rate * drafts))
        rows.append({"drafter": "d", "target": t, "n_docs": n, "context_tokens": 300 + 1000 * n, "drafts": drafts,
                     "first_kept": kept, "accepted": kept, "drafted": drafts, "steps": drafts, "emitted": drafts + kept,
                     "accepted_lengths": [1] * kept + [0] * (drafts - kept), "draft_lengths": [1] * drafts,
                     "identical": True})
    return pd.DataFrame(rows)


def test_intervals_resample_passages_not_steps():
    """Passages that differ a lot from one another make a wide interval however many steps each
    has; a decay every passage shows is resolved, one that half of them contradict is not."""
    spread = synthetic_rows({(t, n): (0.2 if t % 2 else 0.8) - 0.1 * (n > 0) for t in range(6) for n in (0, 3)})
    table = C.summarize(spread, n_boot=400)
    row = table[table.n_docs == 0].iloc[0]
    lo, hi = wilson(int(row.first_rate * row.drafts), int(row.drafts))
    assert row.first_hi - row.first_lo > 1.5 * (hi - lo)  # a step-level interval would be too narrow
    d = C.decay(spread, n_boot=400).iloc[0]
    assert d.first_rate_change == pytest.approx(-0.1, abs=0.02) and d.first_rate_hi < 0
    mixed = synthetic_rows({(t, n): 0.5 + (0.1 if t % 2 else -0.1) * (n > 0) for t in range(6) for n in (0, 3)})
    d = C.decay(mixed, n_boot=400).iloc[0]
    assert d.first_rate_lo < 0 < d.first_rate_hi and d.first_rate_sd == pytest.approx(0.1095, abs=1e-3)
    # to see a 5-point change through a spread of 0.11 takes about (2.8 * 0.11 / 0.05)^2 = 38 passages
    assert 35 <= C.passages_needed(d.first_rate_sd, 0.05) <= 40
    two = synthetic_rows({(t, n): 0.5 - 0.1 * (n > 0) for t in range(2) for n in (0, 3)})
    assert np.isnan(C.decay(two).iloc[0].first_rate_lo)  # two passages: no interval
