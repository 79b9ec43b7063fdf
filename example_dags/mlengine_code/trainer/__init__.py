"""A small trainer in the shape Cloud ML Engine jobs had: ``python -m trainer.task --job-dir gs://...``."""
