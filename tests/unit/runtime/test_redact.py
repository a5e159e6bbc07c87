"""The one redaction rule (pipelines/runtime/redact.py): secret-looking keys keep their key and lose their
value, URIs lose their userinfo and secret query values, free text (messages, tracebacks, reprs)
gets both; what is not secret stays readable. Pure: no Spark, MLflow or files."""
import json

import pytest

from pipelines.runtime.redact import MASK, is_secret_key, redact, redact_text, redact_uri

SECRET = "S3CR3T-VALUE"

# Every spelling of a credential the backends and the product take (pyarrow's S3/GCS, s3fs, adlfs,
# MLflow, AWS environment variables, presigned URLs).
SECRET_KEYS = ["secret_key", "session_token", "password", "token", "access_key", "aws_access_key_id",
               "aws_secret_access_key", "AWS_SESSION_TOKEN", "credentials", "X-Amz-Signature", "X-Amz-Credential",
               "X-Amz-Security-Token", "sas_token", "account_key", "connection_string", "client_secret", "api_key",
               "apikey", "key", "secret", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "passwd",
               "private_key", "Authorization", "sig", "session-token"]
PLAIN_KEYS = ["tracking_uri", "endpoint_override", "region", "cache_key", "session_name", "role_arn", "output",
              "input", "experiment", "run_name", "register_model", "storage_options", "scheme", "max_pixels",
              "feature_cache", "tracking", "keys", "monkey"]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_each_secret_key_keeps_its_key_and_loses_its_value(key):
    assert is_secret_key(key)
    assert redact({key: SECRET, "region": "eu-west-1"}) == {key: MASK, "region": "eu-west-1"}
    for text in (f"{key}={SECRET}", f"--storage-option {key}={SECRET} --epochs 2", f"{{'{key}': '{SECRET}'}}",
                 json.dumps({key: SECRET}), f"{key}='{SECRET}'", f"{key}: {SECRET}", f"https://h/x?{key}={SECRET}&a=1",
                 # a pair right after a plain label: an exception's message in a traceback
                 f"KeyError: 'why: {key}={SECRET}'", f'    raise ValueError("why: {key}={SECRET}")'):
        shown = redact_text(text)
        assert SECRET not in shown and key in shown, (text, shown)


@pytest.mark.parametrize("key", PLAIN_KEYS)
def test_keys_that_are_not_secret_stay_readable(key):
    assert not is_secret_key(key)
    assert redact({key: "visible"}) == {key: "visible"}
    assert redact_text(f"{key}=visible") == f"{key}=visible"


