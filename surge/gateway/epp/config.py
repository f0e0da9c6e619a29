"""EppConfig: the gateway as an Endpoint Picker for Envoy (`--ext-proc-port`), a part of
GatewayConfig. The picker shares the gateway's pool, balancers and breakers; these are only
what the ext_proc front adds."""

from __future__ import annotations

from dataclasses import dataclass, field

from surge.config.flags import flag


def parse_objectives(specs: tuple[str, ...]) -> dict[str, int]:
    """`NAME=PRIORITY` strings -> {name: priority}; ValueError names the bad one."""
    out: dict[str, int] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        name = name.strip()
        try:
            priority = int(value)
        except ValueError:
            priority = None
        if not sep or not name or priority is None:
            raise ValueError(f"objective {spec!r}: expected NAME=PRIORITY (an integer)")
        out[name] = priority
    return out


@dataclass(frozen=True, slots=True)
class EppConfig:
    # Envoy's external processor (ext_proc gRPC, GIE's endpoint-picker protocol) on this port,
    # beside the HTTP gateway; None: off.
    port: int | None = field(
        default=None,
        metadata=flag(
            "serve Envoy's ext_proc gRPC on this port: the Gateway API Inference Extension's "
            "endpoint picker, with this gateway's policies (default: off)",
            name="ext-proc-port",
        ),
    )
    # Endpoints after the first in x-gateway-destination-endpoint, for a data plane that goes
    # down the list on retries (Envoy's override_host load-balancing policy). An ORIGINAL_DST
    # cluster reads only one address: there a list is no address at all, so the default is 0.
    fallbacks: int = field(
        default=0,
        metadata=flag(
            "fallback endpoints after the picked one (comma-separated), for a data plane that "
            "retries down the list; an ORIGINAL_DST cluster reads one address (default 0)",
            name="ext-proc-fallbacks",
        ),
    )
    # x-gateway-inference-objective NAME -> the InferenceObjective's priority (higher is more
    # important, negative is sheddable); a bare integer is taken as the priority itself.
    objectives: tuple[str, ...] = field(
        default=(),
        metadata=flag(
            "an InferenceObjective's priority, NAME=PRIORITY (repeatable; negative: sheddable)",
            name="objective",
            repeat=True,
            metavar="NAME=PRIORITY",
        ),
    )
    # An endpoint is saturated (GIE's saturation detector) with this many requests waiting ...
    saturation_waiting: int = field(
        default=5,
        metadata=flag(
            "sheddable requests get 429 when every endpoint has this many waiting ...",
            name="epp-saturation-waiting",
        ),
    )
    # ... or this KV-cache usage (0-1); also when the degrade config calls it saturated.
    saturation_kv_usage: float = field(
        default=0.8,
        metadata=flag(
            "... or this KV-cache usage, 0-1 (or is saturated by --max-in-flight-per-upstream)",
            name="epp-saturation-kv",
        ),
    )
    # Seconds the gRPC server lets open streams finish when the gateway stops.
    grace_s: float = 5.0

    def __post_init__(self) -> None:
        if self.port is not None and not 0 < self.port < 65536:
            raise ValueError(f"ext_proc port must be in 1..65535, got {self.port}")
        if self.fallbacks < 0:
            raise ValueError(f"fallbacks must be >= 0, got {self.fallbacks}")
        object.__setattr__(self, "objectives", tuple(self.objectives))
        parse_objectives(self.objectives)
        if self.saturation_waiting < 0:
            raise ValueError(f"saturation_waiting must be >= 0, got {self.saturation_waiting}")
        if not 0 < self.saturation_kv_usage <= 1:
            raise ValueError(
                f"saturation_kv_usage must be in (0, 1], got {self.saturation_kv_usage}"
            )
        if self.grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {self.grace_s}")

    @property
    def priorities(self) -> dict[str, int]:
        return parse_objectives(self.objectives)
