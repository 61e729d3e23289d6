"""One recipe source: the shipped weights' metadata, the training functions, the command line and
the README's training commands all agree with training/recipes.py."""
import inspect
import json
import re
import shlex
from dataclasses import fields, replace
from pathlib import Path

import pytest

from specdecode_ref.proposers.shipped import WEIGHTS_DIR, weights_metadata
from specdecode_ref.training import cli, distill, recipes, train
from specdecode_ref.training.recipes import DRAFT, EAGLE, EARLY_EXIT, HYDRA, MEDUSA, PARALLEL_DRAFT

README = Path(__file__).resolve().parents[2] / "README.md"


def _meta(name):
    return weights_metadata(WEIGHTS_DIR / f"smollm2-135m-{name}.safetensors")


def test_recipes_are_what_the_shipped_weights_record():
    draft = _meta("draft")
    assert (int(draft["steps"]), float(draft["lr"]), int(draft["seed"])) == (DRAFT.steps, DRAFT.lr, DRAFT.seed)
    assert tuple(json.loads(draft["init_layers"])) == DRAFT.init_layers
    # the most frequent vocab_size answer tokens, plus the end-of-turn ids when they are not among them
    size = int(weights_metadata(WEIGHTS_DIR / "smollm2-135m-draft-vocab.safetensors")["size"])
    assert DRAFT.vocab_size <= size <= DRAFT.vocab_size + 2
    ee = _meta("exit-adapters")
    assert (int(ee["steps"]), float(ee["lr"])) == (EARLY_EXIT.steps, EARLY_EXIT.lr)
    assert tuple(json.loads(ee["trained_exits"])) == EARLY_EXIT.exits
    medusa = _meta("medusa")
    assert (int(medusa["steps"]), float(medusa["lr"])) == (MEDUSA.steps, MEDUSA.lr)
    assert (int(medusa["num_heads"]), int(medusa["num_layers"])) == (MEDUSA.num_heads, MEDUSA.num_layers)
    hydra = _meta("hydra")
    assert (int(hydra["steps"]), int(hydra["batch_tokens"]), json.loads(hydra["hydra"])) == (HYDRA.steps,
                                                                                          HYDRA.batch_tokens, True)
    for recipe, meta in ((DRAFT, draft), (EARLY_EXIT, ee), (MEDUSA, medusa)):
        assert int(meta["batch_tokens"]) == recipe.batch_tokens
    eagle = _meta("eagle")
    for f in fields(EAGLE):
        if f.name in eagle:
            assert type(getattr(EAGLE, f.name))(eagle[f.name]) == getattr(EAGLE, f.name), f.name


def test_parallel_drafter_records_its_recipe():
    pard = _meta("pard")
    for f in fields(PARALLEL_DRAFT):
        expected = getattr(PARALLEL_DRAFT, f.name)
        got = tuple(json.loads(pard[f.name])) if isinstance(expected, tuple) else type(expected)(pard[f.name])
        assert got == expected, f.name


@pytest.mark.parametrize("fn,recipe,names", [
    (train.train_draft, DRAFT, {"steps", "lr", "batch_tokens", "seed", "init_layers"}),
    (train.train_early_exit, EARLY_EXIT, {"steps", "lr", "batch_tokens", "seed", "exits"}),
    (train.train_medusa, MEDUSA, {"steps", "lr", "batch_tokens", "seed", "num_heads", "num_layers", "hydra",
                                  "hydra_width"}),
    (train.train_eagle, EAGLE, {"steps", "lr", "batch_tokens", "seed", "feature_weight", "token_weight"}),
    (train.train_parallel_draft, PARALLEL_DRAFT, {"steps", "lr", "batch_tokens", "seed", "positions", "rank",
                                                  "scale", "keep"}),
])
def test_training_functions_default_to_the_recipe(fn, recipe, names):
    params = inspect.signature(fn).parameters
    for name in names:
        assert params[name].default == getattr(recipe, name), (fn.__name__, name)


def test_eagle_losses_weigh_tokens_as_the_recipe():
    for fn in (train.eagle_loss_fn, train.evaluate_eagle):
        params = inspect.signature(fn).parameters
        assert params["token_weight"].default == EAGLE.token_weight
        assert params["feature_weight"].default == EAGLE.feature_weight


def test_command_line_defaults_are_the_recipes(monkeypatch):
    seen = {}
    for name in recipes.RECIPES:
        monkeypatch.setattr(cli, "cmd_" + name.replace("-", "_"),
                            lambda args: seen.setdefault(args.cmd, cli._recipe(args)))
    for name, recipe in recipes.RECIPES.items():
        cli.main([name])
        assert seen[name] == recipe


def test_medusa_hydra_switch(monkeypatch):
    """``medusa --hydra`` turns on Hydra heads and changes nothing else; plain ``medusa`` stays Medusa."""
    seen = []
    monkeypatch.setattr(cli, "cmd_medusa", lambda args: seen.append(cli._recipe(args)))
    cli.main(["medusa", "--hydra"])
    cli.main(["medusa"])
    assert seen == [replace(MEDUSA, hydra=True), MEDUSA] and MEDUSA.hydra is False


def test_corpus_defaults_are_the_recipe():
    params = inspect.signature(distill.build_corpus).parameters
    assert params["max_new_tokens"].default == recipes.CORPUS.max_new_tokens
    assert params["temperatures"].default == recipes.CORPUS.temperatures


def test_readme_training_commands_use_the_recipe():
    """The README's commands may pass options, but only with the recipe's own values."""
    text = README.read_text()
    section = text[text.index("## Trained drafters"):]
    block = section[section.index("```bash"): section.index("```", section.index("```bash") + 3)]
    checked = 0
    for line in block.splitlines():
        words = shlex.split(line.split("#")[0])
        if len(words) < 2 or words[0] != "$T" or words[1] not in recipes.RECIPES:
            continue
        recipe = recipes.RECIPES[words[1]]
        checked += 1
        for flag, value in zip(words[2::2], words[3::2]):
            name = re.sub("^--", "", flag).replace("-", "_")
            name = {"heads": "num_heads", "layers": "num_layers"}.get(name, name)
            default = getattr(recipe, name)
            parsed = tuple(type(default[0])(x) for x in value.split(",")) if isinstance(default, tuple) \
                else type(default)(value)
            assert parsed == default, (words[1], flag, value)
    assert checked == len(recipes.RECIPES)
