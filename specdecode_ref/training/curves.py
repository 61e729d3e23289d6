"""Is a drafter limited by its data? Held-out agreement against corpus size, as a plot.

The numbers come from training the same recipe on a growing share of the corpus' training prompts
(``python -m specdecode_ref.training --train-fraction F draft|eagle``) and are kept beside the
weights in ``learning-curves.json``. A curve still rising at its right edge says more data would
help more than a bigger drafter or more steps.
"""
from __future__ import annotations

import json
from pathlib import Path

LEARNING_CURVES = Path(__file__).resolve().parent.parent / "weights" / "learning-curves.json"


def load_learning_curves(path=LEARNING_CURVES) -> dict:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: it ships with the weights (specdecode_ref/weights/)")
    return json.loads(path.read_text())


def plot_learning_curves(path=LEARNING_CURVES, ax=None):
    """Held-out agreement of the draft model and the EAGLE head against answer tokens trained on
    (log scale). Returns the axes."""
    import matplotlib.pyplot as plt

    data = load_learning_curves(path)
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.4))
    total = data["answer_tokens_at_100"]
    for name, key, label, style in (("draft", "agreement", "draft model", "o-"),
                                    ("eagle", "agreement", "EAGLE head, 1st draft token", "s-"),
                                    ("eagle", "agreement_2", "EAGLE head, 2nd token (own features)", "s--")):
        if key in data.get(name, {}):
            ax.plot([f * total / 1e6 for f in data[name]["fraction"]], data[name][key], style, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("answer tokens trained on (millions, log scale)")
    ax.set_ylabel("held-out top-1 agreement")
    ax.set_title("More of the target's own text keeps helping", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    return ax


__all__ = ["LEARNING_CURVES", "load_learning_curves", "plot_learning_curves"]
