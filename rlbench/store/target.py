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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import ConfigError

ENV_STORE = "RLBENCH_STORE"
ENV_TRUSTED = "RLBENCH_TRUSTED"
_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no", "")


@dataclass(frozen=True)
class StoreTarget:
    """A store to append to: its file, whether the runs are trusted, and what wrote them."""

    path: Path
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
    p = Path(where)
    if p.is_dir():
        raise ConfigError(f"results store {p}: is a folder; name a file, e.g. {p / 'results.sqlite'}")
    return StoreTarget(path=p, trusted=trusted, source=source)


def store_device(arch: str, device_name: str | None) -> str:
    """The `device` a run is stored and matched under: the board's name, `cpu` for a CPU run."""
    return str(device_name or ("cpu" if arch == "cpu" else ""))
