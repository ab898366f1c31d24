"""Speed and memory, measured: the ``bench`` command's machinery.

One encoder layer timed in NumPy against PyTorch's (:mod:`.bench`, built from :mod:`.pair` and
:mod:`.timing`), the work NumPy cannot avoid for it (:mod:`.limit`, :mod:`.minilm_limit`), the machine and the
load of other processes (:mod:`.machine`, :mod:`.busy`), memory (:mod:`.memory`, :mod:`.memory_bench`) and
MiniLM's throughput and profile (:mod:`.minilm_bench`, :mod:`.profile`). docs/guide/performance.md describes
the method.
"""
