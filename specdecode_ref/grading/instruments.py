"""Instruments the lab tests build on their side and the student side rebuilds on its own: a
draft model whose acceptance is scripted. Kept in the package (not in a grading file) because
both sides must construct exactly the same object from its description."""
from __future__ import annotations


def script_draft(model, full: list, wrong) -> None:
    """Turn a transformers causal LM into a draft that proposes ``full[pos]`` at every position
    except those in ``wrong`` (there it proposes the next token id): the acceptance length of
    every step is then known in advance. The model still runs, so its cache is real; only its
    logits are replaced, and a token's position is read from the cache length, so a draft cache
    that is off by a position drafts the wrong tokens. ``model.grading_script`` describes it."""
    import torch

    from specdecode_ref import kv

    base = type(model)
    vocab = int(model.config.vocab_size)

    class Scripted(base):
        def forward(self, input_ids=None, **kwargs):
            start = kv.cache_len(kwargs.get("past_key_values"))
            out = super().forward(input_ids=input_ids, **kwargs)
            n_in, n_out = input_ids.shape[1], out.logits.shape[1]
            logits = torch.full_like(out.logits, -10.0)
            for j in range(n_out):
                pos = start + n_in - n_out + j + 1  # the position this logit row predicts
                tok = self.full[pos] if pos < len(self.full) else 0
                if pos in self.wrong:
                    tok = (tok + 1) % vocab
                logits[0, j, tok] = 10.0
            out.logits = logits
            return out

    Scripted.__name__ = f"Scripted{base.__name__}"
    model.__class__ = Scripted
    model.full, model.wrong = [int(t) for t in full], {int(t) for t in wrong}
    model.grading_script = {"full": list(model.full), "wrong": sorted(model.wrong)}
