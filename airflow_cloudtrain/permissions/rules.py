"""How the generated AWS policies scope what they grant: the small table the generator applies.

AWS lets a policy scope most EC2 and Auto Scaling actions by tag. Everything this provider creates
carries the run-key tag (``contract.runs.TAG_RUN_KEY``) from its creation (``TagSpecifications`` on the
instance, its volume, a fleet's launch template, a gang's security and placement groups; the tags of an
Auto Scaling group), so:

* creating actions are granted only with that tag in the request (``aws:RequestTag``) on the resource
  types that carry it, and unconditioned on the ones they only use (image, subnet, ...);
* actions on an existing resource (terminate, update, delete) are granted only on resources that carry
  the tag (``aws:ResourceTag``): the role cannot touch an instance that is not the provider's;
* tagging is granted only as part of a create call (``ec2:CreateAction``);
* ``iam:PassRole`` only to EC2 (the instance profile named in ``instance_profile``);
* the fleet's SQS queues (``ct-<digest>-items`` / ``-dlq``) and the run's own SSM parameters
  (``/cloudtrain/<digest>/<VAR>``) by name (``BY_NAME``): the role cannot read, send to or delete
  another queue, nor write or delete a parameter outside ``/cloudtrain/``;
* ``ssm:GetParameter`` on the Airflow side only on the public AMI parameters (``/aws/service/...``,
  the default image's lookup: ``ON_SIDE``); on the instance side it reads the parameters of
  ``secret_env``, which the user names, so it is on any parameter there (``parameter/*``), as
  ``secretsmanager:GetSecretValue`` is on any secret (``secret:*``);
* everything else (``Describe*``, ``ListQueues``, ``DescribeParameters``, S3, Pricing) on ``*``: reads
  that take no resource, or resources named by the user (the bucket) that the user can narrow
  (``cloudtrain permissions --bucket``; the secrets of ``secret_env``: ``--secret``,
  ``permissions.secrets``).

Google Cloud custom roles have no conditions of their own (an IAM binding may add one, e.g. on
``resource.name``), so they are the plain permission lists.
"""

from __future__ import annotations

from airflow_cloudtrain.contract.runs import TAG_RUN_KEY

TAG = TAG_RUN_KEY
ARN = "arn:aws:ec2:*:*:"
# create action -> (resource types created with the tag, resource types only used)
CREATES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "ec2:RunInstances": (
        ("instance", "volume"),
        (
            "image",
            "subnet",
            "security-group",
            "network-interface",
            "key-pair",
            "launch-template",
            "placement-group",
            "spot-instances-request",
        ),
    ),
    "ec2:CreateLaunchTemplate": (("launch-template",), ()),
    "ec2:CreateSecurityGroup": (("security-group",), ("vpc",)),
    "ec2:CreatePlacementGroup": (("placement-group",), ()),
}
TAGGABLE_CREATES = ("RunInstances", "CreateLaunchTemplate", "CreateSecurityGroup", "CreatePlacementGroup")
# actions on a resource that carries the tag
ON_TAGGED: frozenset[str] = frozenset(
    {
        "ec2:TerminateInstances",
        "ec2:StopInstances",
        "ec2:StartInstances",
        "ec2:RebootInstances",
        "ec2:ModifyInstanceAttribute",
        "ec2:DeleteLaunchTemplate",
        "ec2:CreateLaunchTemplateVersion",
        "ec2:ModifyLaunchTemplate",
        "ec2:DeleteSecurityGroup",
        "ec2:AuthorizeSecurityGroupIngress",
        "ec2:AuthorizeSecurityGroupEgress",
        "ec2:RevokeSecurityGroupEgress",
        "ec2:DeletePlacementGroup",
        "autoscaling:UpdateAutoScalingGroup",
        "autoscaling:DeleteAutoScalingGroup",
        "autoscaling:SetDesiredCapacity",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
        "autoscaling:SetInstanceProtection",
        "autoscaling:SetInstanceHealth",
        "autoscaling:DetachInstances",
    }
)
# actions on resources the provider names itself: granted on those names only (action -> ARN pattern)
QUEUES = "arn:aws:sqs:*:*:ct-*"  # clouds.aws.fleet.queue_name
PARAMETERS = "arn:aws:ssm:*:*:parameter/cloudtrain/*"  # clouds.aws.secrets
BY_NAME: dict[str, str] = {
    **{
        f"sqs:{action}": QUEUES
        for action in (
            "CreateQueue",
            "DeleteQueue",
            "GetQueueAttributes",
            "SetQueueAttributes",
            "GetQueueUrl",
            "SendMessage",
            "SendMessageBatch",
            "ReceiveMessage",
            "DeleteMessage",
            "DeleteMessageBatch",
            "ChangeMessageVisibility",
            "TagQueue",
            "PurgeQueue",
        )
    },
    "ssm:PutParameter": PARAMETERS,
    "ssm:DeleteParameter": PARAMETERS,
    "ssm:DeleteParameters": PARAMETERS,
    "ssm:AddTagsToResource": PARAMETERS,
}
# actions whose resources depend on the side: (side, action) -> ARN pattern
AMI_PARAMETERS = "arn:aws:ssm:*:*:parameter/aws/service/*"  # clouds.aws.ec2.CPU_IMAGE_PARAM, GPU_...
# the instance side's secret_env reads (``secret_calls``): any parameter / secret, the user's names being
# unknown here (``cloudtrain permissions --secret`` narrows them: ``permissions.secrets``)
ANY_PARAMETER = "arn:aws:ssm:*:*:parameter/*"
ANY_SECRET = "arn:aws:secretsmanager:*:*:secret:*"
ON_SIDE: dict[tuple[str, str], str] = {
    ("airflow", "ssm:GetParameter"): AMI_PARAMETERS,
    ("instance", "ssm:GetParameter"): ANY_PARAMETER,
    ("instance", "secretsmanager:GetSecretValue"): ANY_SECRET,
}
SECRET_PARAMETERS_SID, SECRETS_SID = "SecretEnvParameters", "SecretEnvSecrets"
SIDS = {AMI_PARAMETERS: "AmiParameters", ANY_PARAMETER: SECRET_PARAMETERS_SID, ANY_SECRET: SECRETS_SID}
# autoscaling:CreateAutoScalingGroup and its tags: only with the run-key tag in the request
REQUEST_TAGGED: frozenset[str] = frozenset(
    {"autoscaling:CreateAutoScalingGroup", "autoscaling:CreateOrUpdateTags"}
)
