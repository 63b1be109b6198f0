"""Plants the rehearsal fault named by RLBENCH_REHEARSAL_FAULT (rlbench/rehearse/faults.py) in this process.

On PYTHONPATH only for a rehearsal run with --fault; it patches mbridge when mbridge's bridge module is
imported, and does nothing else.
"""

import importlib.abc
import importlib.machinery
import os
import sys

_FAULT = os.environ.get("RLBENCH_REHEARSAL_FAULT", "")
_TARGET = "mbridge.core.bridge"


class _PlantOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            from rlbench.rehearse.faults import plant

            plant(_FAULT, module)

        spec.loader.exec_module = exec_module
        return spec


if _FAULT:
    sys.meta_path.insert(0, _PlantOnImport())
