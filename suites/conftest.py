"""Turns the suite files in this folder into pytest items (see rlbench/run/pytest_plugin.py).

    pytest suites/ --arch cpu                       # every profile this machine can run
    pytest suites/ --arch cpu --profile cpu -k dapo --rlbench-set trainer.total_steps=2
    pytest suites/ --arch gfx942 --profile full --rlbench-logs logs/   # check logs of runs made elsewhere

The hooks are imported here rather than listed in `pytest_plugins`, so they apply to this folder
only and a plain `pytest` (testpaths = tests) never loads them.
"""

from rlbench.run.pytest_plugin import *
