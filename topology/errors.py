"""The error every bad user input raises: the CLI prints its one-line message and exits 2."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input: the message names the file or field, the value and what is allowed."""


class FieldsError(ValueError):
    """A rule across fields, raised inside a model validator; the message names the fields (dotted, relative
    to the model) instead of printing the whole object as the value."""

    def __init__(self, fields: tuple[str, ...] | list[str], message: str) -> None:
        super().__init__(message)
        self.fields = tuple(fields)


class InputNotice(UserWarning):
    """Something about the inputs the user should know that is not an error (the CLI prints it once as a plain
    `warning:` line on stderr; library callers get it as a Python warning)."""
