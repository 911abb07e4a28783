"""agentq's boto3 sessions share one model loader per process, each keeping its own
region and keys."""

from __future__ import annotations

from agentq.aws import AwsClients, new_session


def test_sessions_share_the_service_models_and_keep_their_own_keys() -> None:
    first = new_session("eu-west-1", access_key_id="AKIAFIRST", secret_access_key="one")
    second = new_session("us-east-1", access_key_id="AKIASECOND", secret_access_key="two")

    loader = first._session.get_component("data_loader")
    assert second._session.get_component("data_loader") is loader
    sqs = first.client("sqs", endpoint_url="http://127.0.0.1:1")
    dynamodb = second.client("dynamodb", endpoint_url="http://127.0.0.1:1")
    # The second session's client read its model from the loader's cache.
    assert dynamodb.meta.service_model.service_name == "dynamodb"
    assert any(key[0] == "load_service_model" for key in loader._cache)
    assert (sqs.meta.region_name, dynamodb.meta.region_name) == ("eu-west-1", "us-east-1")
    assert first.get_credentials().access_key == "AKIAFIRST"
    assert second.get_credentials().access_key == "AKIASECOND"


def test_the_process_clients_sign_with_the_keys_they_are_given() -> None:
    clients = AwsClients("eu-west-1", credentials={"AWS_ACCESS_KEY_ID": "AKIAOPERATOR",
                                                   "AWS_SECRET_ACCESS_KEY": "s"})  # fmt: skip
    assert clients.sqs._request_signer._credentials.access_key == "AKIAOPERATOR"
