"""The command line, ``python -m specdecode_ref.training {data,fused-features,draft,early-exit,medusa,eagle,parallel-draft}``.

Every option's default comes from recipes.py, and every run writes the recipe it used into the
weights' metadata, so the defaults reproduce the shipped files and a file says how it was made.
"""
from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import fields, replace
from pathlib import Path

import torch

from . import distill
from .distill import Corpus
from .draft import train_draft
from .eagle import train_eagle, write_eagle
from .early_exit import best_exit, train_early_exit
from .loop import combine_stages, save_curve
from .medusa import train_medusa
from .recipes import CORPUS, RECIPES

# Recipe fields whose option has a shorter, older name.
_FLAGS = {"num_heads": "--heads", "num_layers": "--layers"}
_HELP = {
    "init_layers": "target layers the draft starts from, comma-separated",
    "vocab_size": "size of the reduced draft vocabulary written beside the weights",
    "exits": "exit layers to train, comma-separated",
    "num_heads": "number of Medusa heads (head i predicts i+2 ahead)",
    "num_layers": "ResBlocks per head",
    "hydra": "train Hydra heads instead (head i also reads the bonus token and the tokens drafted before "
             "it; soft cross-entropy on the target's top-k); written to the Hydra file unless --out",
    "hydra_width": "Hydra only: bottleneck width of each head's MLP",
    "steps": "training steps (EAGLE: stage 1, teacher forcing)",
    "lr": "peak learning rate (AdamW, warm-up then cosine)",
    "batch_tokens": "tokens per batch (sequences are packed up to it)",
    "feature_weight": "weight of the smooth-L1 feature loss",
    "token_weight": "weight of the soft cross-entropy (EAGLE's paper: 0.1; 1.0 measured better here)",
    "unroll": "stage 2, training-time test: steps in which the head feeds on its own outputs (1 = no stage 2)",
    "unroll_steps": "stage 2 steps",
    "unroll_lr": "stage 2 learning rate",
    "positions": "K: positions one forward drafts (K - 1 mask tokens)",
    "keep": "conditional drop: share of positions trained at mask depth 1, 2, ... (comma-separated)",
    "rank": "rank of the update of every projection (shipped with the mask embedding)",
    "scale": "the update is scale * B @ A",
    "max_len": "train on sequences up to this many tokens (prompt + answer)",
    "features": "'final': EAGLE-1's head on the last normed hidden state; 'fused': EAGLE-3's head on the "
                "corpus' fused low/middle/high states (run fused-features first), tokens-only loss",
}


def _ints(text: str) -> tuple:
    return tuple(int(x) for x in text.split(","))


def _floats(text: str) -> tuple:
    return tuple(float(x) for x in text.split(","))


def _add_recipe_options(parser, recipe) -> None:
    """One option per recipe field (the seed is global), defaulting to the recipe's value."""
    for f in fields(recipe):
        if f.name == "seed":
            continue
        default = getattr(recipe, f.name)
        if isinstance(default, tuple):
            kind = _ints if all(isinstance(x, int) for x in default) else _floats
        else:
            kind = type(default)
        flag = _FLAGS.get(f.name, "--" + f.name.replace("_", "-"))
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        if isinstance(default, bool):  # a switch: given means True; a command whose recipe has it on keeps it
            if default:
                parser.set_defaults(**{f.name: True})
            else:
                parser.add_argument(flag, dest=f.name, action="store_true", help=_HELP.get(f.name, f.name))
            continue
        parser.add_argument(flag, dest=f.name, type=kind, default=default,
                            help=f"{_HELP.get(f.name, f.name.replace('_', ' '))} (default: {shown})")


def _recipe(args):
    """The recipe this run uses: the command's defaults with the options given."""
    base = RECIPES[args.cmd]
    return replace(base, seed=args.seed, **{f.name: getattr(args, f.name) for f in fields(base) if f.name != "seed"})


def load_target(dtype="fp32"):
    from ..models import load_model

    return load_model(dtype=dtype)


