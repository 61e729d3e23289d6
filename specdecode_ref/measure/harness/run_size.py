"""How large a notebook's experiments are: the full size behind the outputs you read, or a small
size with the same code paths for the test command.

Every notebook sizes its experiments (prompts, new tokens, repeats, timed rounds) through
:func:`size`, e.g. ``MAX_NEW = size(64, small=24)``. The executed notebooks in the repository
come from full runs on a quiet machine. ``make test`` sets ``SPECDECODE_SMALL_RUN=1``: every cell
still runs and every exact property (fp32 equality, identical counters, identities) is still
asserted, but on less work, so the whole course is checked in minutes on any laptop CPU. Figures
from a small run are noisier; read the committed outputs for the numbers.

A small run also leaves out the notebooks' own vLLM start-ups (the test command runs the vLLM
cross-checks on their own before the notebooks).
"""
from __future__ import annotations

import os

SWITCH = "SPECDECODE_SMALL_RUN"
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")


def small_run() -> bool:
    """True when ``SPECDECODE_SMALL_RUN`` asks for the small size (``1``/``true``/``yes``/``on``)."""
    value = os.environ.get(SWITCH, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{SWITCH}={os.environ[SWITCH]!r}: use 1 (small run) or 0 (full run)")


def size(full, small):
    """``full`` normally, ``small`` under ``SPECDECODE_SMALL_RUN=1``: one experiment size, two runs."""
    return small if small_run() else full


def describe() -> str:
    """One line for a notebook's first cell: which size this run uses, and why it matters."""
    if small_run():
        return (f"{SWITCH}=1: a small run (fewer prompts, tokens and repeats, the same code paths); "
                "its figures are noisier than the committed outputs'")
    return "full-size run (the size behind the committed outputs)"
