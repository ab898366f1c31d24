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
``CheckpointError``         ``ValueError``        a training checkpoint is corrupt, foreign, or
                                                  does not match the run it should continue
``ModelFolderError``        ``ValueError``        a model folder (config.json, tokenizer files,
                                                  sentence-transformers files, weights) is invalid
``WorksheetError``          ``ValueError``        a worksheet (TOML file or dict) has a syntax
                                                  error, an unknown key, a wrong shape, an unknown
                                                  token, a non-finite number or a size beyond hand
                                                  calculation
``ModelConfigError``        ``ValueError``        a model's ``config.json`` (or the dict read from
                                                  it) has a missing, mistyped or out-of-range
                                                  field, or describes an unsupported architecture
==========================  ====================  ==============================================

``CheckpointError``, ``ModelFolderError``, ``WorksheetError`` and ``ModelConfigError`` are ``FileFormatError``
subclasses.

A message is one printable line: ``str(error)`` shows the control characters of a file name, key or token that
came from a file (a newline, ``\\x1b[2J``, a bidirectional override) as escapes
(:func:`transformer_np.textout.terminal`), so the command line's one error line is one line and cannot drive the
terminal. ``error.args[0]`` keeps the text as built.
"""

from __future__ import annotations

from .textout import terminal

__all__ = ["TransformerNPError", "InputTypeError", "InputValueError", "NonFiniteError", "StaleCacheError",
           "ResourceLimitError", "FileFormatError", "CheckpointError", "ModelFolderError", "WorksheetError",
           "ModelConfigError"]


class TransformerNPError(Exception):
    """Base class of every error raised on purpose by transformer_np; its ``str`` is one printable line."""

    def __str__(self) -> str:
        return terminal(super().__str__())


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


class CheckpointError(FileFormatError):
    """A training checkpoint is corrupt, foreign, or inconsistent with its own config or with the run
    it should continue (the message names the entry, what was expected and what was found)."""


class ModelFolderError(FileFormatError):
    """A model folder is invalid: a JSON file of the wrong shape or type, a path leaving the folder,
    a tokenizer vocabulary that does not fit, non-finite weights (the message names the file and key)."""


class WorksheetError(FileFormatError):
    """A worksheet is malformed: TOML syntax (the line is named), an unknown key (the nearest valid one is
    suggested), a wrong shape (key, expected and given shape), an unknown token, a non-finite number, or a
    size beyond hand calculation."""


class ModelConfigError(FileFormatError):
    """A model configuration (``config.json`` or its dict) cannot describe a supported encoder: the message names
    the field, what was expected and what was received (or lists the supported architectures)."""