def _corpus(args):
    """The corpus split into (train, held-out): by base prompt when the corpus records it (every answer
    to one training prompt on the same side), else by sequence; ``--train-fraction`` keeps that share
    of the training prompts (the learning curves of notebooks 05 and 08)."""
    corpus = Corpus.load(args.corpus)
    groups = corpus.meta.get("groups")
    if groups and len(groups) == len(corpus):
        train_idx, hold_idx = distill.split_by_group(groups, CORPUS.holdout_fraction, seed=0)
        train, hold = corpus.subset(train_idx), corpus.subset(hold_idx)
        train_groups = [groups[i] for i in train_idx]
    else:
        train, hold = corpus.split(CORPUS.holdout_fraction, seed=0)
        train_groups = list(range(len(train)))
    fraction = getattr(args, "train_fraction", 1.0)
    if not 0 < fraction <= 1:
        raise SystemExit(f"--train-fraction must be in (0, 1], got {fraction}")
    if fraction < 1:
        names = sorted(set(train_groups))
        g = torch.Generator().manual_seed(args.seed)
        keep = {names[i] for i in torch.randperm(len(names), generator=g)[: max(1, round(fraction * len(names)))]}
        train = train.subset([i for i, x in enumerate(train_groups) if x in keep])
    print(f"corpus: {len(train)} train / {len(hold)} held-out sequences, "
          f"{train.num_response_tokens} answer tokens to learn from")
    return train, hold


def _common(r) -> dict:
    return dict(steps=r.steps, lr=r.lr, batch_tokens=r.batch_tokens, seed=r.seed)


def _start(args):
    """What every drafter's command begins with: its recipe, the corpus split, the fp32 target."""
    r = _recipe(args)
    train, hold = _corpus(args)
    target, tok = load_target("fp32")
    return r, train, hold, target, tok


def cmd_data(args) -> None:
    """The corpus in two steps: the target's answers as token ids (generated with ``--generate``,
    else read from the committed ids file), then the teacher pass that adds the target's top-k
    distributions and hidden states."""
    from ..measure.harness.workloads import training_conversations
    from .corpus_plan import PLANS

    target, tok = load_target(args.dtype)
    ids_path = Path(args.ids)
    if args.generate or not ids_path.exists():
        convs = training_conversations()
        if args.limit:
            convs = convs[: args.limit]
        ckpt = Path(args.corpus).with_suffix(".answers")  # per-pass answers, reused after an interruption
        t0 = time.perf_counter()
        built = distill.run_plan(target, tok, convs, PLANS[args.plan], max_new_tokens=args.max_new_tokens,
                                 batch_size=args.batch_size, checkpoint_dir=ckpt)
        meta = {"plan": args.plan, "passes": [p.name for p in PLANS[args.plan]], "pass_seconds": built["seconds"],
                "generate_s": round(time.perf_counter() - t0, 1), "num_conversations": len(convs),
                "max_new_tokens": args.max_new_tokens, "device": str(next(target.parameters()).device)}
        ids_path.parent.mkdir(parents=True, exist_ok=True)
        distill.save_token_ids(ids_path, built["pairs"], built["groups"], built["passes"], meta)
        print(f"wrote {ids_path} ({ids_path.stat().st_size / 1e6:.1f} MB)")
    saved = distill.load_token_ids(ids_path)
    keep = [i for i, (_, r) in enumerate(saved["pairs"]) if r.numel() > 0]
    keep, subset = _data_subset(saved, keep, args)
    layers = ()
    if args.fused:
        from ..proposers.eagle import eagle3_layers

        layers = eagle3_layers(target.config.num_hidden_layers)
    t0 = time.perf_counter()
    corpus = distill.teacher_pass(target, [saved["pairs"][i] for i in keep], batch_tokens=args.teacher_batch_tokens,
                                  keep_hidden=not args.no_hidden, fused_layers=layers)
    if layers:
        corpus.meta.update(fused_layers=list(layers), fused_dtype=str(next(target.parameters()).dtype))
    if subset:
        corpus.meta["subset"] = subset
    corpus.meta.update({**saved["meta"], "ids_file": ids_path.name, "teacher_s": round(time.perf_counter() - t0, 1),
                        "groups": [saved["groups"][i] for i in keep], "passes_of": [saved["passes"][i] for i in keep],
                        "response_tokens": corpus.num_response_tokens, "tokens": corpus.num_tokens,
                        "dtype": str(next(target.parameters()).dtype)})
    path = corpus.save(args.corpus)
    print(json.dumps({k: v for k, v in corpus.meta.items() if k not in ("groups", "passes_of")}, indent=1))
    print(f"wrote {path}")


