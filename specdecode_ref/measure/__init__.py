"""Measuring speculative decoding: the benchmark harness, workloads, cost curves, offline replays,
statistical tests and visualisation. None of it is needed to decode; all of it is how the course
checks its formulas against a real model.

    timing          median-of-runs timing, decode rates, the quiet-machine check before measuring
    run_size        one switch for the notebooks' experiment sizes: full (committed outputs) or small (make test)
    bench           every method on the same prompts vs Hugging Face (``python -m specdecode_ref.measure.bench``)
    workloads       the benchmark's prompts by category, a held-out set, the disjoint training prompts, a stream of repeating requests
    intervals       paired, stratified bootstrap intervals on speedup and tau; time per output token percentiles
    routing         per-prompt timings of every drafter, a router fitted to them, its regret to the oracle (notebook 12)
    context_length  each drafter's acceptance as the context grows (notebook 12)
    compare         interleaved runs of several proposers, per-method tables, decode rates, one step probed
    sampling_regime drafting from q vs greedy one-hot at T = 0, 0.7, 1.0: α, predicted α, τ per drafter
    stats           chi-square and uniformity tests for "the output follows the target distribution"
    viz             a generation drawn as coloured tokens (accepted, recovered, bonus)
    claims          sentences rendered from measured values (paired comparisons, machine line) for the notebooks
    replay          the engine's step rule replayed offline: tau and modelled speedup for any k (notebooks 03, 05)
    ngram_analysis  offline replays of prompt lookup (notebook 04)
    layer_analysis  per-layer agreement and layer-call traces (notebook 06)
    verification_bench  token against block verification: exact keep probabilities, recorded calls (notebook 11)
    suffix_bench    suffix decoding against n-gram and plain decoding on a stream, at batch 1 and served (notebook 11)
    suffix_vllm     our suffix decoding beside vLLM's, request by request, counters recounted within max_tokens
    draft_sizes     every shipped drafter at every size on the benchmark (the table load_proposer sizes drafts
                    from), and the chosen sizes timed against plain decoding on unseen prompts
"""
