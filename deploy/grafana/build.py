"""Writes surge.json, the Grafana dashboard of a Surge fleet: `python deploy/grafana/build.py`.

Plain JSON in Grafana's dashboard schema (no library: the panels are a few dicts). Every query
here is run against a real Prometheus scraping real Surge processes by
tests/observability/test_dashboard_prometheus.py; edit this file, rerun it, commit both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DS = {"type": "prometheus", "uid": "${datasource}"}
M = 'model_name=~"$model"'
MI = 'model_name=~"$model", instance=~"$instance"'
RI = "$__rate_interval"
TTFT_SLO_S = 1.0  # the SLO of deploy/prometheus/recording.rules.yml
TPOT_SLO_S = 0.1


def q(expr: str, legend: str = "") -> dict[str, Any]:
    return {"expr": expr, "legendFormat": legend}


def quantiles(metric: str, by: str, sel: str, qs: tuple[float, ...] = (0.5, 0.99)) -> list[dict]:
    return [
        q(f"histogram_quantile({x}, sum by (le, {by}) (rate({metric}_bucket{{{sel}}}[{RI}])))",
          f"p{round(x * 100)} {{{{{by.split(', ')[-1]}}}}}")  # fmt: skip
        for x in qs
    ]


def panel(
    title: str,
    targets: list[dict[str, Any]],
    unit: str = "short",
    description: str = "",
    slo: float | None = None,
    kind: str = "timeseries",
    width: int = 8,
) -> dict[str, Any]:
    thresholds: dict[str, Any] = {"mode": "absolute", "steps": [{"color": "green", "value": None}]}
    custom: dict[str, Any] = {}
    if slo is not None:  # the SLO drawn as a red line
        thresholds["steps"].append({"color": "red", "value": slo})
        custom["thresholdsStyle"] = {"mode": "line"}
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"h": 8, "w": width},
        "fieldConfig": {"defaults": {"unit": unit, "thresholds": thresholds, "custom": custom},
                        "overrides": []},  # fmt: skip
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [dict(t, datasource=DS) for t in targets],
    }


def rows() -> list[tuple[str, list[dict[str, Any]]]]:
    fleet = [
        panel("Requests per second", [
            q(f"sum by (model_name) (rate(surge:requests_received_total{{{M}}}[{RI}]))",
              "received {{model_name}}"),
            q(f"sum by (model_name, finished_reason) (rate(vllm:request_success_total{{{M}}}[{RI}]))",
              "finished {{finished_reason}} {{model_name}}"),
        ], "reqps", "Arrivals and finished requests by finish reason."),  # fmt: skip
        panel("Tokens per second", [
            q(f"sum by (model_name) (rate(vllm:generation_tokens_total{{{M}}}[{RI}]))",
              "generated {{model_name}}"),
            q(f"sum by (model_name) (rate(vllm:prompt_tokens_total{{{M}}}[{RI}]))",
              "prompt {{model_name}}"),
        ], "short"),  # fmt: skip
        panel("Time to first token (p50, p99)",
              quantiles("vllm:time_to_first_token_seconds", "model_name", M), "s",
              f"Red line: the SLO ({TTFT_SLO_S:g} s).", slo=TTFT_SLO_S),
        panel("Time per output token (p50, p99)",
              quantiles("vllm:request_time_per_output_token_seconds", "model_name", M), "s",
              f"Red line: the SLO ({TPOT_SLO_S:g} s).", slo=TPOT_SLO_S),
        panel("End-to-end latency (p50, p99)",
              quantiles("vllm:e2e_request_latency_seconds", "model_name", M), "s"),
        panel("Goodput (share of requests within the TTFT SLO)", [
            q(f'sum by (model_name) (rate(vllm:time_to_first_token_seconds_bucket{{{M}, le=~"1(\\\\.0)?"}}[{RI}]))'
              f" / sum by (model_name) (rate(vllm:time_to_first_token_seconds_count{{{M}}}[{RI}]))",
              "{{model_name}}"),
        ], "percentunit", "The SLO's error budget is 1% (deploy/prometheus)."),  # fmt: skip
        panel("Queue: waiting and running", [
            q(f"sum by (model_name) (vllm:num_requests_waiting{{{M}}})", "waiting {{model_name}}"),
            q(f"sum by (model_name) (vllm:num_requests_running{{{M}}})", "running {{model_name}}"),
        ]),  # fmt: skip
        panel("KV cache usage", [
            q(f"avg by (model_name) (vllm:kv_cache_usage_perc{{{M}}})", "mean {{model_name}}"),
            q(f"max by (model_name) (vllm:kv_cache_usage_perc{{{M}}})", "fullest {{model_name}}"),
        ], "percentunit"),  # fmt: skip
        panel("Preemptions per second", [
            q(f"sum by (model_name) (rate(vllm:num_preemptions_total{{{M}}}[{RI}]))",
              "{{model_name}}"),
        ], "short"),  # fmt: skip
        panel("Prefix cache hit rate", [
            q(f"sum by (model_name) (rate(vllm:prefix_cache_hits_total{{{M}}}[{RI}]))"
              f" / sum by (model_name) (rate(vllm:prefix_cache_queries_total{{{M}}}[{RI}]))",
              "{{model_name}}"),
        ], "percentunit", "Prompt tokens found in the prefix cache."),  # fmt: skip
    ]
    replica = [
        panel("Ongoing requests per replica", [
            q(f"sum by (instance) (vllm:num_requests_running{{{MI}}})", "running {{instance}}"),
            q(f"sum by (instance) (vllm:num_requests_waiting{{{MI}}})", "waiting {{instance}}"),
        ]),  # fmt: skip
        panel("KV cache usage per replica", [
            q(f"vllm:kv_cache_usage_perc{{{MI}}}", "{{instance}}"),
        ], "percentunit"),  # fmt: skip
        panel("Generated tokens per second per replica", [
            q(f"sum by (instance) (rate(vllm:generation_tokens_total{{{MI}}}[{RI}]))",
              "{{instance}}"),
        ]),  # fmt: skip
        panel("TTFT p99 per replica",
              quantiles("vllm:time_to_first_token_seconds", "instance", MI, (0.99,)), "s",
              slo=TTFT_SLO_S),
        panel("TPOT p99 per replica",
              quantiles("vllm:request_time_per_output_token_seconds", "instance", MI, (0.99,)),
              "s", slo=TPOT_SLO_S),
        panel("Bottleneck per replica", [
            q('max by (instance, kind) (surge:bottleneck{instance=~"$instance"}) == 1',
              "{{instance}}: {{kind}}"),
        ], kind="table", description="What limits each replica now (docs/observability-"
           "diagnosis.md): compute, kv_memory, prefill, admission, api_process, idle, healthy."),
        panel("Engine busy per replica (share of time in steps)", [
            q(f"rate(surge:engine_step_seconds_total{{{MI}}}[{RI}]) / (rate(surge:engine_step_"
              f"seconds_total{{{MI}}}[{RI}]) + rate(surge:engine_wait_seconds_total{{{MI}}}[{RI}]))",
              "{{instance}}"),
        ], "percentunit", "Time in engine steps against time blocked waiting for work."),
        panel("Engine alive per replica", [
            q(f"vllm:engine_healthy{{{MI}}}", "{{instance}}"),
        ], description="1: the engine process is alive; 0: dead (alert SurgeEngineDead)."),
    ]  # fmt: skip
    tenant = [
        panel("Generated tokens per second by tenant", [
            q(f"sum by (tenant) (rate(surge:tenant_generation_tokens_total{{{M}}}[{RI}]))",
              "{{tenant}}"),
        ]),  # fmt: skip
        panel("Engine share by tenant (scheduled tokens per second)", [
            q(f"sum by (tenant) (rate(surge:tenant_scheduled_tokens_total{{{M}}}[{RI}]))",
              "{{tenant}}"),
        ], description="The fair scheduler's own count of prefill and decode tokens."),
        panel("Finished requests per second by tenant", [
            q(f"sum by (tenant, finished_reason) (rate(surge:tenant_requests_total{{{M}}}[{RI}]))",
              "{{tenant}} {{finished_reason}}"),
        ], "reqps"),  # fmt: skip
        panel("TTFT p99 by tenant",
              quantiles("surge:tenant_time_to_first_token_seconds", "tenant", M, (0.99,)), "s",
              slo=TTFT_SLO_S),
        panel("Queue time p99 by priority",
              quantiles("surge:priority_queue_time_seconds", "priority", M, (0.99,)), "s"),
        panel("TTFT p99 by priority",
              quantiles("surge:priority_time_to_first_token_seconds", "priority", M, (0.99,)),
              "s", slo=TTFT_SLO_S),
    ]  # fmt: skip
    gateway = [
        panel("Gateway responses per second by status", [
            q(f"sum by (status) (rate(surge_gateway_requests_total[{RI}]))", "{{status}}"),
        ], "reqps"),  # fmt: skip
        panel("Upstreams in rotation", [
            q("surge_gateway_upstream_healthy", "{{upstream}}"),
        ], description="1: in rotation; 0: out (failed probes or an outlier)."),
        panel("Circuit breakers", [
            q("surge_gateway_breaker_state", "{{upstream}}"),
        ], description="0 closed, 1 half-open, 2 open (alert SurgeGatewayBreakerOpen)."),
        panel("In flight per upstream", [
            q("surge_gateway_upstream_in_flight", "{{upstream}}"),
            q("surge_gateway_requests_waiting", "waiting for a slot"),
            q("surge_gateway_requests_awaiting_upstream", "awaiting an upstream (scaled to zero)"),
        ]),  # fmt: skip
        panel("Retries per second by reason", [
            q(f"sum by (reason) (rate(surge_gateway_retries_total[{RI}]))", "{{reason}}"),
            q(f"sum by (kind) (rate(surge_gateway_upstream_errors_total[{RI}]))",
              "upstream error {{kind}}"),
        ], "reqps"),  # fmt: skip
        panel("Degraded and shed requests per second", [
            q(f"sum by (action) (rate(surge_gateway_degraded_requests_total[{RI}]))",
              "degraded: {{action}}"),
            q(f"sum by (reason) (rate(surge_gateway_shed_requests_total[{RI}]))",
              "shed: {{reason}}"),
        ], "reqps"),  # fmt: skip
        panel("Upstream latency p99 by phase", [
            q("histogram_quantile(0.99, sum by (le, phase) "
              f"(rate(surge_gateway_upstream_latency_seconds_bucket[{RI}])))", "{{phase}}"),
            q("histogram_quantile(0.99, sum by (le) "
              f"(rate(surge_gateway_overhead_seconds_bucket[{RI}])))", "gateway overhead"),
        ], "s"),  # fmt: skip
    ]
    autoscaler = [
        panel("Replicas: desired vs ready", [
            q("surge_autoscaler_desired_replicas", "desired {{instance}}"),
            q("surge_autoscaler_replicas", "{{state}}"),
            q('surge_autoscaler_replicas_limit{bound="max"}', "max"),
        ]),  # fmt: skip
        panel("Replicas each signal asks for", [
            q("surge_autoscaler_signal_replicas", "{{signal}}"),
        ], description="The most demanding signal wins (ongoing, queue, kv, forecast)."),
        panel("Forecast vs observed arrivals", [
            q("surge_autoscaler_forecast_rps", "forecast at the horizon"),
            q(f"sum(rate(surge:requests_received_total{{{M}}}[{RI}]))", "observed"),
        ], "reqps"),  # fmt: skip
        panel("Scale decisions per minute", [
            q(f"sum by (direction) (rate(surge_autoscaler_scale_events_total[{RI}])) * 60",
              "{{direction}}"),
        ]),  # fmt: skip
    ]
    resources = [
        panel("CPU per process", [
            q(f"surge:process_cpu_percent{{instance=~\"$instance\"}}", "{{instance}} {{process}}"),
            q(f"surge:system_cpu_percent{{instance=~\"$instance\"}}", "{{instance}} host"),
        ], "percent"),  # fmt: skip
        panel("Memory", [
            q(f"surge:process_resident_memory_bytes{{instance=~\"$instance\"}}",
              "{{instance}} {{process}}"),
        ], "bytes"),  # fmt: skip
        panel("Host memory used", [
            q(f"surge:system_memory_used_ratio{{instance=~\"$instance\"}}", "{{instance}}"),
        ], "percentunit"),  # fmt: skip
        panel("GPU memory", [
            q(f"surge:gpu_memory_used_bytes{{instance=~\"$instance\"}}", "used {{instance}} {{gpu}}"),
            q(f"surge:gpu_memory_total_bytes{{instance=~\"$instance\"}}", "total {{instance}} {{gpu}}"),
        ], "bytes", "From NVML (surge[gpu]); empty on CPU replicas."),  # fmt: skip
        panel("GPU utilization", [
            q(f"surge:gpu_utilization_percent{{instance=~\"$instance\"}}", "{{instance}} {{gpu}}"),
        ], "percent", "From NVML (surge[gpu]); empty on CPU replicas."),  # fmt: skip
    ]
    return [
        ("Fleet overview", fleet),
        ("Per replica", replica),
        ("Tenants and priorities", tenant),
        ("Gateway", gateway),
        ("Autoscaler", autoscaler),
        ("Resources", resources),
    ]


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name, "label": label, "type": "query", "datasource": DS,
        "query": {"query": query, "refId": name}, "definition": query,
        "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*",
        "current": {"text": "All", "value": "$__all"}, "sort": 1,
    }  # fmt: skip


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y, pid = 0, 1
    for title, row in rows():
        panels.append({"type": "row", "title": title, "id": pid, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})  # fmt: skip
        pid, y, x = pid + 1, y + 1, 0
        for p in row:
            w = p["gridPos"]["w"]
            if x + w > 24:
                x, y = 0, y + 8
            p["gridPos"].update(x=x, y=y)
            p["id"] = pid
            for ref, t in zip("ABCDEFGH", p["targets"], strict=False):
                t["refId"] = ref
            panels.append(p)
            pid, x = pid + 1, x + w
        y += 8
    return {
        "title": "Surge fleet",
        "uid": "surge-fleet",
        "description": "A Surge fleet: replicas (surge serve), gateway and autoscaler.",
        "tags": ["surge", "llm", "vllm"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0},
            variable("model", "Model", "label_values(vllm:num_requests_running, model_name)"),
            variable("instance", "Replica",
                     'label_values(vllm:num_requests_running{model_name=~"$model"}, instance)'),
        ]},  # fmt: skip
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    out = Path(__file__).with_name("surge.json")
    out.write_text(render())
    print(f"wrote {out}")
