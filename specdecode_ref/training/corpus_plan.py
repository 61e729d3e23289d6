"""The large self-distillation corpus: which conversations the target answers, and how often.

A drafter learns what *this* target says next, so more of the target's own text is the cheapest
way to a better drafter: the course's first corpus (the 744 training prompts answered greedily and
once at T = 0.7) left EAGLE at 0.70 top-1 agreement on its training answers but 0.46 held out, the
signature of a model that has memorised its data rather than run out of capacity. This module
multiplies the data without new hand-written prompts, in the ways the EAGLE and Medusa authors
describe (self-distillation on the target's own generations) plus two of our own:

1. **Several answers per prompt** at the temperatures the drafters will serve (greedy, and
   T = 0.7 / 1.0 with top-p 0.95): sampled answers branch away from the greedy one after a few
   tokens, so each is mostly new text in the target's own style.
2. **Follow-up turns**: the target's own answer becomes the assistant turn of a longer chat, and a
   generic follow-up ("shorter", "an example", "why?") asks for more. This is the multi-turn
   setting the benchmark's chat category measures, and it trains positions deep in a context.
3. **Answers as inputs**: an answer becomes the passage of an input-grounded task (summarise it,
   rewrite it, pull facts out of it), which is what summarisation / rewrite / RAG prompts look like.

Every follow-up and task text below is written for this course; none is taken from the benchmark
prompts (``tests/training/test_corpus_plan.py`` checks the committed corpus against them).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

#: Follow-up questions appended after the target's own answer (round 2).
FOLLOW_UPS = (
    "Can you make that shorter?",
    "Could you give me a concrete example?",
    "Why is that the case?",
    "Explain that again as if I were twelve years old.",
    "Put the main points into a bulleted list.",
    "What is the most common mistake people make here?",
    "Can you say more about the first point?",
    "Which part of your answer is the most important, and why?",
    "Is there another way to do this?",
    "What would change if the situation were reversed?",
    "Summarize your answer in one sentence.",
    "Thanks! What should I read or try next?",
    "I don't understand the last part. Can you clarify it?",
    "Write that in a more formal tone.",
    "Can you turn that into a short step-by-step guide?",
    "What are the pros and cons?",
    "How would you explain this to a colleague who is new to the topic?",
    "Give me three questions I could ask to check that I understood this.",
    "Are there any exceptions I should know about?",
    "Can you write it as a short paragraph instead of a list?",
    "What is a good analogy for this?",
    "How sure are you about that? What could be wrong?",
    "Could you add a short conclusion?",
    "Please rewrite your answer for a beginner.",
)

#: Input-grounded tasks whose passage is one of the target's own answers (round 2).
REUSE_TASKS = (
    "Summarize the following text in two sentences.",
    "Rewrite the following text so that it is easier to read.",
    "List the key facts stated in this text.",
    "Turn this text into a short list of bullet points.",
    "Write a title for the following text and then a one-line summary.",
    "Shorten this text to about half its length.",
    "Rewrite the following text in a friendly, casual tone.",
    "What is the main idea of this text? Answer in one sentence.",
    "Correct any mistakes in the following text and explain what you changed.",
    "Write two questions that this text answers, each with its answer.",
)


@dataclass(frozen=True)
class Pass:
    """One generation pass: which conversations, answered how.

    source: "base" answers the training prompts; "follow_up" and "reuse" build new chats from the
    answers of pass ``from_pass`` (its name). temperature 0 is greedy; otherwise top-p sampling.
    """

    name: str
    source: str = "base"
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    from_pass: str | None = None


#: The plan of the course's corpus: the base prompts answered six times (greedy once, sampled five
#: times), four follow-up rounds and four reuse rounds built from those answers, and two second
#: follow-ups (a third user turn) built from the first ones: 16 passes, about ten times the tokens
#: of the first corpus (two passes, answers up to 160 tokens).
_S = dict(top_p=0.95)
FULL_PLAN = (
    Pass("greedy", temperature=0.0),
    Pass("t07a", temperature=0.7, seed=1, **_S),
    Pass("t07b", temperature=0.7, seed=2, **_S),
    Pass("t07c", temperature=0.7, seed=3, **_S),
    Pass("t10a", temperature=1.0, seed=4, **_S),
    Pass("t10b", temperature=1.0, seed=5, **_S),
    Pass("follow_greedy", "follow_up", 0.0, seed=6, from_pass="t07a"),
    Pass("follow_t07", "follow_up", 0.7, seed=7, from_pass="greedy", **_S),
    Pass("follow_t10", "follow_up", 1.0, seed=8, from_pass="t07b", **_S),
    Pass("follow_t07b", "follow_up", 0.7, seed=9, from_pass="t10a", **_S),
    Pass("reuse_greedy", "reuse", 0.0, seed=10, from_pass="greedy"),
    Pass("reuse_t07", "reuse", 0.7, seed=11, from_pass="t07c", **_S),
    Pass("reuse_t10", "reuse", 1.0, seed=12, from_pass="t10b", **_S),
    Pass("reuse_t07b", "reuse", 0.7, seed=13, from_pass="t07a", **_S),
    Pass("follow2_greedy", "follow_up", 0.0, seed=14, from_pass="follow_t07"),
    Pass("follow2_t07", "follow_up", 0.7, seed=15, from_pass="follow_greedy", **_S),
)
#: The first corpus' plan (for comparison): greedy and one T = 0.7 answer per prompt.
BASE_PLAN = (Pass("greedy", temperature=0.0), Pass("t07a", temperature=0.7, seed=1, **_S))
PLANS = {"full": FULL_PLAN, "base": BASE_PLAN}


def check_plan(plan) -> None:
    """Clear errors for a plan that cannot run: unknown sources, passes that read a later pass."""
    seen = set()
    for p in plan:
        if p.source not in ("base", "follow_up", "reuse"):
            raise ValueError(f"pass {p.name!r}: unknown source {p.source!r}")
        if p.source != "base" and p.from_pass not in seen:
            raise ValueError(f"pass {p.name!r} reads answers of {p.from_pass!r}, which no earlier pass makes")
        if p.temperature < 0 or not 0 < p.top_p <= 1:
            raise ValueError(f"pass {p.name!r}: temperature must be >= 0 and top_p in (0, 1]")
        if p.name in seen:
            raise ValueError(f"two passes are called {p.name!r}")
        seen.add(p.name)


def follow_up_chats(conversations: list, answers: list, seed: int) -> list:
    """Each chat extended by the target's own answer and a follow-up question (seeded choice).

    conversations: lists of chat messages; answers: the target's reply text to each (same order).
    """
    rng = random.Random(seed)
    return [list(conv) + [{"role": "assistant", "content": ans}, {"role": "user", "content": rng.choice(FOLLOW_UPS)}]
            for conv, ans in zip(conversations, answers)]


def reuse_chats(answers: list, seed: int, min_chars: int = 200) -> list:
    """New single-turn chats whose input is one of the target's answers (long enough to work on)."""
    rng = random.Random(seed)
    out = []
    for ans in answers:
        if len(ans) < min_chars:
            continue
        task = rng.choice(REUSE_TASKS)
        text = f"{task}\n\n{ans}" if rng.random() < 0.5 else f"{ans}\n\n{task}"
        out.append([{"role": "user", "content": text}])
    return out


__all__ = ["FOLLOW_UPS", "REUSE_TASKS", "Pass", "FULL_PLAN", "BASE_PLAN", "PLANS", "check_plan",
           "follow_up_chats", "reuse_chats"]
