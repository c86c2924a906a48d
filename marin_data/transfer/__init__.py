"""Moving a corpus between local disk and stores: publishing (`publish_s3`, `publish_hf`), downloading
(`plan`, `fetch`, `partial`, `download`) and checking a published copy in place (`remote_verify`)."""
