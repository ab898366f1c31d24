"""The course companion: the studies behind the lesson notebooks and figures, the exercises' checks and grading.

Each study computes the numbers a lesson states — the worked example (:mod:`.trace`), gradient flow through
deep stacks (:mod:`.gradflow`), contextual embeddings of MiniLM (:mod:`.contextual`), warm-up and LayerNorm
placement (:mod:`.stability`), the encoder's anatomy (:mod:`.anatomy`), its cost (:mod:`.complexity`) — and
:mod:`.plots` draws them; :mod:`.figures` regenerates every figure, :mod:`.ledger` holds the verdict on every
claim, and :mod:`.exercises` / :mod:`.grading` check and grade the autograded exercises. Nothing is imported
here: import the module you need.
"""
