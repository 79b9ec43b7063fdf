"""The run core every engine shares: the cloud interface and backend protocol, the ledger, retries, billing, records."""
