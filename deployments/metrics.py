"""``MetricsSink`` over ``ray.serve.metrics``: the service's counters and histograms appear on
the Ray dashboard and its Prometheus endpoint (prefixed ``ray_``), tagged by deployment and
replica as well as by our own tags."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from ray.serve import metrics

from serve_app.metrics import ALL_METRICS, Measurement


class RayServeMetrics:
    def __init__(self) -> None:
        self._metrics: dict[str, Any] = {}
        for spec in ALL_METRICS:
            if spec.kind == "counter":
                self._metrics[spec.name] = metrics.Counter(
                    spec.name, description=spec.description, tag_keys=cast(Any, spec.tag_keys)
                )
            else:
                self._metrics[spec.name] = metrics.Histogram(
                    spec.name,
                    description=spec.description,
                    boundaries=list(spec.boundaries),
                    tag_keys=cast(Any, spec.tag_keys),
                )

    def record(self, measurements: Iterable[Measurement]) -> None:
        for m in measurements:
            metric = self._metrics[m.spec.name]
            tags = dict(m.tags) or None
            if m.spec.kind == "counter":
                metric.inc(m.value, tags=tags)
            else:
                metric.observe(m.value, tags=tags)