FIRST_TURN_PASSES = ("greedy", "t07a", "t07b", "t07c", "t10a", "t10b")  # corpus_plan's first-turn answers


def _data_subset(saved: dict, keep: list, args) -> tuple:
    """``data --prompt-fraction F [--first-turn]``: the answers to a random share F of the training
    prompts (torch.randperm over the sorted prompt names, generator seeded with --subset-seed), and
    with --first-turn only the answers to the prompts themselves (short prompts: most of their tokens
    are answer tokens, so a CPU's teacher pass buys the most answers per second). Returns the kept
    indices and a description for the corpus' metadata ("" when everything is kept)."""
    if args.prompt_fraction >= 1 and not args.first_turn:
        return keep, ""
    if not 0 < args.prompt_fraction <= 1:
        raise SystemExit(f"--prompt-fraction must be in (0, 1], got {args.prompt_fraction}")
    names = sorted(set(saved["groups"]))
    g = torch.Generator().manual_seed(args.subset_seed)
    chosen = {names[i] for i in torch.randperm(len(names), generator=g)[: max(2, round(args.prompt_fraction * len(names)))]}
    passes = saved["meta"]["passes"]
    keep = [i for i in keep if saved["groups"][i] in chosen
            and (not args.first_turn or passes[saved["passes"][i]] in FIRST_TURN_PASSES)]
    what = f"{len(chosen)} of {len(names)} training prompts (seed {args.subset_seed})"
    return keep, what + (", first-turn answers only" if args.first_turn else "")


def cmd_fused_features(args) -> None:
    """Add EAGLE-3's fused features (Corpus.fused) to an existing corpus: one more teacher pass over its
    sequences, keeping everything else it holds (the answers are the expensive part)."""
    from ..proposers.eagle import eagle3_layers

    corpus = Corpus.load(args.corpus)
    target, _ = load_target(args.dtype)
    layers = args.layers or eagle3_layers(target.config.num_hidden_layers)
    pairs = [(ids[:st], ids[st:]) for ids, st in zip(corpus.ids, corpus.start)]
    scored = distill.teacher_pass(target, pairs, top_k=1, keep_hidden=False, fused_layers=layers,
                                  desc="fused features")
    if [s.numel() for s in scored.ids] != [s.numel() for s in corpus.ids]:
        raise RuntimeError("the rescored corpus does not line up with the stored one")
    corpus.fused = scored.fused
    corpus.meta.update(fused_layers=list(layers), fused_dtype=str(next(target.parameters()).dtype))
    path = corpus.save(args.out or args.corpus)
    gb = sum(f.numel() for f in corpus.fused) * 2 / 1e9
    print(f"wrote {path}: fused features of layers {list(layers)}, {gb:.2f} GB in bf16")


def cmd_draft(args) -> None:
    from ..proposers.draft_model import DRAFT_WEIGHTS, save_draft
    from ..proposers.shipped import DRAFT_VOCAB
    from ..proposers.vocab import frequent_tokens, save_vocab

    r, train, hold, target, tok = _start(args)
    draft, result = train_draft(target, train, init_layers=r.init_layers, holdout=hold, **_common(r))
    out = Path(args.out or DRAFT_WEIGHTS)
    meta = {**r.settings(), "seconds": round(result.seconds),
            "heldout_agreement": result.heldout["after"]["agreement"],
            "heldout_agreement_before": result.heldout["before"]["agreement"]}
    save_draft(draft, out, meta)
    save_curve(result, out.with_name(out.stem + "-loss"), f"draft model distillation ({r.steps} steps)")
    # The frequency-ranked draft vocabulary, from the same corpus (answer tokens only).
    eos = [t for t in {tok.eos_token_id, tok.pad_token_id} if t is not None]
    vocab = frequent_tokens(distill.token_counts(train, target.config.vocab_size), r.vocab_size, always=eos)
    # Beside the weights: --out X must not overwrite the shipped vocabulary.
    vocab_path = DRAFT_VOCAB if args.out is None else out.with_name(out.stem + "-vocab.safetensors")
    save_vocab(vocab, vocab_path, {"size": len(vocab), "source": "answer-token counts of the distillation corpus"})
    print(json.dumps(result.heldout, indent=1))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) and {vocab_path.name}")


