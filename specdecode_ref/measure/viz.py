"""Show a generation token by token: which tokens were accepted drafts, recovered, or bonus."""
from __future__ import annotations

import html

COLOURS = {  # background colours, readable in light and dark themes
    "target": "#e0e0e0",     # plain target token (prefill or a step with no draft)
    "accepted": "#a5d6a7",   # drafted and accepted
    "recovered": "#ffab91",  # a draft was rejected here; the target's own token
    "bonus": "#90caf9",      # every draft accepted; the target's extra token
}
LABELS = {"target": "target (no draft)", "accepted": "accepted draft",
          "recovered": "recovered after a rejection", "bonus": "bonus token"}


def token_strings(tokens, tokenizer) -> list:
    """Each token decoded alone (so spaces and newlines stay visible)."""
    ids = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
    return [tokenizer.decode([t]) for t in ids]


def tokens_html(result, tokenizer, title: str | None = None) -> str:
    """An HTML string: the generated tokens on coloured backgrounds, a legend and the stats."""
    pieces = []
    for text, kind in zip(token_strings(result.tokens, tokenizer), result.token_kinds):
        shown = html.escape(text).replace("\n", "↵<br>")
        pieces.append(f'<span title="{kind}" style="background:{COLOURS[kind]};color:#000;'
                      f'border-radius:3px;padding:0 1px;margin:0 1px 1px 0;white-space:pre-wrap">{shown}</span>')
    legend = " ".join(f'<span style="background:{c};color:#000;padding:0 4px;border-radius:3px">{LABELS[k]}</span>'
                      for k, c in COLOURS.items())
    s = result.stats
    head = f"<b>{html.escape(title)}</b><br>" if title else ""
    summary = (f"{s.new_tokens} tokens in {s.steps} verification steps; acceptance rate "
               f"{s.acceptance_rate:.2f}; τ = {s.mean_accepted_length:.2f} tokens/step")
    return (f'<div style="font-family:monospace;line-height:1.7">{head}{"".join(pieces)}'
            f'<div style="margin-top:6px;font-size:90%">{legend}<br>{summary}</div></div>')


def show_tokens(result, tokenizer, title: str | None = None):
    """Display the coloured view in a notebook (returns the IPython HTML object)."""
    from IPython.display import HTML

    return HTML(tokens_html(result, tokenizer, title))


_ANSI = {"target": "47", "accepted": "42", "recovered": "41", "bonus": "44"}


def tokens_ansi(result, tokenizer) -> str:
    """The same view for a terminal, with ANSI background colours."""
    parts = [f"\x1b[{_ANSI[k]};30m{t}\x1b[0m" for t, k in zip(token_strings(result.tokens, tokenizer), result.token_kinds)]
    return "".join(parts)
