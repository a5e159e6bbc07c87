"""Secrets off what real ranks show (issue 36 item 4): a barrier task's rank and local ranks get
the storage options through owner-only files, never their command lines, and their kept
output is redacted; Spark's UI redaction on the suite's session covers the product's keys (the
options' sources and warnings: tests/unit/launch/test_secrets.py)."""
import json
import os

from pipelines.runtime.config import parse_configs
from pipelines.training.config import TrainConfig
from tests.support.planted import ENV_SECRET, SECRET, URIS, options_file


def test_a_real_ranks_command_line_holds_no_secret_from_the_environment_or_the_file(tmp_path, monkeypatch):
    """A barrier task's rank (pipelines.launch.child.run_child, a real child process) gets the
    config through an owner-only file: its command line, what ``ps`` shows every local user,
    names that file only, and the config it runs holds the secrets."""
    import cloudpickle

    from pipelines.launch.child import run_child

    monkeypatch.setenv("PIPELINES_STORAGE_OPTIONS", json.dumps({"session_token": ENV_SECRET}))
    path = options_file(tmp_path, {"secret_key": SECRET})
    (config,) = parse_configs((TrainConfig,), URIS + ["--storage-options-file", path])

    def rank_main(config):
        import os
        import stat

        with open("/proc/self/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
        job = next(item for item in argv if item.endswith("job.pkl"))
        return {"argv": argv, "job_mode": stat.S_IMODE(os.stat(job).st_mode), "options": config.storage_options}

    record = run_child(cloudpickle.dumps((rank_main, {"config": config})), dict(os.environ), 0)
    assert record["status"] == "ok", record
    seen = cloudpickle.loads(__import__("base64").b64decode(record["result"]))
    assert seen["options"] == {"session_token": ENV_SECRET, "secret_key": SECRET}
    assert seen["job_mode"] == 0o600
    argv = " ".join(seen["argv"])
    assert "pipelines.launch.child" in argv and SECRET not in argv and ENV_SECRET not in argv


def test_sparks_ui_hides_the_products_secret_keys(spark):
    """Spark's own redaction (what its UI's environment page and event log show) with the session's
    ``spark.redaction.regex``: the product's keys, a spark-submit command line carrying one, an
    Azure account key setting; Spark's own settings stay readable."""
    from pipelines.runtime.redact import SPARK_REDACTION_REGEX

    sc = spark.sparkContext
    assert sc.getConf().get("spark.redaction.regex") == SPARK_REDACTION_REGEX
    jvm = sc._jvm
    pairs = jvm.java.util.ArrayList()
    shown = {"sun.java.command": f"org.apache.spark.deploy.SparkSubmit jobs/etl.py --storage-option key={SECRET}",
             "spark.hadoop.fs.azure.account.key.acct.blob.core.windows.net": SECRET,
             "AccountKey": SECRET, "PGPASSWORD": SECRET, "spark.executorEnv.AWS_SESSION_TOKEN": SECRET,
             "spark.app.name": "pipelines-tests", "spark.master": "local[2]"}
    for key, value in shown.items():
        pairs.add(jvm.scala.Tuple2(key, value))
    redacted = jvm.org.apache.spark.util.Utils.redact(sc._jsc.sc().conf(),
                                                      jvm.org.apache.spark.api.python.PythonUtils.toSeq(pairs))
    result = {redacted.apply(i)._1(): redacted.apply(i)._2() for i in range(redacted.length())}
    assert [key for key, value in result.items() if SECRET in value] == []
    assert result["spark.app.name"] == "pipelines-tests" and result["spark.master"] == "local[2]"


def test_a_local_ranks_command_line_holds_no_secret(monkeypatch, tmp_path):
    """A local rank (``HorovodRunner(np=-1)``: pipelines.launch.local.run_local, Horovod's Gloo
    launcher, a real child process) gets the config's storage options, secrets included, through
    its owner-only job folder; its command line names only the files there."""
    from pipelines.launch.local import run_local

    monkeypatch.setenv("PIPELINES_STORAGE_OPTIONS", json.dumps({"secret_key": ENV_SECRET}))
    (config,) = parse_configs((TrainConfig,), URIS)

    def rank_main(options):
        import os
        import stat

        with open("/proc/self/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
        folders = {os.path.dirname(item) for item in argv if item.endswith(".pkl")}
        return {"argv": argv, "modes": [stat.S_IMODE(os.stat(d).st_mode) for d in folders], "options": options}

    seen = run_local(rank_main, {"options": config.storage_options}, 1, None, None)
    assert seen["options"] == {"secret_key": ENV_SECRET}
    assert seen["modes"] == [0o700] and ENV_SECRET not in " ".join(seen["argv"])


def test_a_local_ranks_kept_output_is_owner_only_and_redacted(tmp_path, capfd):
    """What a local rank prints (its stdout and stderr, a chained traceback among them) reaches the
    driver's console and ``LOG_DIR/rank.R/stdout`` and ``stderr`` redacted, those files mode 0600 in
    a 0700 folder."""
    import stat

    from pipelines.launch.local import run_local

    def rank_main():
        import sys
        import traceback

        print(f"retrying with --storage-option secret_key={SECRET}", flush=True)
        try:
            try:
                raise KeyError(f"{{'AccountKey': '{SECRET}'}}")
            except KeyError as exc:
                raise RuntimeError(f"https://acct.blob.core.windows.net/c?sv=1&sig={SECRET}") from exc
        except RuntimeError:
            traceback.print_exc(file=sys.stderr)
        return "done"

    assert run_local(rank_main, {}, 1, None, str(tmp_path / "logs")) == "done"
    folder = tmp_path / "logs" / "rank.0"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    out, err = (folder / "stdout").read_text(), (folder / "stderr").read_text()
    console = capfd.readouterr()
    for path in (folder / "stdout", folder / "stderr"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for text in (out, err, console.out, console.err):
        assert SECRET not in text
    assert "secret_key=***" in out and "The above exception was the direct cause" in err
    assert "'AccountKey': '***'" in err and "sig=***" in err
