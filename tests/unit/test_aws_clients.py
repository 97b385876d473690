"""Clients made by the process's one boto3 session (ndstore/storage/aws.py): each signs with its
own credentials, and threads may make them at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ndstore.storage.aws import Credentials, aws_client, new_client


def _signing_key(client: object) -> str:
    return client._request_signer._credentials.get_frozen_credentials().access_key  # type: ignore[attr-defined]


def test_clients_of_one_session_keep_their_own_credentials() -> None:
    alice = aws_client("s3", "http://127.0.0.1:9", "us-east-1", 2, credentials=Credentials("ALICE", "a-secret"))
    bob = new_client("s3", Credentials("BOB", "b-secret", "b-token"), region_name="us-east-1")
    default = aws_client("s3", "http://127.0.0.1:9", "us-east-1", 2)  # boto3's chain: the suite's environment
    assert _signing_key(alice) == "ALICE"
    assert _signing_key(bob) == "BOB"
    assert bob._request_signer._credentials.token == "b-token"
    assert _signing_key(default) == "testing"


def test_threads_make_clients_at_once() -> None:
    def make(i: int) -> str:
        service = ("s3", "dynamodb", "sqs")[i % 3]
        return _signing_key(aws_client(service, "http://127.0.0.1:9", "us-east-1", 2,
                                       credentials=Credentials(f"KEY{i}", "secret")))

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(make, range(24))) == [f"KEY{i}" for i in range(24)]
