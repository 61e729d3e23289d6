"""Training the drafters on the target's own answers (self-distillation).

    distill     the corpus: the target's answers, its top-k logits and hidden states
    recipes     the settings of every shipped drafter, the defaults everything below reads
    loop        the training loop every drafter shares, its evaluation and loss curves
    draft, early_exit, medusa, eagle   one module per drafter family: batches, losses, training
    cli         the command line (``python -m specdecode_ref.training --help``)
    train       the names above in one place, as notebooks import them
"""
