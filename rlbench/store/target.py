"""Which results store a command writes to, and whether its runs are trusted (history baselines).

    rlbench run SUITE --profile cpu --store results.sqlite [--trusted]
    rlbench check LOG --suite SUITE --store results.sqlite
    pytest suites/ --arch cpu --rlbench-store results.sqlite [--rlbench-trusted]
    RLBENCH_STORE=/var/lib/rlbench/results.sqlite RLBENCH_TRUSTED=1 pytest suites/ --arch gfx942

The option wins over the environment variable `RLBENCH_STORE`; with neither, nothing is written
anywhere (and a reference with `history` is not evaluated, with that reason). `--trusted` or
`RLBENCH_TRUSTED=1` marks the runs trusted: only trusted runs are the history a gate compares
against (e.g. set it in the nightly job on main, not in pull-request jobs). A value of
`RLBENCH_TRUSTED` other than 1/0/true/false/yes/no, or trusted without a store, is an error.

Which kind of store: a value that starts with `mlflow:` or `http://` / `https://` is an MLflow
tracking server (rlbench/store/mlflow_store.py), anything else a SQLite file (rlbench/store/sqlite.py):

    --store mlflow:http://mlflow.internal:5000                # mlflow: + any MLflow tracking URI
    --store https://mlflow.internal#experiment=rlbench-nightly # http(s):// is read as mlflow:http(s)://
    RLBENCH_STORE=mlflow:sqlite:////srv/mlflow.db RLBENCH_MLFLOW_EXPERIMENT=rlbench-ci

The MLflow experiment is the URI's `#experiment=NAME`, else `$RLBENCH_MLFLOW_EXPERIMENT`, else
`rlbench` (created on first use). Another `#...` fragment, or an empty URI or name, is an error.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import ConfigError

ENV_STORE = "RLBENCH_STORE"
ENV_TRUSTED = "RLBENCH_TRUSTED"
ENV_EXPERIMENT = "RLBENCH_MLFLOW_EXPERIMENT"
DEFAULT_EXPERIMENT = "rlbench"
_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no", "")


@dataclass(frozen=True)
class MlflowLocation:
    """An MLflow tracking URI and the experiment the runs go to."""

    uri: str
    experiment: str

    def __str__(self) -> str:
        return f"mlflow:{self.uri}#experiment={self.experiment}"


StoreLocation = Path | MlflowLocation  # a SQLite file or an MLflow experiment


def mlflow_location(value: str, env: Mapping[str, str]) -> MlflowLocation | None:
    """The MLflow store `value` names (see module docstring), or None when it names a SQLite file."""
    if value.startswith("mlflow:"):
        rest = value[len("mlflow:"):]
    elif value.startswith(("http://", "https://")):
        rest = value
    else:
        return None
    uri, sep, frag = rest.partition("#")
    experiment = str(env.get(ENV_EXPERIMENT) or DEFAULT_EXPERIMENT)
    if sep:
        key, eq, name = frag.partition("=")
        if key != "experiment" or not eq or not name.strip():
            raise ConfigError(f"results store {value!r}: the part after # must be experiment=NAME "
                              "(e.g. mlflow:http://host:5000#experiment=rlbench)")
        experiment = name.strip()
    if not uri:
        raise ConfigError(f"results store {value!r}: no tracking URI after mlflow: "
                          "(e.g. mlflow:http://host:5000)")
    return MlflowLocation(uri=uri, experiment=experiment)


@dataclass(frozen=True)
class StoreTarget:
    """A store to append to: its file or MLflow experiment, whether the runs are trusted, and what wrote them."""

    path: StoreLocation
    trusted: bool
    source: str  # pytest | run | check


def resolve_target(path: str | None, trusted: bool, source: str,
                   env: Mapping[str, str] | None = None) -> StoreTarget | None:
    """The store of a command from its option (`path`, `trusted`) and the environment; None: no store."""
    env = os.environ if env is None else env
    raw = str(env.get(ENV_TRUSTED, "")).strip().lower()
    if raw not in _TRUE + _FALSE:
        raise ConfigError(f"{ENV_TRUSTED}={env.get(ENV_TRUSTED)!r}: set it to 1 (trusted runs, e.g. nightly on main) "
                          "or 0, or unset it")
    trusted = trusted or raw in _TRUE
    where = path or env.get(ENV_STORE) or None
    if where is None:
        if trusted:
            raise ConfigError(f"trusted runs are marked in a results store, and none is set: give --store PATH "
                              f"(pytest: --rlbench-store PATH) or export {ENV_STORE}=PATH")
        return None
    mlflow = mlflow_location(str(where), env)
    if mlflow is not None:
        return StoreTarget(path=mlflow, trusted=trusted, source=source)
    p = Path(where)
    if p.is_dir():
        raise ConfigError(f"results store {p}: is a folder; name a file, e.g. {p / 'results.sqlite'}")
    return StoreTarget(path=p, trusted=trusted, source=source)


def store_device(arch: str, device_name: str | None) -> str:
    """The `device` a run is stored and matched under: the board's name, `cpu` for a CPU run."""
    return str(device_name or ("cpu" if arch == "cpu" else ""))
