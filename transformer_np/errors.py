"""The exceptions the library raises.

Every error a user can cause is a subclass of :class:`TransformerNPError` *and* of the builtin
``ValueError`` or ``TypeError`` it has always been, so ``except ValueError`` keeps working while
callers that need to tell one failure from another catch the class — never the message text.

==========================  ====================  ==============================================
class                       builtin base          raised when
==========================  ====================  ==============================================
``InputTypeError``          ``TypeError``         an argument is the wrong kind of thing
``InputValueError``         ``ValueError``        right kind, wrong value / shape / range
``NonFiniteError``          ``ValueError``        NaN or ±inf where finite numbers are required,
                                                  including overflow inside the stack
``StaleCacheError``         ``ValueError``        a backward is given a cache that can no longer
                                                  be used (freed, or its parameters changed)
``ResourceLimitError``      ``ValueError``        the work asked for would need more memory than
                                                  the limit allows (refused before allocating)
``FileFormatError``         ``ValueError``        a file (checkpoint, model folder, worksheet,
                                                  safetensors) is corrupt, foreign or inconsistent
``WorksheetError``          ``ValueError``        a worksheet (TOML file or dict) has a syntax
                                                  error, an unknown key, a wrong shape, an unknown
                                                  token, a non-finite number or a size beyond hand
                                                  calculation (a ``FileFormatError``)
==========================  ====================  ==============================================
"""

from __future__ import annotations

__all__ = ["TransformerNPError", "InputTypeError", "InputValueError", "NonFiniteError", "StaleCacheError",
           "ResourceLimitError", "FileFormatError", "WorksheetError"]


class TransformerNPError(Exception):
    """Base class of every error raised on purpose by transformer_np."""


class InputTypeError(TransformerNPError, TypeError):
    """An argument is the wrong kind of thing (names the argument, the expected and the received type)."""


class InputValueError(TransformerNPError, ValueError):
    """An argument has the right type but a wrong value, shape or range."""


class NonFiniteError(InputValueError):
    """NaN or ±inf where finite numbers are required (inputs, parameters, or an overflow inside the stack)."""


class StaleCacheError(InputValueError):
    """A cache that can no longer be used for a backward pass (already freed, or stale)."""


class ResourceLimitError(InputValueError):
    """The estimated memory of the requested work exceeds the limit; nothing was allocated."""


class FileFormatError(InputValueError):
    """A file is corrupt, foreign, or inconsistent with what it must describe."""


class WorksheetError(FileFormatError):
    """A worksheet is malformed: TOML syntax (the line is named), an unknown key (the nearest valid one is
    suggested), a wrong shape (key, expected and given shape), an unknown token, a non-finite number, or a
    size beyond hand calculation."""