def cmd_early_exit(args) -> None:
    from ..proposers.early_exit import EXIT_WEIGHTS, save_adapters

    r, train, hold, target, _ = _start(args)
    exits = list(r.exits)
    adapters, result = train_early_exit(target, train, exits=exits, holdout=hold, **_common(r))
    out = Path(args.out or EXIT_WEIGHTS)
    if args.ship == "auto":
        ship = [best_exit(result.heldout, target.config.num_hidden_layers)]
    else:
        ship = [int(x) for x in args.ship.split(",")] if args.ship else exits
    settings = r.settings()
    settings["trained_exits"] = settings.pop("exits")  # "exits" names the shipped ones
    save_adapters({L: adapters[L] for L in ship}, out,
                  {**settings, "seconds": round(result.seconds), "heldout": json.dumps(result.heldout)})
    save_curve(result, out.with_name(out.stem + "-loss"),
               f"exit adapters {exits}: summed loss ({r.steps} steps)")
    print(json.dumps(result.heldout, indent=1))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) with exits {ship}")


def cmd_medusa(args) -> None:
    """Medusa heads, or with --hydra Hydra heads (written to their own file, so the shipped Medusa
    heads stay). The tree choices come from the held-out rank accuracies of the heads just trained."""
    from ..proposers.medusa import (DEFAULT_TREE_NODES, HYDRA_WEIGHTS, MEDUSA_WEIGHTS, derive_choices,
                                   expected_accepted, save_medusa_heads)

    r, train_c, hold, target, _ = _start(args)
    heads, result = train_medusa(target, train_c, num_heads=r.num_heads, num_layers=r.num_layers, holdout=hold,
                                 hydra=r.hydra, hydra_width=r.hydra_width, **_common(r))
    after = result.heldout["after"]
    acc = after["rank_accuracy"]
    budgets = sorted({4, DEFAULT_TREE_NODES, 16, 32})
    derived = {b: derive_choices(acc, b) for b in budgets}
    out = Path(args.out or (HYDRA_WEIGHTS if r.hydra else MEDUSA_WEIGHTS))
    settings = r.settings()
    if not r.hydra:
        settings.pop("hydra_width")
    meta = {**settings, "seconds": round(result.seconds),
            "rank_accuracy": acc, "top1": after["top1"], "top5": after["top5"],
            "top1_before": result.heldout["before"]["top1"], "heldout_loss": after["loss"],
            "choices": derived[DEFAULT_TREE_NODES]}
    save_medusa_heads(heads, out, meta, target)
    kind, loss = ("Hydra", "soft cross-entropy") if r.hydra else ("Medusa", "cross-entropy")
    save_curve(result, out.with_name(out.stem + "-loss"),
               f"{kind} heads ({r.num_heads}): summed {loss} ({r.steps} steps)")
    choices_path = out.with_name(out.stem + "-choices.json")
    choices_path.write_text(json.dumps(
        {str(b): {"choices": c, "expected_accepted": round(expected_accepted(acc, c), 4)} for b, c in derived.items()},
        indent=1))
    print(json.dumps({"top1": after["top1"], "top5": after["top5"], "before_top1": meta["top1_before"]}, indent=1))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB), its loss curve and {choices_path.name}")


def cmd_hydra(args) -> None:
    """``hydra`` is ``medusa --hydra`` with the shipped Hydra file's own recipe (more steps: its heads
    have about twice Medusa's parameters)."""
    cmd_medusa(args)


