"""A line scan of Prometheus text for a few named series: what the gateway and the autoscaler
read from every server's /metrics, often. A full exposition parse of a server's histograms
would cost more than the decision they feed."""

from __future__ import annotations

from collections.abc import Collection, Mapping


def scan_metrics(
    text: str, wanted: Mapping[str, str], keep_max: Collection[str] = ()
) -> dict[str, float]:
    """{field: value} for the series named in `wanted` (series name -> field). Several series of
    one name (one per model or engine) add up, except fields in `keep_max`, which take the
    largest (a KV usage: the fullest cache). Malformed lines are skipped; absent fields stay out.
    """
    # A cheap first filter: vLLM-style names by their namespace ("vllm:"), others whole.
    prefixes = tuple({name.split(":", 1)[0] + ":" if ":" in name else name for name in wanted})
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(prefixes):
            continue
        brace, space = line.find("{"), line.find(" ")
        end = brace if 0 <= brace < space else space
        field = wanted.get(line[:end]) if end > 0 else None
        if field is None:
            continue
        rest = line[line.rindex("}") + 1 :] if end == brace else line[end:]
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if field in keep_max:
            found[field] = max(found.get(field, value), value)
        else:
            found[field] = found.get(field, 0.0) + value
    return found
