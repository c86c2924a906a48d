"""The throwaway S3 server of the quickstart and the tests (`marin_data.testing.local_s3`)."""

from __future__ import annotations

import boto3
from botocore.config import Config

from marin_data.testing.local_s3 import create_bucket, local_s3_server


def test_the_server_keeps_answering_after_its_request_log_outgrows_a_pipe():
    # moto logs a line per request: written to a pipe nobody read, ~800 requests (64 KiB) filled it and froze
    # the server. A 1000-byte key makes each line ~1 KiB: 300 requests log ~300 KiB, as 4000 with a short key.
    key = "k" * 1000
    with local_s3_server() as endpoint:
        create_bucket(endpoint, "logged-requests")
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                              aws_secret_access_key="testing",
                              config=Config(read_timeout=10, connect_timeout=5, retries={"max_attempts": 1}))
        client.put_object(Bucket="logged-requests", Key=key, Body=b"x")
        for _ in range(300):
            assert client.head_object(Bucket="logged-requests", Key=key)["ContentLength"] == 1
