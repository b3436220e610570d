"""Every benchmark runs end to end on a tiny workload and reports sane figures beside
its peers. Speed itself is never asserted (DESIGN §10): only that the numbers exist,
are positive and are self-consistent."""

from __future__ import annotations

import json
import math

import pytest

import benchmarks as bench

# kafka-python (the codec peer) warns about its own use of importlib.resources
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TINY = bench.BenchConfig(records=3000, durable_records=600, e2e_records=60,
                         e2e_interval_us=200, open_partitions=4, recover_mb=2,
                         peer_records_cap=600, progress=False)


def finite_positive(x) -> bool:
    return x is not None and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """One tiny run of all benchmarks, shared by the checks below (about 10 s)."""
    from dataclasses import replace
    config = replace(TINY, directory=str(tmp_path_factory.mktemp("bench")))
    return bench.run(list(bench.BENCHMARKS), config)


def rows(results, name):
    return [r for r in results if r.benchmark == name]


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


def test_codec_peer_is_kafka_python(results):
    """The codec benchmark measures kafka-python's builder and parser on the same records."""
    systems = " ".join(r.system for r in results if r.benchmark.startswith("codec"))
    assert "kafka-python" in systems and "pure Python" in systems


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


def test_peak_memory_is_reported(results):
    """logkit rows report the process's peak RSS."""
    for r in results:
        if r.headline:
            assert finite_positive(r.peak_rss_mb), r


def test_table_and_json_output(results, tmp_path, capsys):
    """The table names every row; --json writes a document machines can read."""
    table = bench.format_table(results)
    for r in results:
        assert r.system[:40] in table
    assert bench.format_table(results, markdown=True).startswith("| benchmark |")
    out = tmp_path / "r.json"
    assert bench.main(["open", "--open-partitions", "2", "--quiet", "--json", str(out),
                       "--dir", str(tmp_path)]) == 0
    document = json.loads(out.read_text())
    assert document["results"][0]["benchmark"] == "open"
    assert "speedups" in document["environment"]
    assert "open" in capsys.readouterr().out


def test_unknown_benchmark_is_a_usage_error(capsys):
    assert bench.main(["nope", "--quiet"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err
