"""Thin, connection-aware hooks over the SDK clients (boto3 / aiobotocore, google-cloud-*)."""
