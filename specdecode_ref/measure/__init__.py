"""Measuring speculative decoding. None of it is needed to decode; all of it is how the course
checks its formulas against a real model.

The timing harness lives in ``measure.harness`` (how a time, an interval or a sentence about a
result is produced, the same for every study). The modules here are the studies that use it, most
for one notebook. The engine-to-engine side-by-sides with vLLM live beside what they compare, in
``serving`` (``serving.suffix_vllm``, ``serving.served_drafters``).

    replay          the engine's step rule replayed offline: tau and modelled speedup for any k (notebooks 03, 05)
    draft_sizes     every shipped drafter at every size on the benchmark (the table load_proposer sizes drafts
                    from), and the chosen sizes timed against plain decoding on unseen prompts
    ngram_analysis  offline replays of prompt lookup (notebook 04)
    layer_analysis  per-layer agreement and layer-call traces (notebook 06)
    sampling_regime drafting from q vs greedy one-hot at T = 0, 0.7, 1.0: α, predicted α, τ per drafter
    consistency     a ceiling on a measured speedup from τ and the measured costs
    batch_bench     the cost surface T(B, n), throughput against batch size, batch-aware K (notebook 09)
    backends        the two target backends side by side: one product, the cost curve, the memory floor
    engine_profile  where the time of one decoded token goes, and what standard tools take off it (notebook 00)
    verification_bench  token against block verification: exact keep probabilities, recorded calls (notebook 11)
    suffix_bench    suffix decoding against n-gram and plain decoding on a stream, at batch 1 and served (notebook 11)
    routing         per-prompt timings of every drafter, a router fitted to them, its regret to the oracle (notebook 12)
    context_length  each drafter's acceptance as the context grows (notebook 12)
    parallel        the parallel drafter against the sequential draft model at several K (notebook 13)
    gpu_check       one command that checks a GPU end to end: cost curve, exactness matrix, notebooks
    viz             a generation drawn as coloured tokens (accepted, recovered, bonus)
"""
