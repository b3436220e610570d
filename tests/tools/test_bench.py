"""Every benchmark of the `benchmarks` package runs end to end on a tiny workload, reports
sane figures beside its peers and writes its JSON. Speed itself is never asserted
(docs/benchmarks.md, Targets): only that the numbers exist, are positive and are self-consistent."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, replace

import pytest

import benchmarks
from benchmarks import codec

# kafka-python (the codec peer) warns about its own use of importlib.resources
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TINY = benchmarks.BenchConfig(records=3000, durable_records=600, e2e_records=60,
                              e2e_interval_us=200, open_partitions=4, recover_mb=2,
                              peer_records_cap=600, progress=False)
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def finite_positive(x) -> bool:
    return x is not None and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """One tiny run of all benchmarks, shared by the checks below (about 10 s)."""
    config = replace(TINY, directory=str(tmp_path_factory.mktemp("bench")))
    return benchmarks.run(list(benchmarks.BENCHMARKS), config)


def rows(results, name):
    return [r for r in results if r.benchmark == name]


def test_every_benchmark_is_a_module_of_the_package(results):
    """One module per benchmark; each one's rows appear in a run of all of them."""
    ran = {r.benchmark.split("-")[0] for r in results}
    assert ran == set(benchmarks.BENCHMARKS)
    for name in benchmarks.BENCHMARKS:
        module = benchmarks.MODULES[name]
        assert os.path.isfile(os.path.join(CHECKOUT, "benchmarks", module + ".py")), name


def test_help_names_every_benchmark_module():
    """`python -m benchmarks --help` names the benchmarks of `all` and, found in the
    package, those with their own command line."""
    text = benchmarks.build_parser().format_help()
    for name in benchmarks.BENCHMARKS:
        assert f"  {name} " in text, name
    found = set(benchmarks.standalone())
    assert {"wakeup_latency", "spark_read", "spark_write"} <= found
    assert not found & set(benchmarks.MODULES.values()) and "_common" not in found
    for name in benchmarks.standalone():
        assert f"python -m benchmarks.{name} --help" in text, name


@pytest.mark.parametrize("name", ["codec-encode", "codec-decode", "produce", "consume",
                                  "durable"])
def test_throughput_rows_are_sane(results, name):
    """Throughput benchmarks report a positive rate for logkit and every peer, and a
    ratio for each peer against logkit's headline row."""
    got = rows(results, name)
    heads = [r for r in got if r.headline]
    assert len(heads) == 1, got
    peers = [r for r in got if not r.headline]
    assert peers, f"{name} has no peer"
    for r in got:
        assert finite_positive(r.records_per_s), r
        if r.note != "anchor":
            assert r.records > 0 and finite_positive(r.seconds), r
            assert finite_positive(r.mb_per_s), r
    for r in peers:
        assert finite_positive(r.ratio), r


def test_codec_compares_compiled_pure_python_and_kafka_python(results):
    """The codec benchmark measures logkit's codec as loaded, logkit's pure-Python codec
    (from a LOGKIT_PURE_PYTHON=1 child process) and kafka-python, on the same records."""
    for name in ("codec-encode", "codec-decode"):
        got = rows(results, name)
        systems = [r.system for r in got]
        assert any("kafka-python" in s for s in systems), systems
        pure = [r for r in got if f"pure Python, {codec.PURE_PYTHON_ENV}=1" in r.system]
        assert len(pure) == 1 and not pure[0].headline, systems
        assert {r.records for r in got} == {TINY.records}, got