def cmd_eagle(args) -> None:
    """Stage 1: teacher forcing from the copy of the target's last layer (or --init). Stage 2 (when
    --unroll > 1 and --unroll-steps > 0): training-time test, fine-tuning the stage-1 head on its own
    outputs. The shipped head is both stages with the defaults. ``--features fused`` trains EAGLE-3's
    fused head (on the shipped draft vocabulary unless --draft-vocab says otherwise) into
    EAGLE3_WEIGHTS."""
    from ..proposers.eagle import EAGLE3_WEIGHTS, EAGLE_WEIGHTS
    from ..proposers.shipped import DRAFT_VOCAB
    from ..proposers.vocab import load_vocab

    if args.features not in ("final", "fused"):
        raise SystemExit(f"--features must be 'final' or 'fused', got {args.features!r}")
    fused = args.features == "fused"
    r, train_c, hold, target, _ = _start(args)
    vocab_file = None
    if fused and args.draft_vocab != "full":
        vocab_file = Path(args.draft_vocab or DRAFT_VOCAB)
    elif not fused and args.draft_vocab:
        raise SystemExit("--draft-vocab belongs to --features fused (an EAGLE-1 head drafts over the "
                         "proposer's vocabulary)")
    common = dict(batch_tokens=r.batch_tokens, seed=r.seed, holdout=hold, feature_weight=r.feature_weight,
                  token_weight=r.token_weight)
    head, result = train_eagle(target, train_c, steps=r.steps, lr=r.lr, init=args.init, features=r.features,
                               draft_vocab=None if vocab_file is None else load_vocab(vocab_file), **common)
    settings = {**r.settings(), "init": Path(args.init).name if args.init else "target's last layer"}
    if fused:
        settings["feature_weight"] = 0.0  # tokens only
        settings["draft_vocab"] = vocab_file.name if vocab_file is not None else "full"
    if r.unroll > 1 and r.unroll_steps > 0:
        # The same bf16 rounding a saved stage-1 file has, so a stage 2 run with --init on that file
        # starts from the very same weights.
        start = copy.deepcopy(head).to(torch.bfloat16).float()
        head, second = train_eagle(target, train_c, steps=r.unroll_steps, lr=r.unroll_lr, init=start,
                                   unroll=r.unroll, **common)
        result = combine_stages(result, second)
    else:
        settings["unroll"] = 1
        for key in ("unroll_steps", "unroll_lr"):
            settings.pop(key)
    out = Path(args.out or (EAGLE3_WEIGHTS if fused else EAGLE_WEIGHTS))
    write_eagle(head, result, out, settings)
    print(json.dumps(result.heldout, indent=1))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) and its loss curve")


