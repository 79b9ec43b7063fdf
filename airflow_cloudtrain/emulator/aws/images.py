"""An image to launch in the emulated EC2, found the cheap way (tests, benchmarks, a user's own checks).

moto knows 1,301 Amazon images in every region. Listing them all (``describe_images(Owners=["amazon"])``,
the usual way to get "any image") costs about 1.5 CPU-seconds a call between moto's XML serializer and
botocore's parser, while a launch in the emulator needs only some image id that exists."""

from __future__ import annotations

from typing import Any

AMAZON_LINUX = "al2023-ami-2023*"  # the images the product's own default (the AL2023 SSM parameter) names


def an_image(ec2: Any) -> str:
    """The id of an Amazon Linux 2023 image in ``ec2``'s region (a boto3 EC2 client): one small answer."""
    images = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "name", "Values": [AMAZON_LINUX]}])
    return str(images["Images"][0]["ImageId"])
