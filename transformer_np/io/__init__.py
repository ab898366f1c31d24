"""Weights in and out: pretrained models, file formats, and moving weights to and from other frameworks.

A pretrained BERT-family encoder run by this library (:mod:`.pretrained`, with its WordPiece
:mod:`.tokenizer` and the sentence-transformers modules of :mod:`.st_modules`), strict readers for the files
it reads (:mod:`.safetensors`, :mod:`.jsonfile`), and weights that move both ways between transformer_np and
PyTorch (:mod:`.interop_torch`), Hugging Face (:mod:`.interop`, :mod:`.hf_model`, :mod:`.families` with
:mod:`.family_modernbert` and :mod:`.family_deberta`) and JAX/Flax (:mod:`.interop_jax`). ``_config_fields`` reads
a ``config.json``'s fields typed and range-checked; ``_state_tables`` is the name-table machinery both framework
mappings share. Optional packages are imported only by the functions that need them.
"""
