"""Suite files: the typed suite (profiles, references, checks, golden values) and which profile a log fits.

- `suite.py`         `load_suite`, `Suite`, profiles and their requirements
- `profile_guess.py` the profile a log of an external run was most likely made with

May import: `trainer.config`, `trainer.errors`. The lowest rlbench layer.
"""
