"""Figures of the course studies: one module per study, drawing only (the numbers come from
:mod:`transformer_np.course`)."""
