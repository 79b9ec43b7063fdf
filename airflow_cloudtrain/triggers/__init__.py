"""Async triggers. They serialize plain JSON data only and share their cloud polling."""
