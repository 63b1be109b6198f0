"""Results store: where runs, checks and per-step metrics are appended (rlbench/store/sqlite.py), and
which store a command writes to (rlbench/store/target.py); MLflow as a shared store in
rlbench/store/mlflow_store.py."""
