"""GCP behind the cloud interface: Compute Engine, the GCS run folder, Pub/Sub + MIG fleets, Secret Manager, Vertex AI."""
