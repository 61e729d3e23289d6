"""Write ``repeating.json``: a stream of requests that repeat each other's outputs.

Suffix decoding remembers earlier requests' outputs; it pays when requests resemble each other,
as they do behind agents and pipelines that issue one instruction over many inputs. Each family
here fills one template with different entities, so the answers share most of their wording
but not their details. The requests are interleaved in arrival order (one of each family in
turn), as a server would see them.

Run ``python specdecode_ref/data/make_repeating_prompts.py`` to regenerate (deterministic).
"""
from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent / "repeating.json"

# Each family is one instruction applied to different entities, as a pipeline or an agent issues
# it: the answers differ in the entity and share most of their wording, which no single prompt
# contains (so prompt lookup cannot copy it) but every earlier answer of the family does.
FAMILIES = {
    "email": ("Write a short, polite email to {x} declining their invitation to a meeting next week.",
              ["Anna", "Mr. Brown", "Dr. Chen", "the marketing team", "Professor Diaz", "Emma", "the board",
               "Mr. Okafor"]),
    "code": ("Write a Python function named {x} that takes a list of numbers and returns their average. "
             "Include a docstring.",
             ["mean_value", "average", "compute_mean", "avg", "list_average", "mean_of", "get_average",
              "calc_avg"]),
    "sql": ("Write a SQL query that returns every column of the {x} table for the row whose id is 42.",
            ["customers", "orders", "products", "employees", "invoices", "suppliers", "payments", "users"]),
    "steps": ("List the steps to reset a forgotten password for a {x} account.",
              ["Gmail", "Netflix", "Amazon", "Facebook", "Dropbox", "Spotify", "Twitter", "LinkedIn"]),
}


def build() -> dict:
    stream = []
    for i in range(8):
        for family, (template, values) in FAMILIES.items():
            stream.append({"family": family, "messages": [{"role": "user", "content": template.format(x=values[i])}]})
    return {"version": 1, "description": __doc__.strip().splitlines()[0], "families": list(FAMILIES),
            "stream": stream}


if __name__ == "__main__":
    OUT.write_text(json.dumps(build(), indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
