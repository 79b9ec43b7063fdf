"""One small provider-neutral cloud interface (``base``), one module per cloud (``aws``, ``gcp``)."""
