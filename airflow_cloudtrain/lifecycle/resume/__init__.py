"""The checkpoint-resume loop: attempts, the recovery decision, the history and its ledger."""
