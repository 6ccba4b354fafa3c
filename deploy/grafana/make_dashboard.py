#!/usr/bin/python3
"""Writes deploy/grafana/pdserve.json, the Grafana dashboard over pdserve's Prometheus metrics
(docs/observability.md says what each panel shows). Edit the panels here and rerun:

  deploy/grafana/make_dashboard.py > deploy/grafana/pdserve.json
"""
import json

RATE = "[$__rate_interval]"


def rate(metric, by=None):
    inner = f"rate({metric}{RATE})"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def quantiles(hist, by=""):
    keys = "le" + (", " + by if by else "")
    return [(f"histogram_quantile({q}, sum by ({keys}) (rate({hist}_bucket{RATE})))",
             f"p{int(q * 100)}" + (" {{" + by.replace(", ", "}} {{") + "}}" if by else ""))
            for q in (0.5, 0.9, 0.99)]


# (title, unit, description, [(PromQL, legend)])
PANELS = [
    ("Requests per second", "reqps",
     "Finished requests per second on the serving instances, by finish reason, and requests "
     "the router accepted.",
     [(rate("pdserve:request_success_total", "finished_reason"), "{{finished_reason}}"),
      (rate("pdserve:router_requests_total"), "router: accepted")]),
    ("Errors per second", "reqps",
     "Requests the router failed or rejected, HTTP requests and connections refused by a limit "
     "(by reason), and failed KV transfers. All zero on a healthy deployment.",
     [(rate("pdserve:router_failures_total"), "router: failed"),
      (rate("pdserve:router_rejected_total"), "router: rejected"),
      (rate("pdserve:http_refused_total", "reason"), "refused: {{reason}}"),
      (rate("pdserve:kv_transfer_failures_total"), "KV transfer failures")]),
    ("Time to first token", "s",
     "TTFT percentiles over the interval, from the serving instances' histogram (the decode "
     "instance's, disaggregated: the prefill and the KV transfer included).",
     quantiles("pdserve:time_to_first_token_seconds")),
    ("Inter-token latency (TPOT)", "s",
     "Percentiles of the time between a request's consecutive output tokens.",
     quantiles("pdserve:inter_token_latency_seconds")),
    ("End-to-end request latency", "s",
     "Percentiles of the time from a request's arrival to its last token.",
     quantiles("pdserve:e2e_request_latency_seconds")),
    ("Queue time", "s",
     "Percentiles of the time requests wait before their first engine step.",
     quantiles("pdserve:request_queue_time_seconds")),
    ("Running and waiting requests", "short",
     "Requests in the engine's running batch and in its waiting queue, per instance.",
     [("sum by (job, instance) (pdserve:num_requests_running)", "running {{job}} {{instance}}"),
      ("sum by (job, instance) (pdserve:num_requests_waiting)", "waiting {{job}} {{instance}}")]),
    ("KV cache page use", "percentunit",
     "Share of each instance's KV pages in use (the prefill instance holds a request's pages "
     "until its transfer completes).",
     [("sum by (job, instance) (pdserve:kv_cache_usage_perc)", "{{job}} {{instance}}")]),
    ("Tokens per second", "short",
     "Prompt tokens prefilled and output tokens generated per second.",
     [(rate("pdserve:prompt_tokens_total"), "prompt"),
      (rate("pdserve:generation_tokens_total"), "generated")]),
    ("KV transfer bytes per second, per instance", "Bps",
     "Bytes of KV cache (and metadata) moved between prefill and decode instances: sent by "
     "each prefill instance, received by each decode instance. Each instance is one end of its "
     "peers' transfers.",
     [(rate("pdserve:kv_transfer_bytes_total", "job, instance"), "{{job}} {{instance}}")]),
    ("KV transfer latency, per instance", "s",
     "Percentiles of a transfer's time, from the decode instance sending the prefill request "
     "(decode) or the prefill request arriving (prefill) to its last KV write landing.",
     quantiles("pdserve:kv_transfer_seconds", "job, instance")),
    ("KV transfers", "short",
     "Transfers completed per second and transfers in flight, per instance.",
     [(rate("pdserve:kv_transfers_total", "job, instance"), "completed/s {{job}} {{instance}}"),
      ("sum by (job, instance) (pdserve:kv_transfers_active)", "active {{job}} {{instance}}")]),
    ("Router streams", "short",
     "Streams the router has open to clients, and requests outstanding at each decode backend.",
     [("sum(pdserve:router_open_streams)", "open streams"),
      ("sum by (backend) (pdserve:router_outstanding)", "outstanding {{backend}}")]),
    ("Prefix cache hit rate", "percentunit",
     "Share of prompt-prefix lookups that found cached KV pages. Empty until the instances "
     "export pdserve:prefix_cache_queries_total and pdserve:prefix_cache_hits_total.",
     [(f"{rate('pdserve:prefix_cache_hits_total')} / {rate('pdserve:prefix_cache_queries_total')}",
       "hit rate")]),
]


def panel(i, title, unit, description, targets):
    return {
        "id": i + 1,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                    "tooltip": {"mode": "multi"}},
        "targets": [{"refId": chr(ord("A") + k), "expr": expr, "legendFormat": legend,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for k, (expr, legend) in enumerate(targets)],
    }


def main():
    dashboard = {
        "title": "pdserve",
        "uid": "pdserve",
        "description": "pdserve's serving, KV cache and KV transfer metrics "
                       "(docs/observability.md)",
        "tags": ["pdserve", "llm-serving"],
        "timezone": "browser",
        "schemaVersion": 37,
        "version": 1,
        "editable": True,
        "refresh": "5s",
        "time": {"from": "now-15m", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus", "current": {}, "hide": 0}]},
        "annotations": {"list": []},
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }
    print(json.dumps(dashboard, indent=2))


if __name__ == "__main__":
    main()