@pytest.mark.parametrize("uri, shown", [
    ("http://alice:hunter2@mlflow.example:5000", "http://***@mlflow.example:5000"),
    ("https://alice:hunter2@mlflow.example/api?x=1", "https://***@mlflow.example/api?x=1"),
    ("http://token-only@127.0.0.1:5000/", "http://***@127.0.0.1:5000/"),
    ("postgresql://mlflow:hunter2@db.internal:5432/mlflow", "postgresql://***@db.internal:5432/mlflow"),
    ("http://alice:hun@ter2@h:1/p", "http://***@h:1/p"),  # an @ inside the password
    ("http://alice:hunter2@[::1]:5000", "http://***@[::1]:5000"),
    ("https://bkt.s3.amazonaws.com/k.jpg?X-Amz-Signature=abc123&X-Amz-Expires=60",
     "https://bkt.s3.amazonaws.com/k.jpg?X-Amz-Signature=***&X-Amz-Expires=60"),
    ("mysql://db/mlflow?user=me&password=hunter2", "mysql://db/mlflow?user=me&password=***"),
    ("sqlite:////tmp/out/mlruns.db", "sqlite:////tmp/out/mlruns.db"),
    ("s3://bucket/runs/etl", "s3://bucket/runs/etl"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
])
def test_uris_lose_their_userinfo_and_secret_query_values(uri, shown):
    assert redact_uri(uri) == shown
    assert redact_text(f"store {uri} cannot be used") == f"store {shown} cannot be used"
    assert redact({"tracking_uri": uri}) == {"tracking_uri": shown}


def test_a_session_token_inside_nested_dicts_and_lists_is_masked_and_the_input_is_unchanged():
    config = {"storage_options": {"endpoint_override": "http://127.0.0.1:9000", "secret_key": SECRET},
              "runs": [{"cluster": {"session_token": SECRET, "region": "eu"}}, ("x", f"password={SECRET}")],
              "epochs": 3, "tracking": True, "empty_password": "", "token": None}
    shown = redact(config)
    assert shown == {"storage_options": {"endpoint_override": "http://127.0.0.1:9000", "secret_key": MASK},
                     "runs": [{"cluster": {"session_token": MASK, "region": "eu"}}, ("x", f"password={MASK}")],
                     "epochs": 3, "tracking": True, "empty_password": "", "token": None}
    assert config["storage_options"]["secret_key"] == SECRET  # a copy: the job still needs the value
    assert redact({"credentials": {"user": "u", "id": 7}}) == {"credentials": MASK}  # a secret key's whole value


def test_a_config_repr_and_a_traceback_quoting_one_are_masked():
    """A dataclass' repr, as an exception or traceback may quote it (a rank's failure record)."""
    from pipelines.training.config import TrainConfig

    config = TrainConfig(data="s3://b/etl", output="s3://b/out", tracking=True,
                         tracking_uri="http://alice:hunter2@127.0.0.1:5000",
                         storage_options={"access_key": "AKIDEXAMPLE", "secret_key": SECRET, "session_token": "T0K3N"})
    text = redact_text(f"Traceback (most recent call last):\nValueError: bad config {config!r}")
    for secret in ("AKIDEXAMPLE", SECRET, "T0K3N", "hunter2", "alice"):
        assert secret not in text, secret
    assert "'secret_key': '***'" in text and "tracking_uri='http://***@127.0.0.1:5000'" in text


def test_an_environment_credential_resolved_into_a_config_is_masked(monkeypatch):
    """``$MLFLOW_TRACKING_URI`` with credentials becomes the config's tracking URI: what the
    manifest, metrics.json and MLflow's params show of that config is masked."""
    from pipelines.runtime.config import to_dict
    from pipelines.etl.config import ETLConfig

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://bob:pa55w0rd@mlflow.example")
    monkeypatch.setenv("PIPELINES_TRACKING", "1")
    config = ETLConfig(input="/tmp/in", output="/tmp/out")
    assert config.tracking_uri == "https://bob:pa55w0rd@mlflow.example"  # the job itself uses it as given
    shown = json.dumps(redact(to_dict(config)))
    assert "pa55w0rd" not in shown and "bob" not in shown and "https://***@mlflow.example" in shown
    assert redact_text("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI export AWS_REGION=eu") == \
        "AWS_SECRET_ACCESS_KEY=*** export AWS_REGION=eu"
    assert redact_text("Authorization: Bearer eyJhbGciOi.x.y") == "Authorization: ***"


def test_masking_twice_changes_nothing_more():
    once = redact_text(f"http://a:b@h?token={SECRET} {{'password': 'pw'}} secret_key={SECRET}")
    assert redact_text(once) == once and SECRET not in once and "pw'" not in once


def test_the_etl_manifest_and_params_show_its_config_masked():
    """What the ETL writes of its config (manifest.json's ``config``, the MLflow params): a
    credentialed tracking URI masked, --storage-option by its keys alone."""
    from pipelines.etl.config import ETLConfig
    from pipelines.etl.summary import shown_config

    config = ETLConfig(input="/tmp/in", output="s3://bucket/etl", tracking=True,
                       tracking_uri="http://alice:hunter2@mlflow.example:5000",
                       storage_options={"access_key": "AKIDEXAMPLE", "secret_key": SECRET})
    shown = json.dumps(shown_config(config))
    assert not [s for s in ("hunter2", "alice", SECRET, "AKIDEXAMPLE") if s in shown], shown
    assert '"tracking_uri": "http://***@mlflow.example:5000"' in shown
    assert '"storage_options": ["access_key", "secret_key"]' in shown


# Issue 36 item 4: the forms the rule missed, several members of each kind, each as it would be seen
# (a command line, a log line, a dict's repr, a URL). The key stays readable in every one.
MISSED_FORMS = {
    "CamelCase keys": [f"SecretAccessKey={SECRET}", f"{{'AccountKey': '{SECRET}'}}", f'"SessionToken": "{SECRET}"',
                       f"AccessKeyId: {SECRET}", f"ClientSecret={SECRET}", f"AWSSecretKey={SECRET}",
                       f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={SECRET}==;EndpointSuffix=x"],
    "a flag with =": [f"--password={SECRET}", f"--token={SECRET}", f"--secret-key={SECRET}", f"-password={SECRET}"],
    "a flag and its value": [f"--token {SECRET} --epochs 2", f"--password {SECRET}", f"-token {SECRET}",
                             f"--client-secret {SECRET}", f"['python', 'x.py', '--token', '{SECRET}']",
                             f"[\"--password\", \"{SECRET}\"]"],
    "a JVM property": [f"-Dfs.s3a.secret.key={SECRET}", f"-Dspark.hadoop.fs.s3a.access.key={SECRET}",
                       f"-Dfs.azure.account.key.acct.blob.core.windows.net={SECRET}", f"-Djavax.net.ssl.keyStorePassword={SECRET}",
                       f"-Dpassword={SECRET}"],
    "a value starting with /": [f"password=/{SECRET}", f"token: /{SECRET}", f"secret_key=/{SECRET}+x=",
                                f"https://h/x?sig=/{SECRET}%2B&se=2030"],
    "PGPASSWORD-style variables": [f"PGPASSWORD={SECRET}", f"export DBPASSWD={SECRET}", f"GHTOKEN={SECRET}",
                                   f"MYSQL_PWD={SECRET}", f"REDIS_PASSWORD={SECRET}", f"APPSECRET={SECRET}"],
    "URL-encoded credentials": [f"password%3D{SECRET}", f"https%3A%2F%2Falice%3A{SECRET}%40host",
                                f"next=https%253A%252F%252Fu%253A{SECRET}%2540h",  # encoded twice
                                f"client_secret%3D{SECRET}%26a%3D1", f"%7B%22token%22%3A%22{SECRET}%22%7D"],
    "signed query strings": [f"https://b.s3.amazonaws.com/k?X-Amz-Signature={SECRET}&X-Amz-Expires=60",
                             f"https://acct.blob.core.windows.net/c/b?sv=2020-08-04&sr=b&sig={SECRET}%3D",
                             f"https://d.cloudfront.net/x?Expires=1&Signature={SECRET}&Key-Pair-Id=APK",
                             f"https://storage.googleapis.com/b/o?X-Goog-Signature={SECRET}&X-Goog-Date=1",
                             f"https://h/x?X-Amz-Credential={SECRET}%2F20240101%2Fus-east-1&X-Amz-Security-Token={SECRET}"],
}


@pytest.mark.parametrize("form, text", [(form, text) for form, texts in MISSED_FORMS.items() for text in texts])
def test_each_form_the_rule_missed_is_masked_and_stays_masked(form, text):
    shown = redact_text(text)
    assert SECRET not in shown and MASK in shown, (form, shown)
    assert redact_text(shown) == shown  # a second pass changes nothing


@pytest.mark.parametrize("text, shown", [
    ("--token S --epochs 2", "--token *** --epochs 2"),
    ("-Dfs.s3a.secret.key=S -Dfs.s3a.endpoint=http://h:9000", "-Dfs.s3a.secret.key=*** -Dfs.s3a.endpoint=http://h:9000"),
    ("password%3DS%26user%3Dme", "password=***&user=me"),  # decoded where it hid a secret
    ("s3://b/my%20photos/a.jpg", "s3://b/my%20photos/a.jpg"),  # left as it is where it hid none
    ("--storage-options-file /home/me/opts.json --data s3://b/etl", "--storage-options-file /home/me/opts.json --data s3://b/etl"),
    ("PGHOST=db PGPASSFILE=/home/me/.pgpass", "PGHOST=db PGPASSFILE=/home/me/.pgpass"),
    ("AccountName=acct;AccountKey=S==", "AccountName=acct;AccountKey=***"),
])
def test_what_the_new_forms_leave_readable(text, shown):
    assert redact_text(text) == shown


@pytest.mark.parametrize("key", ["SecretAccessKey", "AccountKey", "AccessKeyId", "SessionToken", "PGPASSWORD",
                                 "--password", "-Dfs.s3a.secret.key", "ClientSecret", "SharedAccessSignature"])
def test_camel_case_glued_and_flag_spellings_are_secret_keys(key):
    assert is_secret_key(key)


def test_a_long_line_is_redacted_in_linear_time():
    """Rank logs pass every line through the rule: a 200 KB line without spaces (a progress bar,
    base64) takes milliseconds, not the square of its length."""
    import time

    started = time.perf_counter()
    for text in ("y" * 200_000, "x%41" * 50_000, "-" * 200_000):
        assert redact_text(text) == text
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("key", SECRET_KEYS + ["SecretAccessKey", "AccountKey", "PGPASSWORD",
                                               "spark.hadoop.fs.s3a.secret.key", "fs.azure.account.key.a.blob.core.windows.net"])
def test_sparks_redaction_regex_covers_every_secret_key(key):
    import re

    from pipelines.runtime.redact import SPARK_REDACTION_REGEX

    assert re.search(SPARK_REDACTION_REGEX, key), key


def test_sparks_redaction_regex_leaves_sparks_own_settings_readable():
    import re

    from pipelines.runtime.redact import SPARK_REDACTION_REGEX

    for key in ("spark.master", "spark.app.name", "spark.executor.memory", "spark.sql.shuffle.partitions",
                "spark.driver.host", "spark.driver.port", "spark.ui.port", "spark.executor.extraJavaOptions",
                "spark.submit.pyFiles", "spark.executorEnv.LC_ALL", "java.class.path", "sun.java.command"):
        assert not re.search(SPARK_REDACTION_REGEX, key), key


# The forms of a secret, one line each: (form, as it is written or printed, as it must be shown).
# A new form is one more line here.
FORMS = [
    ("Location.options", f"options=(('access_key', 'AKID'), ('secret_key', '{SECRET}'))",
     "options=(('access_key', '***'), ('secret_key', '***'))"),
    ("Location.options", f"(('endpoint_override', 'http://h:9000'), ('session_token', '{SECRET}'))",
     "(('endpoint_override', 'http://h:9000'), ('session_token', '***'))"),
    ("dict.items()", f"dict_items([('region', 'eu'), (\"password\", \"{SECRET}\")])",
     "dict_items([('region', 'eu'), (\"password\", \"***\")])"),
    ("a pair of bytes", f"(b'token', b'{SECRET}')", "(b'token', b'***')"),
    ("a pair's key alone", "('secret_key',)", "('secret_key',)"),
    ("a list of key names", '"storage_options": ["access_key", "secret_key"]', '"storage_options": ["access_key", "secret_key"]'),
    ("a bytes value", f"{{'secret_key': b'{SECRET}', 'region': b'eu'}}", "{'secret_key': b'***', 'region': b'eu'}"),
    ("a bytes value", f'{{"token": b"{SECRET}"}}', '{"token": b"***"}'),
    ("a bytes value", f"Options(password=b'{SECRET}', retries=3)", "Options(password=b'***', retries=3)"),
    ("a bytes value", f"b'secret_key': b'{SECRET}'", "b'secret_key': b'***'"),
    ("a tab-separated key", f"secret_key\t{SECRET}", "secret_key\t***"),
    ("a tab-separated key", f"aws_secret_access_key \t {SECRET}\nregion\teu-west-1",
     "aws_secret_access_key \t ***\nregion\teu-west-1"),
    ("a tab-separated key", f"AWS_SESSION_TOKEN\t\t{SECRET}", "AWS_SESSION_TOKEN\t\t***"),
    ("a bare bearer token", f"401 Unauthorized: Bearer eyJhbGciOiJIUzI1NiJ9.{SECRET}.sig",
     "401 Unauthorized: Bearer ***"),
    ("a bare bearer token", f"requests sent bearer {SECRET} to http://h", "requests sent bearer *** to http://h"),
    ("a bare bearer token", f"'Bearer dGhpcy1pcy1{SECRET}=='", "'Bearer ***'"),
    ("a bearer token after its header", f"Authorization: Bearer {SECRET}", "Authorization: ***"),
    ("words, not a token", "the bearer of the news; WWW-Authenticate: Bearer realm=api",
     "the bearer of the news; WWW-Authenticate: Bearer realm=api"),
]


@pytest.mark.parametrize("form, text, shown", FORMS, ids=[f"{form}: {text[:40]}" for form, text, _ in FORMS])
def test_each_form_of_a_secret_is_shown_as_the_table_says(form, text, shown):
    assert redact_text(text) == shown
    assert redact_text(shown) == shown  # a second pass changes nothing


# The same for objects (redact): (form, value, as it must come back).
OBJECT_FORMS = [
    ("Location.options", (("access_key", "AKID"), ("secret_key", SECRET)), (("access_key", MASK), ("secret_key", MASK))),
    ("Location.options", (("endpoint_override", "http://h:9000"),), (("endpoint_override", "http://h:9000"),)),
    ("a pair of bytes", (b"token", SECRET.encode()), (b"token", MASK)),
    ("a list of key names", ["access_key", "secret_key"], ["access_key", "secret_key"]),
    ("an argv", ["python", "x.py", "--token", SECRET, "--epochs", "2"], ["python", "x.py", "--token", MASK, "--epochs", "2"]),
    ("a bytes value", b"password=" + SECRET.encode() + b"&a=1", b"password=***&a=1"),
    ("a bytes value", {"secret_key": SECRET.encode(), "note": b"\xff plain"}, {"secret_key": MASK, "note": b"\xff plain"}),
    ("a bytes value in a list", [b"token=" + SECRET.encode()], [b"token=***"]),
]


@pytest.mark.parametrize("form, value, shown", OBJECT_FORMS, ids=[f"{form}: {i}" for i, (form, _, _) in enumerate(OBJECT_FORMS)])
def test_each_object_form_of_a_secret_is_masked_as_the_table_says(form, value, shown):
    assert redact(value) == shown
    assert redact(shown) == shown
