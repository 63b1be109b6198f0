"""GPU benchmarks of the trainer: `python -m trainer.bench --help`."""
