"""AWS behind the cloud interface: EC2, the S3 run folder, SQS + Auto Scaling fleets, SSM secrets."""
