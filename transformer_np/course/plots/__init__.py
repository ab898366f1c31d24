"""Figures of the course studies: one module per study, drawing only (the numbers come from
:mod:`transformer_np.course`): :mod:`.trace`, :mod:`.gradflow`, :mod:`.contextual`, :mod:`.stability`,
:mod:`.anatomy` and :mod:`.complexity`; ``_style`` is the one helper they share (how matplotlib is loaded, the
style, how a PNG is saved)."""
