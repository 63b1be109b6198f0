"""Shared builders for tests (logs shaped like published runs, configs, engine helpers)."""
