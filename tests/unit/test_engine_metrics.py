"""The one parser of vLLM's /metrics: the recorded vLLM 0.32 scrapes and the
simulator's read as the engine reported them, older vLLM names still read,
data-parallel engines of one server combined, a scrape that is not a
whole vLLM exposition refused instead of read as an idle engine, and the
parser's own reading of sample lines checked against prometheus_client's."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from shoal.engine.errors import BadMetrics
from shoal.engine.metrics import KVPool, MetricsSnapshot, parse, total
from shoal.sim.metrics import EngineMetrics as SimulatedEngineMetrics
from tests.sim_fixtures import text
from tests.unit.test_sim_metrics import CONFIG

LOAD = (
    'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
    'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
    'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
)


def test_a_loaded_vllm_scrape_reads_as_the_engine_reported_it() -> None:
    loaded = parse(text("metrics.loaded.txt"))
    # The fixture's README: running 5, waiting 5, KV usage 0.87, 6 preemptions so far.
    assert (loaded.running, loaded.waiting, loaded.in_flight) == (5.0, 5.0, 10.0)
    assert loaded.kv_usage == pytest.approx(0.873, abs=1e-3)
    assert loaded.preemptions == 6.0
    assert (loaded.prefix_queries, loaded.prefix_hits) == (18062.0, 0.0)
    assert (loaded.prompt_tokens, loaded.generation_tokens) == (18062.0, 7790.0)
    assert loaded.requests == 18.0, "finished requests of every reason"
    assert loaded.steps == 1214.0  # vllm:iteration_tokens_total_count
    assert loaded.kv_pool == KVPool(block_size=128, gpu_blocks=64)
    assert loaded.kv_pool.tokens == 8192  # the fixture's kv_cache_size_tokens


def test_the_counters_rise_between_two_vllm_scrapes_and_gauges_are_as_now() -> None:
    loaded, drained = parse(text("metrics.loaded.txt")), parse(text("metrics.after_load.txt"))
    rise = drained.since(loaded)
    assert (rise.requests, rise.preemptions, rise.prefix_queries) == (10.0, 1.0, 3600.0)
    assert (rise.running, rise.waiting, rise.kv_usage) == (0.0, 0.0, 0.0)
    assert rise.kv_pool == drained.kv_pool


def test_where_vllms_time_to_first_token_went_reads_from_its_histograms() -> None:
    loaded, drained = parse(text("metrics.loaded.txt")), parse(text("metrics.after_load.txt"))
    # vLLM observes TTFT at the first token, queue and prefill times when a
    # request ends: while loaded, 24 had a first token and 18 had ended.
    assert (loaded.ttft_count, loaded.queue_count) == (24.0, 18.0)
    assert loaded.mean_ttft == pytest.approx(41.33456349372864 / 24)
    assert loaded.mean_queue == pytest.approx(14.751229443999705 / 18)
    assert loaded.mean_prefill == pytest.approx(1.0383035680006287 / 18)
    rise = drained.since(loaded)
    assert (rise.ttft_count, rise.queue_count) == (4.0, 10.0)
    # Drained, every request had both: its TTFT (from the API server's
    # arrival) holds its queue and prefill times, and a little more.
    assert drained.ttft_count == drained.queue_count == 28.0
    assert 0 < drained.mean_queue + drained.mean_prefill < drained.mean_ttft
    idle = parse(text("metrics.idle.txt"))
    assert math.isnan(idle.mean_ttft) and math.isnan(idle.mean_queue)
    assert math.isnan(idle.mean_prefill)


def test_histogram_buckets_are_not_read_as_their_sums() -> None:
    # A bucket line starts as its _sum does; only the exact names count.
    found = parse(
        LOAD
        + 'vllm:request_queue_time_seconds_bucket{engine="0",le="0.3"} 7.0\n'
        + 'vllm:request_queue_time_seconds_sum{engine="0"} 0.5\n'
        + "vllm:request_queue_time_seconds_count 2.0\n"
        + 'vllm:request_queue_time_seconds_created{engine="0"} 1.7e9\n'
    )
    assert (found.queue_seconds, found.queue_count) == (0.5, 2.0)


def test_an_idle_vllm_scrape_is_an_idle_engine_with_its_pool() -> None:
    idle = parse(text("metrics.idle.txt"))
    assert idle.in_flight == 0 and idle.kv_usage == 0.0 and idle.requests == 0
    assert idle.kv_pool == KVPool(block_size=128, gpu_blocks=64)


def test_the_simulators_scrape_reads_like_vllms() -> None:
    engine = SimulatedEngineMetrics(
        model_name="tiny", max_model_len=2048, cache=CONFIG.cache_info()
    )
    engine.record_state(running=2, waiting=3, kv_usage=0.5)
    found = parse(engine.exposition().decode())
    assert (found.running, found.waiting, found.kv_usage) == (2.0, 3.0, 0.5)
    assert found.kv_pool == KVPool(
        block_size=CONFIG.cache_info().block_size, gpu_blocks=CONFIG.cache_info().num_gpu_blocks
    )


def test_vllm_before_0_10_is_read_by_its_older_names() -> None:
    old = parse(
        'vllm:num_requests_running{engine="0"} 1.0\n'
        'vllm:num_requests_waiting{engine="0"} 0.0\n'
        'vllm:gpu_cache_usage_perc{engine="0"} 0.5\n'
        'vllm:gpu_prefix_cache_queries_total{engine="0"} 100.0\n'
        'vllm:gpu_prefix_cache_hits_total{engine="0"} 40.0\n'
    )
    assert (old.kv_usage, old.prefix_queries, old.prefix_hits) == (0.5, 100.0, 40.0)


def test_the_current_name_wins_while_vllm_exposes_both() -> None:
    both = parse(LOAD + 'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.9\n')
    assert both.kv_usage == 0.25


def test_data_parallel_engines_of_one_server_add_up_and_share_their_kv_usage() -> None:
    found = parse(
        LOAD
        + LOAD.replace('engine="0"', 'engine="1"').replace("0.25", "0.75")
        + 'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0\n'
        + 'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1.0\n'
    )
    assert (found.running, found.waiting) == (6.0, 2.0)
    assert found.kv_usage == 0.5, "half of the two pools, not 100%"
    assert found.kv_pool == KVPool(block_size=16, gpu_blocks=1000)


def test_a_pool_vllm_has_not_allocated_yet_is_unknown() -> None:
    found = parse(LOAD + 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n')
    assert (found.block_size, found.gpu_blocks, found.kv_pool) == (16, None, None)
    assert parse(LOAD).kv_pool is None


@pytest.mark.parametrize(
    "scrape",
    [
        pytest.param("", id="empty"),
        pytest.param("<html><body>502 Bad Gateway</body></html>\n", id="an-html-page"),
        pytest.param("# HELP python_info x\npython_info 1.0\n", id="no-vllm-metrics"),
        pytest.param(LOAD.replace("0.25\n", ""), id="cut-short-mid-line"),
        pytest.param(text("metrics.loaded.txt")[:3000], id="cut-short-before-vllm"),
        pytest.param(LOAD.split("vllm:kv")[0], id="cut-short-at-a-line-end"),
        pytest.param(LOAD.replace("3.0", "three"), id="not-a-number"),
        pytest.param(LOAD.replace('engine="0"', 'engine="0'), id="broken-labels"),
        pytest.param(LOAD.replace('",model', '"model'), id="labels-without-a-comma"),
        pytest.param(LOAD.replace('engine="0"', "engine=0"), id="an-unquoted-label"),
        pytest.param(LOAD.replace("} 3.0", "}3.0"), id="no-space-before-the-value"),
        pytest.param(LOAD.replace("} 3.0", "} 3.0 soon"), id="a-timestamp-that-is-not-one"),
    ],
)
def test_a_scrape_that_is_not_a_whole_vllm_exposition_is_an_error(scrape: str) -> None:
    with pytest.raises(BadMetrics):
        parse(scrape)


def test_snapshots_of_several_engines_add_up() -> None:
    summed = total([MetricsSnapshot(requests=3, prefix_queries=10), MetricsSnapshot(requests=4)])
    assert (summed.requests, summed.prefix_queries) == (7, 10)
    assert summed.hit_rate == 0.0


# Label values as an exporter may write them: escaped quotes, backslashes and
# newlines, and the characters that end labels or values elsewhere.
_LABEL_VALUES = st.text(alphabet=st.sampled_from('ab ,={}"\\\n0.'), max_size=8).map(
    lambda v: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
)
_VALUES = st.one_of(
    st.floats(allow_nan=False, width=64).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e3", "-0.5", "7"]),
)


@st.composite
def _sample_lines(draw: st.DrawFn, name: str) -> list[str]:
    lines = []
    for engine in range(draw(st.integers(1, 3))):
        labels = {"engine": str(engine)}
        labels.update(draw(st.dictionaries(st.sampled_from(["a", "b_c", "_d"]), _LABEL_VALUES)))
        body = ",".join(f'{k}="{v}"' for k, v in labels.items())
        stamp = draw(st.sampled_from(["", " 1700000000000", " -5"]))
        lines.append(f"{name}{{{body}}} {draw(_VALUES)}{stamp}")
    return lines


@settings(max_examples=200, deadline=None)
@given(
    running=_sample_lines("vllm:num_requests_running"),
    waiting=_sample_lines("vllm:num_requests_waiting"),
    usage=_sample_lines("vllm:kv_cache_usage_perc"),
    hits=_sample_lines("vllm:prefix_cache_hits_total"),
)
def test_sample_lines_read_as_prometheus_client_reads_them(
    running: list[str], waiting: list[str], usage: list[str], hits: list[str]
) -> None:
    scrape = "\n".join(running + waiting + usage + hits) + "\n"
    sums: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(scrape):
        for sample in family.samples:
            sums.setdefault(sample.name, []).append(sample.value)
    if not all(math.isfinite(sum(values)) for values in sums.values()) or any(
        value < 0 for values in sums.values() for value in values
    ):
        # Well-formed, but a NaN, infinite or negative load or count weighs
        # nothing (a negative load would draw every request): a bad scrape.
        with pytest.raises(BadMetrics, match=r"not a number|negative"):
            parse(scrape)
        return
    found = parse(scrape)
    expected = {
        "running": sum(sums["vllm:num_requests_running"]),
        "waiting": sum(sums["vllm:num_requests_waiting"]),
        "kv_usage": sum(sums["vllm:kv_cache_usage_perc"]) / len(usage),
        "prefix_hits": sum(sums["vllm:prefix_cache_hits_total"]),
    }
    for field, value in expected.items():
        got = getattr(found, field)
        assert got == value, field
