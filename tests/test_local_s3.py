"""The throwaway S3 server of the quickstart and the tests (`marin_data.testing.local_s3`)."""

from __future__ import annotations

import boto3
from botocore.config import Config

from marin_data.testing.local_s3 import create_bucket, local_s3_server


def test_the_server_keeps_answering_after_thousands_of_logged_requests():
    # moto logs a line per request: written to a pipe nobody read, ~800 requests filled it and froze the server.
    with local_s3_server() as endpoint:
        create_bucket(endpoint, "logged-requests")
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                              aws_secret_access_key="testing",
                              config=Config(read_timeout=10, connect_timeout=5, retries={"max_attempts": 1}))
        client.put_object(Bucket="logged-requests", Key="k", Body=b"x")
        for _ in range(2000):
            assert client.head_object(Bucket="logged-requests", Key="k")["ContentLength"] == 1
