"""User-facing errors: one line that names the file, field or path, and the fix.

Entry points catch `RLBenchError` and print `error: <message>` without a traceback; everything
else is a bug and keeps its traceback.
"""

from __future__ import annotations


class RLBenchError(Exception):
    """Bad input from the user. The message is one line: what is wrong, where, and the fix."""


class ConfigError(RLBenchError):
    """A config or suite file that does not validate."""


class DataError(RLBenchError):
    """A dataset path or row that cannot be used."""


class ModelError(RLBenchError):
    """A model path or format that cannot be loaded."""
