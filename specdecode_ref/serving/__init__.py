"""Serving: speculative decoding inside an engine that serves many requests.

    blocks        KV slots in fixed-size blocks: allocate_slots with lookahead for drafts, trim, free, check
    scheduler     continuous batching: arrivals, token budget, drafts as lookahead, recompute preemption
    policies      when to speculate: always on, always off, adaptive (K from batch size and acceptance)
    metrics       throughput, TTFT, inter-token latency, vLLM's spec_decode_* counters
    sweep         the scheduler over loads and policies (python -m specdecode_ref.serving.sweep)
    viz           throughput and latency curves of a sweep, of two engines side by side; one run's schedule
    vllm_runner   run vLLM (in its own environment) on the same model and prompts, JSON in and out; its load sweep
    compare       our sweep beside vLLM's: one table, the crossover load, outputs token for token
    export        our trained drafters as model directories vLLM loads (draft model, EAGLE head)
    advisor       vLLM's spec-decode counters + a cost curve -> tokens per step, speedup per K and batch size, best K
    suffix_vllm   our suffix decoding beside vLLM's, request by request, counters recounted within max_tokens
    served_drafters  our trained drafters served in vLLM: the same weights and prompts, both engines' counters
"""
