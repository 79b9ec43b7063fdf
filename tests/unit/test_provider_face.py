"""The registry is the one switch from a cloud name, a provider or a bucket scheme to a provider's face,
and both providers answer the same questions the same way (``core.provider``, ``core.backend``)."""

from __future__ import annotations

import inspect

import pytest

from airflow_cloudtrain.clouds import registry
from airflow_cloudtrain.contract.clouds import CLOUDS
from airflow_cloudtrain.core.backend import RunBackend
from airflow_cloudtrain.core.provider import Provider


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_every_cloud_name_has_a_face_whose_bucket_scheme_leads_back_to_it(cloud: str) -> None:
    face = registry.provider_for_cloud(cloud)
    assert face.name == CLOUDS[cloud]
    assert registry.provider_for_scheme(face.scheme) is face
    assert registry.provider(face.name) is face


def test_unknown_names_and_schemes_are_refused_naming_the_accepted_ones() -> None:
    with pytest.raises(
        ValueError, match=r"cloud='azure' is not valid: use one of ec2, ec2spot, gcloud, gcspot"
    ):
        registry.provider_for_cloud("azure")
    with pytest.raises(ValueError, match=r"scheme 'file' is not valid: use one of s3, gs"):
        registry.provider_for_scheme("file")
    with pytest.raises(ValueError, match=r"provider='azure' is not valid: use one of aws, gcp"):
        registry.provider("azure")
    with pytest.raises(ValueError, match=r"provider='kafka' is not valid: use one of sqs, pubsub"):
        registry.depth_reader("kafka", None, None)


def test_a_run_s_wait_and_a_sensor_s_share_gce_s_listing_but_not_ec2_s_ended_only_describe() -> None:
    aws, gcp = registry.provider("aws"), registry.provider("gcp")
    assert aws.poll_key("c", "us-east-1", None, True) != aws.poll_key("c", "us-east-1", None, False)
    assert gcp.poll_key("c", "us-central1-a", "p", True) == gcp.poll_key("c", "us-central1-a", "p", False)
    for face in (aws, gcp):  # the triggerer's pool finds the face again from the key alone
        assert face.poll_key("c", "x", "p", False)[:2] == (face.name, "c")
    assert (aws.conn(None), gcp.conn(None)) == (None, "google_cloud_default")


def test_both_providers_store_run_secrets_through_one_signature() -> None:
    from airflow_cloudtrain.clouds.aws import secrets as aws_secrets
    from airflow_cloudtrain.clouds.gcp import secrets as gcp_secrets

    def shape(fn: object) -> list[tuple[str, object]]:
        params = inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
        return [(p.name, p.default) for p in params]

    assert shape(aws_secrets.put_secret) == shape(gcp_secrets.put_secret)


@pytest.mark.parametrize("name", ["aws", "gcp"])
def test_each_face_and_backend_has_every_member_of_its_protocol(name: str) -> None:
    """mypy checks the types (``backend_for`` returns a ``RunBackend``); this checks no member is missing."""
    face = registry.provider(name)
    backend_class = type(face).backend.__annotations__["return"]
    module = inspect.getmodule(type(face))
    backend_type = getattr(module, backend_class) if isinstance(backend_class, str) else backend_class
    for protocol, obj in ((Provider, type(face)), (RunBackend, backend_type)):
        members = {m for m in dir(protocol) if not m.startswith("_")} | set(protocol.__annotations__)
        missing = sorted(m for m in members if not hasattr(obj, m) and m not in ("region",))
        assert not missing, (protocol.__name__, obj.__name__, missing)
