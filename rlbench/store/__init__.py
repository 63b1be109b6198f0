"""Results store: where runs, checks and per-step metrics are appended (rlbench/store/sqlite.py), and
which store a command writes to (rlbench/store/target.py, opened by rlbench/store/connect.py); MLflow as a
shared store in rlbench/store/mlflow_store.py, on the client helpers it shares with the MLflow reader
(rlbench/store/mlflow_client.py). It imports the trainer's errors only; the checks, the runner and the
readers above it import it."""
