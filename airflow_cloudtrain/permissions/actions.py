"""What a recorded API call needs: AWS IAM actions and Google Cloud IAM permissions.

A call is what the emulators record (``emulator.calls``): AWS by signing name and operation (an EC2 or
other query/JSON action, or the S3 REST operation as the S3 API names it), Google by API and REST
method (``instances.insert``, ``objects.get``). Most AWS operations are their own IAM action; S3's REST
operations and Google's methods are mapped by the tables below, which list with a method the
permissions its side effects need too (``instances.insert`` creates a disk, uses a subnetwork and acts
as the VM's service account). A call no table knows needs ``unmapped:<service>:<operation>``, which no
document grants: a new call fails the suite's check until it is added here.
"""

from __future__ import annotations

# S3 REST operation -> IAM actions (https://docs.aws.amazon.com/AmazonS3/latest/userguide/using-with-s3-policy-actions.html)
S3: dict[str, tuple[str, ...]] = {
    "GetObject": ("s3:GetObject",),
    "HeadObject": ("s3:GetObject",),
    "PutObject": ("s3:PutObject",),
    "CopyObject": ("s3:GetObject", "s3:PutObject"),
    "DeleteObject": ("s3:DeleteObject",),
    "DeleteObjects": ("s3:DeleteObject",),
    "ListObjects": ("s3:ListBucket",),
    "ListObjectsV2": ("s3:ListBucket",),
    "HeadBucket": ("s3:ListBucket",),
    "CreateMultipartUpload": ("s3:PutObject",),
    "UploadPart": ("s3:PutObject",),
    "CompleteMultipartUpload": ("s3:PutObject",),
    "AbortMultipartUpload": ("s3:AbortMultipartUpload",),
    "ListMultipartUploads": ("s3:ListBucketMultipartUploads",),
    "ListParts": ("s3:ListMultipartUploadParts",),
    "CreateBucket": ("s3:CreateBucket",),
    "ListBuckets": ("s3:ListAllMyBuckets",),
}
# AWS operations that need more than their own action (the role passed to the instances they launch)
AWS_EXTRA: dict[tuple[str, str], tuple[str, ...]] = {
    ("ec2", "RunInstances"): ("ec2:CreateTags", "iam:PassRole"),
    ("ec2", "CreateLaunchTemplate"): ("ec2:CreateTags", "iam:PassRole"),
    ("autoscaling", "CreateAutoScalingGroup"): ("autoscaling:CreateOrUpdateTags", "iam:PassRole"),
}
AWS_PREFIX = {"monitoring": "cloudwatch", "pricing": "pricing", "events": "events"}

_VM = (
    "compute.disks.create",
    "compute.subnetworks.use",
    "compute.subnetworks.useExternalIp",
    "compute.instances.setMetadata",
    "compute.instances.setLabels",
    "compute.instances.setTags",
    "compute.instances.setServiceAccount",
    "iam.serviceAccounts.actAs",
)
# Google REST method (by service) -> IAM permissions (https://cloud.google.com/iam/docs/permissions-reference)
GOOGLE: dict[str, dict[str, tuple[str, ...]]] = {
    "compute": {
        "instances.insert": ("compute.instances.create", *_VM),
        "instances.aggregatedList": ("compute.instances.list",),
        "instanceTemplates.insert": ("compute.instanceTemplates.create", "compute.networks.get"),
        "instanceTemplates.get": ("compute.instanceTemplates.get",),
        "instanceGroupManagers.insert": (
            "compute.instanceGroupManagers.create",
            "compute.instanceTemplates.useReadOnly",
            "compute.instances.create",
            *_VM,
        ),
        "instanceGroupManagers.resize": ("compute.instanceGroupManagers.update",),
        "instanceGroupManagers.deleteInstances": ("compute.instanceGroupManagers.update",),
        "instanceGroupManagers.recreateInstances": ("compute.instanceGroupManagers.update",),
        "instanceGroupManagers.delete": ("compute.instanceGroupManagers.delete", "compute.instances.delete"),
        "firewalls.insert": ("compute.firewalls.create", "compute.networks.updatePolicy"),
        "firewalls.delete": ("compute.firewalls.delete", "compute.networks.updatePolicy"),
        "resourcePolicies.insert": ("compute.resourcePolicies.create",),
        "zoneOperations.wait": ("compute.zoneOperations.get",),
        "regionOperations.wait": ("compute.regionOperations.get",),
        "globalOperations.wait": ("compute.globalOperations.get",),
        "globalOperations.aggregatedList": ("compute.globalOperations.list",),
    },
    "cloudbilling": {"services.skus.list": ()},
    "monitoring": {},  # the public price catalog: any authenticated caller
    "storage": {
        "objects.insert": ("storage.objects.create", "storage.objects.delete"),  # delete: overwrite
        "objects.compose": ("storage.objects.create", "storage.objects.get", "storage.objects.delete"),
        "objects.copy": ("storage.objects.create", "storage.objects.get"),
        "objects.rewrite": ("storage.objects.create", "storage.objects.get"),
        "objects.patch": ("storage.objects.update",),
        "batch": ("storage.objects.delete",),  # the batched deletes of a folder's cleanup
    },
    "pubsub": {
        "subscriptions.create": ("pubsub.subscriptions.create", "pubsub.topics.attachSubscription"),
        "subscriptions.pull": ("pubsub.subscriptions.consume",),
        "subscriptions.acknowledge": ("pubsub.subscriptions.consume",),
        "subscriptions.modifyAckDeadline": ("pubsub.subscriptions.consume",),
        "topics.subscriptions.list": ("pubsub.topics.get",),
    },
    "secretmanager": {
        "secrets.addVersion": ("secretmanager.versions.add",),
        "versions.access": ("secretmanager.versions.access",),
    },
    "aiplatform": {"customJobs.create": ("aiplatform.customJobs.create", "iam.serviceAccounts.actAs")},
    "logging": {"entries.list": ("logging.logEntries.list",)},
}
_VERBS = {"insert": "create", "patch": "update"}  # REST verb -> IAM verb where they differ


def permissions_for(provider: str, service: str, operation: str) -> tuple[str, ...]:
    """The IAM actions (AWS) or permissions (Google) one call needs."""
    if provider == "aws":
        if service == "s3":
            return S3.get(operation, (f"unmapped:s3:{operation}",))
        if " " in operation:  # a REST call the classifier could not name
            return (f"unmapped:{service}:{operation}",)
        own = f"{AWS_PREFIX.get(service, service)}:{operation}"
        return (own, *AWS_EXTRA.get((service, operation), ()))
    table = GOOGLE.get(service, {})
    if operation in table:
        return table[operation]
    collection, _, verb = operation.rpartition(".")
    if not collection or service not in GOOGLE:
        return (f"unmapped:{service}:{operation}",)
    return (f"{service}.{collection}.{_VERBS.get(verb, verb)}",)