def cmd_parallel_draft(args) -> None:
    """The parallel drafter from the shipped draft model, on the committed answers' token ids (no
    teacher pass: the labels are the answers' own next tokens). Writes the mask embedding and the
    low-rank factors, with the held-out agreement and rank accuracies per depth in the metadata."""
    from ..models import load_model
    from ..proposers.parallel_draft import PARD_WEIGHTS, save_parallel_draft
    from ..proposers.shipped import shipped_vocab
    from .parallel_draft import split_corpus, token_corpus, train_parallel_draft

    r = _recipe(args)
    train_c, hold = split_corpus(token_corpus(max_len=r.max_len), CORPUS.holdout_fraction)
    if args.train_fraction < 1:
        keep = train_c.meta["groups"]
        names = sorted(set(keep))
        g = torch.Generator().manual_seed(0)
        chosen = {names[i] for i in torch.randperm(len(names), generator=g)[: max(1, round(args.train_fraction * len(names)))]}
        idx = [i for i, x in enumerate(keep) if x in chosen]
        train_c = Corpus([train_c.ids[i] for i in idx], [train_c.start[i] for i in idx],
                         [train_c.topk_ids[i] for i in idx], [train_c.topk_logp[i] for i in idx], None,
                         {"groups": [keep[i] for i in idx], "passes_of": [train_c.meta["passes_of"][i] for i in idx]})
    print(f"corpus: {len(train_c)} train / {len(hold)} held-out sequences, "
          f"{train_c.num_response_tokens} answer tokens to train on")
    target, _ = load_model(dtype="fp32", backend="eager")
    draft, factors, mask, result = train_parallel_draft(
        target, train_c, shipped_vocab(True), holdout=hold, positions=r.positions, rank=r.rank, scale=r.scale,
        keep=r.keep, **_common(r))
    out = Path(args.out or PARD_WEIGHTS)
    after, before = result.heldout["after"], result.heldout["before"]
    meta = {**r.settings(), "seconds": round(result.seconds), "train_sequences": len(train_c),
            "agreement": after["agreement"], "agreement_before": before["agreement"],
            "rank_accuracy": after["rank_accuracy"], "heldout_loss": after["loss"], "heldout_entries": after["entries"]}
    save_parallel_draft(factors, mask, r.positions, r.scale, out, meta)
    save_curve(result, out.with_name(out.stem + "-loss"),
               f"parallel drafter, K = {r.positions}, rank {r.rank} ({r.steps} steps)", ylabel="cross-entropy (nats)")
    print(json.dumps({"agreement": after["agreement"], "before": before["agreement"]}, indent=1))
    print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} kB) and its loss curve")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specdecode_ref.training",
                                     description="Train the drafters on the target's own answers.")
    parser.add_argument("--corpus", default=str(distill.default_corpus_path()), help="distillation corpus file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    parser.add_argument("--train-fraction", type=float, default=1.0,
                        help="train on this share of the training prompts (learning curves; default 1)")
    p = sub.add_parser("data", help="build the self-distillation corpus (teacher pass over the committed answers)")
    p.add_argument("--ids", default=str(distill.DEFAULT_IDS_PATH),
                   help="token-id corpus: read it, or write it with --generate (default: the committed one)")
    p.add_argument("--generate", action="store_true",
                   help="generate the answers again (hours on a 2-core CPU, minutes on a GPU) instead of reading --ids")
    p.add_argument("--plan", choices=["full", "base"], default="full",
                   help="which passes to generate (corpus_plan.py; default: full)")
    p.add_argument("--max-new-tokens", type=int, default=CORPUS.max_new_tokens)
    p.add_argument("--batch-size", type=int, default=CORPUS.batch_size)
    p.add_argument("--teacher-batch-tokens", type=int, default=2048, help="tokens per teacher-pass forward")
    p.add_argument("--limit", type=int, default=0, help="use only the first N training prompts")
    p.add_argument("--dtype", default="bf16", help="target dtype of the teacher pass (fp32 on a CPU without bf16)")
    p.add_argument("--fused", action="store_true", help="also keep EAGLE-3's fused features (Corpus.fused), same pass")
    p.add_argument("--no-hidden", action="store_true", help="do not keep the last hidden states (EAGLE-3 needs none)")
    p.add_argument("--prompt-fraction", type=float, default=1.0,
                   help="teacher-pass only the answers to this share of the training prompts (a CPU-sized corpus)")
    p.add_argument("--first-turn", action="store_true", help="only the answers to the prompts themselves")
    p.add_argument("--subset-seed", type=int, default=1, help="seed of --prompt-fraction's choice of prompts")
    p = sub.add_parser("fused-features", help="add EAGLE-3's fused low/middle/high hidden states to the corpus")
    p.add_argument("--layers", type=_ints, default=None,
                   help="hidden-state entries to fuse, comma-separated (default: EAGLE-3's 2, N/2, N-3)")
    p.add_argument("--dtype", default="bf16", help="target dtype of the pass (default: bf16, as `data`)")
    p.add_argument("--out", default=None, help="corpus file to write (default: --corpus, updated in place)")
    helps = {"draft": "distil the draft model", "early-exit": "train exit adapters for self-speculation",
             "medusa": "train Medusa (or with --hydra, Hydra) heads on the corpus' hidden states (target frozen)",
             "hydra": "train Hydra heads (medusa --hydra with the shipped Hydra recipe)",
             "eagle": "train the EAGLE head on the corpus' features (target frozen)",
             "parallel-draft": "adapt the draft model into a parallel drafter (PARD: mask tokens, one forward)"}
    for name, recipe in RECIPES.items():
        p = sub.add_parser(name, help=helps[name])
        _add_recipe_options(p, recipe)
        p.add_argument("--out", default=None, help="weights file (default: the shipped one)")
        if name == "early-exit":
            p.add_argument("--ship", default="auto",
                           help="exit layers to write, comma-separated, or 'auto' (default): the one with "
                                "the best predicted speedup, since the weight budget holds one adapter")
        if name == "eagle":
            p.add_argument("--init", default=None,
                           help="EAGLE weights file to start from (default: the target's last layer)")
            p.add_argument("--draft-vocab", default=None,
                           help="--features fused: draft vocabulary ids file, or 'full' (default: the shipped "
                                "8,192-token one)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    {"data": cmd_data, "fused-features": cmd_fused_features, "draft": cmd_draft, "early-exit": cmd_early_exit,
     "medusa": cmd_medusa, "hydra": cmd_hydra, "eagle": cmd_eagle, "parallel-draft": cmd_parallel_draft}[args.cmd](args)


if __name__ == "__main__":
    main()
