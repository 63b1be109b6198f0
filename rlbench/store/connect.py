"""Open the results store a target names: a SQLite file (rlbench/store/sqlite.py) or an MLflow
tracking server (rlbench/store/mlflow_store.py); both append and close the same way."""

from __future__ import annotations

from typing import Any

from rlbench.store.target import MlflowLocation, StoreLocation


def open_store(where: StoreLocation) -> Any:
    """The store at `where`: a ResultsStore (SQLite) or an MlflowResultsStore; both append and close."""
    if isinstance(where, MlflowLocation):
        from rlbench.store.mlflow_store import MlflowResultsStore

        return MlflowResultsStore(where)
    from rlbench.store.sqlite import ResultsStore

    return ResultsStore(where)
