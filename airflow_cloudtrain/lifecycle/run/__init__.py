"""The single run: one attempt on one instance (``CloudTrainOperator``)."""
