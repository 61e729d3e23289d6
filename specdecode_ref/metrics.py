"""SpecStats: the counters of one generation, with vLLM's definitions.

So that learners can read production dashboards: acceptance_rate = accepted / drafted;
mean_accepted_length (tau) = emitted tokens / steps, counting the bonus/recovered token, so plain
decoding has tau = 1.0 and tau is the number of tokens each target forward buys.

Per position there are two different rates, and mixing them up is a classic error:
* per_position_acceptance[i] (vLLM's dashboard metric, vllm/v1/spec_decode/metrics.py):
  drafts whose first i+1 tokens were all accepted / drafts that had a position i. It is a
  survival curve S_i and can only fall with i.
* per_position_conditional[i]: accepted at position i / times position i was reached (all
  earlier drafts accepted). This is the a_i of analysis.expected_tokens_from_position_rates.
vLLM's "mean acceptance length" is 1 + accepted / drafting steps (steps with a non-empty draft);
``vllm_mean_acceptance_length`` gives it. It differs from tau when some steps draft nothing
(an n-gram proposer without a match).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class SpecStats:
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    target_forwards: int = 0
    emitted: int = 0  # tokens emitted by verification steps (the prefill's first token excluded)
    new_tokens: int = 0  # all new tokens of the request
    wall_time_s: float = 0.0
    draft_time_s: float = 0.0  # time spent inside the proposer
    target_time_s: float = 0.0  # time spent in target forwards (prefill included)
    prefill_time_s: float = 0.0
    drafting_steps: int = 0  # steps with a non-empty draft
    drafted_per_position: list = field(default_factory=list)
    accepted_per_position: list = field(default_factory=list)
    reached_per_position: list = field(default_factory=list)  # position drafted and all earlier accepted
    accepted_lengths: list = field(default_factory=list)  # accepted drafts per step
    draft_lengths: list = field(default_factory=list)  # drafted tokens per step

    def record_step(self, num_drafted: int, num_accepted: int, num_emitted: int) -> None:
        self.steps += 1
        self.drafted += num_drafted
        self.accepted += num_accepted
        self.emitted += num_emitted
        self.accepted_lengths.append(num_accepted)
        self.draft_lengths.append(num_drafted)
        self.drafting_steps += num_drafted > 0
        grow = num_drafted - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position.extend([0] * grow)
            self.accepted_per_position.extend([0] * grow)
            self.reached_per_position.extend([0] * grow)
        for i in range(num_drafted):
            self.drafted_per_position[i] += 1
            if i <= num_accepted:
                self.reached_per_position[i] += 1
            if i < num_accepted:
                self.accepted_per_position[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """tau: emitted tokens per target verification step (plain decoding = 1.0)."""
        return self.emitted / self.steps if self.steps else 0.0

    tau = mean_accepted_length

    @property
    def vllm_mean_acceptance_length(self) -> float:
        """vLLM's definition: 1 + accepted / steps that drafted something."""
        return 1.0 + self.accepted / self.drafting_steps if self.drafting_steps else 1.0

    @property
    def per_position_acceptance(self) -> list:
        """vLLM's per-position rate S_i: drafts with positions 0..i all accepted / drafts reaching i."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    @property
    def per_position_conditional(self) -> list:
        """a_i = P(position i accepted | drafted and all earlier positions accepted)."""
        return [a / r if r else 0.0 for a, r in zip(self.accepted_per_position, self.reached_per_position)]

    @property
    def tokens_per_s(self) -> float:
        """New tokens (prefill's included) per second of wall time."""
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def merge(self, other: "SpecStats") -> "SpecStats":
        """Sum of two runs' counters (for per-category aggregates)."""
        out = SpecStats()
        for name in ("drafted", "accepted", "steps", "target_forwards", "emitted", "new_tokens", "wall_time_s", "drafting_steps",
                     "draft_time_s", "target_time_s", "prefill_time_s"):
            setattr(out, name, getattr(self, name) + getattr(other, name))
        n = max(len(self.drafted_per_position), len(other.drafted_per_position))
        pad = lambda xs: list(xs) + [0] * (n - len(xs))  # noqa: E731
        out.drafted_per_position = [a + b for a, b in zip(pad(self.drafted_per_position), pad(other.drafted_per_position))]
        out.accepted_per_position = [a + b for a, b in zip(pad(self.accepted_per_position), pad(other.accepted_per_position))]
        out.reached_per_position = [a + b for a, b in zip(pad(self.reached_per_position), pad(other.reached_per_position))]
        out.accepted_lengths = self.accepted_lengths + other.accepted_lengths
        out.draft_lengths = self.draft_lengths + other.draft_lengths
        return out

    def summary(self) -> dict:
        return {
            "tokens": self.new_tokens, "steps": self.steps, "drafted": self.drafted, "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4), "tau": round(self.mean_accepted_length, 4),
            "tokens_per_s": round(self.tokens_per_s, 2), "wall_time_s": round(self.wall_time_s, 4),
            "per_position_acceptance": [round(x, 3) for x in self.per_position_acceptance],
            "per_position_conditional": [round(x, 3) for x in self.per_position_conditional],
        }

    def __repr__(self) -> str:
        return (f"SpecStats(tokens={self.new_tokens}, steps={self.steps}, drafted={self.drafted}, "
                f"accepted={self.accepted}, acceptance_rate={self.acceptance_rate:.3f}, "
                f"tau={self.mean_accepted_length:.3f}, tokens_per_s={self.tokens_per_s:.1f})")


def merge_stats(stats: Iterable[SpecStats]) -> SpecStats:
    """The counters of several runs summed into one SpecStats (pooled over prompts, categories or
    repeats); an empty iterable gives an empty SpecStats. Rates of the result are pooled rates
    (total accepted / total drafted), not means of per-run rates."""
    out = SpecStats()
    for s in stats:
        out = out.merge(s)
    return out
