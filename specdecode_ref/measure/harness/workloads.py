"""The benchmark's chat prompts: 7 workload categories x 8 prompts (``data/workloads.json``).

Speculative decoding pays off very differently by workload. Input-grounded tasks (summarise,
answer from a passage, rewrite, edit code) repeat spans of the prompt, which n-gram / prompt
lookup drafting copies for free; open-ended chat, QA and maths do not. Benchmarks therefore report
per category, never one averaged number.

    from specdecode_ref.measure.harness.workloads import load_workloads
    wl = load_workloads(["summarization", "qa"], per_category=2)
    wl["qa"][0]["messages"]     # a chat: list of {"role", "content"}; feed it to chat_ids()

Two more prompt sets in the same categories share no text with the benchmark:
``load_training_prompts`` (``data/train_prompts.json``, the drafters' self-distillation prompts)
and ``load_heldout`` (``data/heldout.json``, 6 prompts per category). The held-out set is kept
apart from everything tuned on the benchmark prompts (default K values, tree shapes, the
per-prompt router trained on benchmark timings) and from drafter training, so results on it are
reported separately, as held-out figures, never pooled with the benchmark's.
"""
from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path

WORKLOADS_PATH = Path(__file__).resolve().parents[2] / "data" / "workloads.json"
#: Training prompts for self-distilling drafters: same 7 categories, disjoint from the benchmark.
#: Regenerate with ``python specdecode_ref/data/make_train_prompts.py``.
TRAIN_PROMPTS_PATH = Path(__file__).resolve().parents[2] / "data" / "train_prompts.json"
#: A stream of requests that repeat each other's outputs (suffix decoding, notebook 11).
#: Regenerate with ``python specdecode_ref/data/make_repeating_prompts.py``.
REPEATING_PATH = Path(__file__).resolve().parents[2] / "data" / "repeating.json"
#: Held-out prompts: same 7 categories, 6 each, disjoint from the benchmark and the training prompts;
#: nothing is tuned or trained on them. Regenerate with ``python specdecode_ref/data/make_heldout_prompts.py``.
HELDOUT_PATH = Path(__file__).resolve().parents[2] / "data" / "heldout.json"


def _load_categories(path, remedy: str) -> dict:
    """A prompts file: JSON with a non-empty "categories" mapping (``remedy`` says how to get it)."""
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: {remedy}")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data.get("categories"), dict) or not data["categories"]:
        raise ValueError(f"{path} has no 'categories' mapping")
    return data


@lru_cache(maxsize=1)
def _raw() -> dict:
    return _load_categories(WORKLOADS_PATH, "the package was installed without its data files (reinstall "
                                            "specdecode_ref with package data)")


#: All categories, in the file's order.
CATEGORIES: list = list(_raw()["categories"])
#: Tasks whose answer copies spans of the prompt: where prompt lookup / n-gram drafting shines.
INPUT_GROUNDED: tuple = ("summarization", "rag_qa", "rewrite", "code")
#: Tasks whose answer is mostly new text: little to copy, acceptance depends on the drafter.
OPEN_ENDED: tuple = tuple(c for c in CATEGORIES if c not in INPUT_GROUNDED)


def _parse_categories(categories) -> list:
    if categories is None:
        return list(CATEGORIES)
    if isinstance(categories, str):
        categories = [c.strip() for c in categories.split(",") if c.strip()]
    categories = list(categories)
    if not categories:
        raise ValueError(f"no categories given; choose from {CATEGORIES}")
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown:
        raise ValueError(f"unknown workload categor{'y' if len(unknown) == 1 else 'ies'} "
                         f"{', '.join(map(repr, unknown))}; choose from {CATEGORIES}")
    return list(dict.fromkeys(categories))  # drop duplicates, keep order


def load_workloads(categories=None, per_category: int | None = None) -> dict:
    """Return ``{category: [prompt, ...]}``, each prompt a dict ``{"id", "messages"}``.

    categories: None for all, a list of names, or a comma-separated string ("qa,code").
    per_category: keep the first N prompts of each category (None = all 8), so small runs use
    the same prompts as full ones. The dicts are copies: editing them does not change the data.
    """
    return _select(_raw()["categories"], categories, per_category)


def _select(raw: dict, categories, per_category) -> dict:
    """Shared argument handling of ``load_workloads`` / ``load_training_prompts`` / ``load_heldout``."""
    names = _parse_categories(categories)
    if per_category is not None and (not isinstance(per_category, int) or isinstance(per_category, bool)
                                     or per_category < 1):
        raise ValueError(f"per_category must be an int >= 1 or None, got {per_category!r}")
    out = {}
    for name in names:
        if name not in raw:
            raise ValueError(f"category {name!r} is missing from the data file")
        items = raw[name] if per_category is None else raw[name][:per_category]
        out[name] = copy.deepcopy(items)
    return out


