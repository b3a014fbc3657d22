"""`/metrics` through prometheus_client: a per-app CollectorRegistry with one collector.

The collector reads ServerMetrics' rows at scrape time and yields one metric family per
row (counters without a `_created` sample, as llama-server exposes none), and
`generate_latest` writes the Prometheus text format 0.0.4.

prometheus_client names a counter family `<name>_total` in its `# HELP`/`# TYPE` lines.
llama-server has one counter without that suffix, `llamacpp:n_tokens_max`; its family is
exposed under llama-server's name by renaming those two lines and its sample (the value is
prometheus_client's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

Row = tuple[str, str, str, float]


class _RowsCollector(Collector):
    def __init__(self, rows: Callable[[], list[Row]]) -> None:
        self._rows = rows

    def collect(self) -> Iterator[Metric]:
        for name, help_text, kind, value in self._rows():
            if kind == "counter":
                yield CounterMetricFamily(name, help_text, value=float(value))
            else:
                yield GaugeMetricFamily(name, help_text, value=float(value))


class MetricsRegistry:
    """A CollectorRegistry of its own (never the process-global one)."""

    def __init__(self, rows: Callable[[], list[Row]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_RowsCollector(rows))
        self._unsuffixed = [
            name
            for name, _h, kind, _v in rows()
            if kind == "counter" and not name.endswith("_total")
        ]

    def render(self) -> str:
        text = generate_latest(self.registry).decode("utf-8")
        for name in self._unsuffixed:
            text = (
                text.replace(f"# HELP {name}_total ", f"# HELP {name} ")
                .replace(f"# TYPE {name}_total counter", f"# TYPE {name} counter")
                .replace(f"\n{name}_total ", f"\n{name} ")
            )
        return text
