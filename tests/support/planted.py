"""Secrets the tests plant (in storage options, the environment, an owner-only file) to check
that no command line, log or page shows them."""
import json

SECRET = "S3CR3T-FROM-A-FILE"
ENV_SECRET = "S3CR3T-FROM-THE-ENV"
URIS = ["--data", "s3://bucket/etl", "--output", "s3://bucket/out", "--no-tracking"]


def options_file(folder, options, mode=0o600):
    path = folder / "storage.json"
    path.write_text(json.dumps(options))
    path.chmod(mode)
    return str(path)