def test_codec_child_refuses_to_report_the_compiled_codec_as_pure_python():
    """Started without LOGKIT_PURE_PYTHON, the pure-Python child fails instead of
    measuring whatever codec it loaded under the pure-Python label."""
    env = {k: v for k, v in os.environ.items() if k != codec.PURE_PYTHON_ENV}
    env["PYTHONPATH"] = CHECKOUT
    proc = subprocess.run([sys.executable, "-m", "benchmarks.codec",
                           json.dumps(asdict(replace(TINY, records=10)))],
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stdout
    assert codec.PURE_PYTHON_ENV in proc.stderr and proc.stdout == ""


def test_every_peer_kind_is_present(results):
    """SQLite, persist-queue, os.write and the Kafka 2014 anchor appear in the run."""
    systems = " ".join(r.system for r in results)
    for peer in ("SQLite WAL", "persist-queue", "os.write", "kafka-python", "Kafka 2014"):
        assert peer in systems, peer


def test_e2e_latency_percentiles_are_ordered(results):
    """Latency rows carry p50 <= p99 <= p99.9 <= max, from every record sent."""
    got = [r for r in rows(results, "e2e") if r.note != "anchor"]
    assert len(got) >= 3
    for r in got:
        assert r.records == TINY.e2e_records, r
        assert 0 < r.latency_us_p50 <= r.latency_us_p99 <= r.latency_us_p999 \
            <= r.latency_us_max, r


def test_open_and_recover_are_sane(results):
    """open reports a median time per open; recover a byte rate over the whole log."""
    opened = rows(results, "open")
    assert all(finite_positive(r.extra["open_ms_median"]) for r in opened)
    recovered = [r for r in rows(results, "recover") if r.headline][0]
    assert recovered.records > 0 and finite_positive(recovered.mb_per_s)
    assert recovered.extra["gb_per_s"] * 1000 == pytest.approx(recovered.mb_per_s)
    assert len(rows(results, "recover")) >= 3


def test_peak_memory_is_reported(results):
    """logkit rows report the process's peak RSS."""
    for r in results:
        if r.headline:
            assert finite_positive(r.peak_rss_mb), r


def test_table_and_json_output(results, tmp_path, capsys):
    """The table names every row; --json writes a document machines can read."""
    table = benchmarks.format_table(results)
    for r in results:
        assert r.system[:40] in table
    assert benchmarks.format_table(results, markdown=True).startswith("| benchmark |")
    out = tmp_path / "r.json"
    assert benchmarks.main(["open", "--open-partitions", "2", "--quiet", "--json", str(out),
                            "--dir", str(tmp_path)]) == 0
    document = json.loads(out.read_text())
    assert document["results"][0]["benchmark"] == "open"
    assert "speedups" in document["environment"]
    assert document["config"]["open_partitions"] == 2
    assert "open" in capsys.readouterr().out


def test_unknown_benchmark_is_a_usage_error(capsys):
    assert benchmarks.main(["nope", "--quiet"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err
    assert benchmarks.main(["open", "--records", "0", "--quiet"]) == 2
    assert "--records" in capsys.readouterr().err


def test_python_dash_m_benchmarks_runs_from_the_checkout(tmp_path):
    """`python -m benchmarks open` from the checkout's root, in a real process."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "open", "--open-partitions",
                           "2", "--quiet", "--dir", str(tmp_path), "--json", "-"],
                          cwd=CHECKOUT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["results"][0]["benchmark"] == "open"


def test_wakeup_latency_runs_and_writes_its_json(tmp_path):
    """benchmarks.wakeup_latency (its own command line) runs small and writes its JSON:
    one row per system, every record seen, percentiles in order."""
    out = tmp_path / "wakeup.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.wakeup_latency", "--records",
                           "20", "--interval-us", "2000", "--json", str(out)],
                          cwd=CHECKOUT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    document = json.loads(out.read_text())
    assert document["records"] == 20 and len(document["results"]) >= 4
    for row in document["results"]:
        assert row["records"] == 20, row
        assert 0 < row["p50_us"] <= row["p99_us"] <= row["max_us"], row


@pytest.mark.parametrize("name", ["spark_read", "spark_write"])
def test_spark_benchmarks_load_as_modules_of_the_package(name):
    """benchmarks.spark_read / spark_write load from the package and answer --help. A
    real run starts a JVM (minutes on this machine), so the suite leaves it to
    `python -m benchmarks.spark_read`; test_spark.py covers the data source itself."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--help"],
                          cwd=CHECKOUT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--records" in proc.stdout and "parquet" in proc.stdout.lower()


def test_logkit_bench_without_the_checkout_says_how_to_get_it(tmp_path):
    """A logkit installed without the checkout (as from a wheel) has no benchmarks:
    `logkit bench` exits 1 and says where the suite is, and its --help says the same."""
    site = tmp_path / "site"
    shutil.copytree(os.path.join(CHECKOUT, "logkit"), site / "logkit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(site))
    code = "import sys; from logkit import cli; sys.exit(cli.main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, "bench", "open"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "not installed with logkit" in proc.stderr and "make bench" in proc.stderr
    proc = subprocess.run([sys.executable, "-c", code, "bench", "--help"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "python -m benchmarks" in proc.stdout, proc.stderr


def test_scaling_quick_runs_and_writes_its_json(tmp_path):
    """benchmarks.scaling (its own command line) runs its --quick size: one row per
    partition count, every rate positive, descriptors and index cache counted."""
    out = tmp_path / "scaling.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.scaling", "--quick", "--dir",
                           str(tmp_path), "--json", str(out)],
                          cwd=CHECKOUT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    document = json.loads(out.read_text())
    from benchmarks import scaling
    assert [r["partitions"] for r in document["rows"]] == list(scaling.QUICK_POINTS)
    for row in document["rows"]:
        for key in ("produce_rate", "consume_rate", "read_loop_rate", "floor_write_rate",
                    "sqlite_produce_rate", "sqlite_consume_rate", "create_topic_s",
                    "create_floor_s", "producer_fds_per_partition", "batch_records_mean"):
            assert finite_positive(row[key]), (key, row)
        assert row["index_cache_kib_per_partition"] >= 0, row
    reopened = document["reopen"]
    assert reopened["torn_bytes_checked"] > 0
    for key in ("clean_reopen_s", "torn_reopen_s", "floor_s", "reader_repair_s"):
        assert finite_positive(reopened[key]), (key, reopened)


def test_curves_quick_runs_every_curve_and_draws_it(tmp_path):
    """benchmarks.curves (its own command line) runs its --quick size: every curve's
    rows beside their floors, positive and self-consistent, and one PNG per curve."""
    out = tmp_path / "curves.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.curves", "--quick", "--dir",
                           str(tmp_path), "--json", str(out), "--plots", str(tmp_path)],
                          cwd=CHECKOUT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    document = json.loads(out.read_text())
    from benchmarks import curves
    assert [r["partitions"] for r in document["create"]] == \
        list(curves.QUICK["create_points"])
    checks = {"create": ("create_s", "create_floor_s", "reopen_s", "reopen_floor_s"),
              "seek": ("read_us_p50", "read_us_p99", "floor_us_p50"),
              "values": ("produce_mb_per_s", "consume_mb_per_s", "write_mb_per_s",
                         "read_mb_per_s"),
              "rebalance": ("rebalance_ms", "floor_ms"),
              "writers": ("logkit_rate", "floor_rate", "sqlite_rate")}
    for name, keys in checks.items():
        assert document[name], name
        for row in document[name]:
            for key in keys:
                assert finite_positive(row[key]), (name, key, row)
    for row in document["seek"]:
        assert row["read_us_p50"] <= row["read_us_p99"] and row["records"] > 0, row
    rss = document["rss"]
    assert rss["records"] > 0 and finite_positive(rss["consumer_rss_mib"])
    assert rss["consumer_anon_mib"] + rss["consumer_file_mib"] <= \
        rss["consumer_rss_mib"] + 1, rss
    pytest.importorskip("matplotlib")
    for name in curves.CURVES:
        assert (tmp_path / f"curves-{name}.png").stat().st_size > 0, name


def test_objectstore_quick_runs_and_writes_its_json(tmp_path):
    """benchmarks.objectstore (its own command line) runs its --quick size against
    file:// and moto's S3 server: lag percentiles in order for each store, and per pass
    the chunked tail uploads what was appended while the whole tail uploads more."""
    pytest.importorskip("moto.server", reason="the test extra (moto[server]) is needed")
    out = tmp_path / "objectstore.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.objectstore", "--quick",
                           "--dir", str(tmp_path), "--json", str(out)],
                          cwd=CHECKOUT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    document = json.loads(out.read_text())
    assert len(document["lag"]) == 2
    for row in document["lag"]:
        assert row["seen"] == row["records"] > 0, row
        assert 0 < row["lag_ms_p50"] <= row["lag_ms_p99"] <= row["lag_ms_max"], row
    by_mode = {(r["store"], r["mode"]): r for r in document["per_pass"]}
    assert len(by_mode) == 4
    for (store, mode), row in by_mode.items():
        assert row["passes"] == document["passes"] and row["segments"] == 1, row
        if mode == "chunks":
            assert row["uploaded_bytes_total"] == \
                row["appended_bytes_per_pass"] * row["passes"], row
            assert row["objects_per_pass_max"] == 1, row
        else:
            assert row["uploaded_bytes_last"] == \
                row["appended_bytes_per_pass"] * row["passes"], row
    assert not list(tmp_path.glob("logkit-bench-objectstore-*"))      # cleaned up


def test_failover_quick_runs_and_writes_its_json(tmp_path):
    """benchmarks.failover (its own command line) runs its --quick size: every round
    SIGKILLs the leader process and times the promotion and the new leader's first
    accepted write; the figures are positive and in order, beside the documented ones."""
    out = tmp_path / "failover.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.failover", "--quick", "--dir",
                           str(tmp_path), "--json", str(out)],
                          cwd=CHECKOUT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    document = json.loads(out.read_text())
    from benchmarks import failover
    assert document["rounds"] == failover.QUICK_ROUNDS and document["ttl_ms"] == 1000
    for key in ("detect_s", "first_write_s"):
        row = document[key]
        assert 0 < row["min"] <= row["median"] <= row["p90"] <= row["max"], (key, row)
    assert document["detect_s"]["min"] <= document["first_write_s"]["min"]
    assert [r["seconds"] for r in document["documented"]] == [11.0, 30.0]
    assert not list(tmp_path.glob("logkit-bench-failover-*"))          # cleaned up
