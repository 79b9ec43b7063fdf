"""Operators: mostly configuration over the run and the cloud interface."""
