"""MLflow's client as both the store (rlbench/store/mlflow_store.py) and the reader (rlbench/ingest/mlflow_run.py)
use it: the client with a clear error when mlflow is missing, fail-fast HTTP settings, what counts as an
unreachable server, and the spelling of metric names MLflow refuses (`@` -> `_at_`, others -> `_xHH_`)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from trainer.errors import DataError

MODE_TAG = "rlbench.mode"  # the "+"-joined modes of a run the rlbench store wrote
_ALLOWED = re.compile(r"[\w\-. :/]")
_ESCAPED = re.compile(r"_x([0-9a-f]{2,6})_")


def mlflow_name(name: str) -> str:
    """`name` as a valid MLflow metric/tag key: `@` -> `_at_`, other characters MLflow refuses -> `_xHH_`."""
    name = name.replace("@", "_at_")
    return "".join(c if _ALLOWED.fullmatch(c) else f"_x{ord(c):02x}_" for c in name)


def from_mlflow_name(key: str) -> str:
    """The metric name an MLflow key spells (inverse of `mlflow_name`)."""
    return _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), key).replace("_at_", "@")


@contextmanager
def fail_fast() -> Iterator[None]:
    """MLflow's HTTP client retries an unreachable server for minutes: once, within 10 s, unless the user set it."""
    keys = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    unset = [k for k in keys if k not in os.environ]
    os.environ.update({k: keys[k] for k in unset})
    try:
        yield
    finally:
        for k in unset:
            os.environ.pop(k, None)


def client(uri: str, where: str) -> Any:
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise DataError(f"{where}: an MLflow run, and mlflow is not installed: pip install 'rlbench[mlflow]' "
                        "(or pip install mlflow)") from None
    return MlflowClient(tracking_uri=uri)


def unreachable(e: Exception) -> bool:
    text = str(e)
    return any(s in text for s in ("Max retries exceeded", "Connection refused", "ConnectionError",
                                   "Failed to establish", "timed out", "Name or service not known"))