@lru_cache(maxsize=1)
def _raw_train() -> dict:
    return _load_categories(TRAIN_PROMPTS_PATH, "regenerate it with `python specdecode_ref/data/make_train_prompts.py` "
                                                "(or reinstall specdecode_ref with package data)")


def load_training_prompts(categories=None, per_category: int | None = None) -> dict:
    """Return the drafter-training prompts as ``{category: [prompt, ...]}`` (like ``load_workloads``).

    These are original prompts written for self-distillation (draft model, early exit, Medusa,
    EAGLE) and share no text with the benchmark prompts, so a trained drafter is never scored on
    prompts it has seen. ``categories`` / ``per_category`` behave exactly as in ``load_workloads``
    (about 100 prompts per category instead of 8). The dicts are copies.
    """
    return _select(_raw_train()["categories"], categories, per_category)


@lru_cache(maxsize=1)
def _raw_heldout() -> dict:
    return _load_categories(HELDOUT_PATH, "regenerate it with `python specdecode_ref/data/make_heldout_prompts.py` "
                                          "(or reinstall specdecode_ref with package data)")


def load_heldout(categories=None, per_category: int | None = None) -> dict:
    """Return the held-out prompts as ``{category: [prompt, ...]}`` (like ``load_workloads``).

    Original prompts in the benchmark's categories (6 per category, ids ``heldout-<category>-NN``)
    that share no text with the benchmark or the training prompts. Nothing is tuned on them (default
    K, tree shapes, the per-prompt router) and no drafter is trained on them: report results on them
    separately, as held-out figures. ``categories`` / ``per_category`` behave exactly as in
    ``load_workloads``. The dicts are copies.
    """
    return _select(_raw_heldout()["categories"], categories, per_category)


def training_conversations(categories=None, per_category: int | None = None, max_chars: int | None = None) -> list:
    """The training chats as a flat list of message lists, interleaving categories round-robin.

    Order: the 1st prompt of every category (in ``CATEGORIES`` order), then the 2nd of every
    category, and so on, skipping categories that have run out; so any prefix of the list is
    balanced across categories. Fixed order, no shuffling.

    max_chars: keep only chats whose messages add up to at most this many characters. A live
    training demo on a CPU wants short prompts: the teacher's prefill, not the answer, would
    otherwise take most of its time.
    """
    if max_chars is not None and (not isinstance(max_chars, int) or max_chars < 1):
        raise ValueError(f"max_chars must be a positive int or None, got {max_chars!r}")
    data = load_training_prompts(categories, per_category)
    if max_chars is not None:
        data = {cat: [it for it in items if sum(len(m["content"]) for m in it["messages"]) <= max_chars]
                for cat, items in data.items()}
    lists = list(data.values())
    out = []
    for i in range(max((len(v) for v in lists), default=0)):
        for items in lists:
            if i < len(items):
                out.append(items[i]["messages"])
    return out


__all__ = ["CATEGORIES", "INPUT_GROUNDED", "OPEN_ENDED", "WORKLOADS_PATH", "load_workloads",
           "TRAIN_PROMPTS_PATH", "load_training_prompts", "training_conversations", "HELDOUT_PATH",
           "load_heldout"]


def load_repeating(per_family: int | None = None, families=None) -> list:
    """The repeating stream in arrival order: a list of ``{"family", "messages"}``, the families
    interleaved (tool calls in one format, extraction into one JSON schema, SQL over one schema,
    edits of one function). per_family: keep the first n requests of each family."""
    if not REPEATING_PATH.exists():
        raise FileNotFoundError(f"{REPEATING_PATH} is missing: run python specdecode_ref/data/make_repeating_prompts.py")
    with open(REPEATING_PATH, encoding="utf-8") as f:
        data = json.load(f)
    known = data["families"]
    families = known if families is None else list(families)
    unknown = [x for x in families if x not in known]
    if unknown:
        raise ValueError(f"unknown families {unknown}; choose from {known}")
    if per_family is not None and (not isinstance(per_family, int) or per_family < 1):
        raise ValueError(f"per_family must be None or an int >= 1, got {per_family!r}")
    seen: dict = {}
    out = []
    for item in data["stream"]:
        f = item["family"]
        if f in families and (per_family is None or seen.get(f, 0) < per_family):
            seen[f] = seen.get(f, 0) + 1
            out.append(copy.deepcopy(item))
    return out
