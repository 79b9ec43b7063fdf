"""The Vertex AI custom job of ``MLEngineTrainOperator``: submit, wait, logs, cancel."""
