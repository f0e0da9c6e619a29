"""What a bench run is: frozen, validated configuration, plus the parsers for the CLI's mini-syntax.

Spec strings (all parsed here so the CLI, the sweep and the tests agree):

    length      128 | fixed:128 | uniform:64,256 | normal:128,32 | lognormal:128,0.5
    slo         ttft=2s,tpot=100ms,e2e=30s          (any subset; units s, ms or none = s)
    tenants     a:3,b:1  or  a:3:0,b:1:5             (name:weight[:priority])
    step        0:2,30:8,60:4                        (from t=0 s rate 2/s, from 30 s rate 8/s, ...)
    traffic     poisson:rate=4 | constant:rate=4 | gamma:rate=4,cv=2 |
                sinusoid:base=2,peak=20,period=60 | pulse:size=10,period=5,base=1 | step:0:2,30:8
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

LengthKind = Literal["fixed", "uniform", "normal", "lognormal"]
ArrivalKind = Literal["constant", "poisson", "gamma", "sinusoid", "pulse", "step", "trace"]
Api = Literal["completions", "chat", "embeddings"]
ARRIVAL_KINDS: tuple[ArrivalKind, ...] = (
    "constant",
    "poisson",
    "gamma",
    "sinusoid",
    "pulse",
    "step",
    "trace",
)


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A token-length distribution; samples are rounded and never below 1.

    fixed: a; uniform: integers in [a, b]; normal: mean a, std b;
    lognormal: mean a, sigma b of the underlying normal (mu = ln a - b^2/2, so the mean is a).
    """

    kind: LengthKind = "fixed"
    a: float = 128
    b: float = 0

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "uniform", "normal", "lognormal"):
            raise ValueError(f"length kind: unknown {self.kind!r}")
        if self.a < 1:
            raise ValueError(f"length: first parameter must be >= 1, got {self.a}")
        if self.b < 0 or (self.kind == "uniform" and self.b < self.a):
            raise ValueError(f"length {self.kind}: bad second parameter {self.b}")

    @classmethod
    def parse(cls, text: str) -> LengthDist:
        kind, _, rest = text.partition(":")
        if not rest:
            return cls("fixed", float(kind))
        nums = [float(x) for x in rest.split(",")]
        if kind == "fixed" and len(nums) == 1:
            return cls("fixed", nums[0])
        if kind in ("uniform", "normal", "lognormal") and len(nums) == 2:
            return cls(kind, nums[0], nums[1])  # type: ignore[arg-type]
        raise ValueError(f"length spec {text!r}: expected e.g. 128, uniform:64,256, normal:128,32")


@dataclass(frozen=True, slots=True)
class ArrivalConfig:
    """An open-loop arrival process (docs/bench.md has the formulas).

    constant   t_k = k / rate_rps
    poisson    exponential gaps, mean 1 / rate_rps
    gamma      gamma gaps, mean 1 / rate_rps, coefficient of variation cv (1 = Poisson)
    sinusoid   Poisson with rate(t) = base + (peak - base) * (1 + sin(2 pi t / period)) / 2
    pulse      burst_size requests at t = k * period_s, plus Poisson at base_rps in between
    step       Poisson with a piecewise-constant rate: steps = ((start_s, rate_rps), ...)
    trace      the times of a trace file, divided by trace_speedup
    """

    kind: ArrivalKind = "poisson"
    rate_rps: float = 1.0
    cv: float = 1.0
    base_rps: float = 0.0
    peak_rps: float = 0.0
    period_s: float = 60.0
    burst_size: int = 1
    steps: tuple[tuple[float, float], ...] = ()
    trace_speedup: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ARRIVAL_KINDS:
            raise ValueError(f"arrival kind: unknown {self.kind!r}; one of {ARRIVAL_KINDS}")
        if self.kind in ("constant", "poisson", "gamma") and not self.rate_rps > 0:
            raise ValueError(f"rate_rps must be > 0, got {self.rate_rps}")
        if not self.cv > 0:
            raise ValueError(f"cv must be > 0, got {self.cv}")
        if self.base_rps < 0 or self.peak_rps < 0:
            raise ValueError("base_rps and peak_rps must be >= 0 (a rate is never negative)")
        if self.kind == "sinusoid" and max(self.base_rps, self.peak_rps) <= 0:
            raise ValueError("sinusoid: base_rps or peak_rps must be > 0")
        if not self.period_s > 0:
            raise ValueError(f"period_s must be > 0, got {self.period_s}")
        if self.burst_size < 1:
            raise ValueError(f"burst_size must be >= 1, got {self.burst_size}")
        if self.kind == "step":
            starts = [s for s, _ in self.steps]
            if not self.steps or starts[0] != 0 or starts != sorted(set(starts)):
                raise ValueError("steps: start times must begin at 0 and increase")
            if any(r < 0 for _, r in self.steps):
                raise ValueError("steps: rates must be >= 0")
        if not self.trace_speedup > 0:
            raise ValueError(f"trace_speedup must be > 0, got {self.trace_speedup}")

    @property
    def peak(self) -> float:
        """The model's highest rate (pulse: its mean rate, since a burst is instantaneous)."""
        if self.kind == "sinusoid":
            return max(self.base_rps, self.peak_rps)
        if self.kind == "step":
            return max(r for _, r in self.steps)
        if self.kind == "pulse":
            return self.base_rps + self.burst_size / self.period_s
        return self.rate_rps

    @classmethod
    def parse(cls, text: str) -> ArrivalConfig:
        """`kind:key=value,...` (see the module docstring); `step:` takes start:rate pairs."""
        kind, _, rest = text.partition(":")
        if kind == "step":
            return cls("step", steps=parse_steps(rest))
        kv = parse_kv(rest)
        names = {
            "rate": "rate_rps",
            "cv": "cv",
            "base": "base_rps",
            "peak": "peak_rps",
            "period": "period_s",
            "size": "burst_size",
            "speedup": "trace_speedup",
        }
        unknown = set(kv) - set(names)
        if unknown:
            raise ValueError(f"traffic {text!r}: unknown keys {sorted(unknown)}")
        args: dict[str, float | int] = {names[k]: v for k, v in kv.items()}
        if "burst_size" in args:
            args["burst_size"] = int(args["burst_size"])
        return cls(kind, **args)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency targets; a request meets the SLO when it meets every target that is set."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"slo {name} must be > 0, got {v}")

    @property
    def is_set(self) -> bool:
        return any(v is not None for v in (self.ttft_s, self.tpot_s, self.e2e_s))

    @classmethod
    def parse(cls, text: str) -> Slo:
        args = {}
        for part in filter(None, text.split(",")):
            key, _, value = part.partition("=")
            if key not in ("ttft", "tpot", "e2e"):
                raise ValueError(f"slo: unknown target {key!r} (ttft, tpot, e2e)")
            args[key + "_s"] = parse_duration(value)
        return cls(**args)


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    weight: float = 1.0
    priority: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("tenant name must not be empty")
        if not self.weight > 0:
            raise ValueError(f"tenant {self.name}: weight must be > 0, got {self.weight}")


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """Where prompts come from: synthetic (default), a JSONL dataset or a trace file."""

    input_len: LengthDist = field(default_factory=lambda: LengthDist("fixed", 128))
    output_len: LengthDist = field(default_factory=lambda: LengthDist("fixed", 128))
    dataset_path: str | None = None
    trace_path: str | None = None
    num_prefix_groups: int = 0
    prefix_len: int = 0
    tenants: tuple[Tenant, ...] = ()
    priority: int | None = None
    tokenizer_path: str | None = None

    def __post_init__(self) -> None:
        if self.dataset_path and self.trace_path:
            raise ValueError("dataset_path and trace_path are exclusive")
        if self.num_prefix_groups < 0 or self.prefix_len < 0:
            raise ValueError("num_prefix_groups and prefix_len must be >= 0")
        if (self.num_prefix_groups > 0) != (self.prefix_len > 0):
            raise ValueError("shared prefix needs both num_prefix_groups and prefix_len > 0")
        if len({t.name for t in self.tenants}) != len(self.tenants):
            raise ValueError("tenant names must be unique")

    @property
    def synthetic(self) -> bool:
        return self.dataset_path is None and self.trace_path is None


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """One run. Closed loop when `concurrency` is set, else open loop on `arrival`.

    The run ends when `num_requests` have been sent and answered, or at `duration_s`, whichever
    comes first; requests still in flight `drain_s` after the duration cap are cancelled.
    `num_warmup` requests (other prompts, same shapes) go one by one before the clock starts.
    """

    url: str
    model: str
    api: Api = "completions"
    concurrency: int | None = 1
    arrival: ArrivalConfig | None = None
    max_concurrency: int | None = None
    num_requests: int | None = None
    duration_s: float | None = None
    drain_s: float = 0.0
    num_warmup: int = 0
    seed: int = 0
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    slo: Slo = field(default_factory=Slo)
    ignore_eos: bool = True
    temperature: float | None = 0.0
    continuous_usage: bool = False
    extra_body: tuple[tuple[str, object], ...] = ()
    api_key: str | None = None
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0
    request_timeout_s: float | None = None
    label: str = ""

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        if self.api not in ("completions", "chat", "embeddings"):
            raise ValueError(f"api must be completions, chat or embeddings, got {self.api!r}")
        if (self.concurrency is None) == (self.arrival is None):
            raise ValueError("set exactly one of concurrency (closed loop) and arrival (open loop)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        bounded_trace = self.arrival is not None and self.arrival.kind == "trace"
        if self.num_requests is None and self.duration_s is None and not bounded_trace:
            raise ValueError("set num_requests or duration_s (or both): a run must end")
        if (self.arrival is not None and self.arrival.kind == "trace") != bool(
            self.workload.trace_path
        ):
            raise ValueError("trace arrivals and a trace workload go together")
        if self.num_warmup < 0:
            raise ValueError(f"num_warmup must be >= 0, got {self.num_warmup}")
        if self.drain_s < 0:
            raise ValueError(f"drain_s must be >= 0, got {self.drain_s}")
        for name in ("connect_timeout_s", "read_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")


def parse_duration(text: str) -> float:
    """`2s`, `100ms`, `1.5` (seconds) -> seconds."""
    t = text.strip()
    try:
        if t.endswith("ms"):
            return float(t[:-2]) / 1000
        if t.endswith("s"):
            return float(t[:-1])
        if t.endswith("m"):
            return float(t[:-1]) * 60
        return float(t)
    except ValueError:
        raise ValueError(f"bad duration {text!r}: expected e.g. 2s, 100ms, 1.5") from None


def parse_kv(text: str) -> dict[str, float]:
    out = {}
    for part in filter(None, text.split(",")):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"expected key=value, got {part!r}")
        out[key.strip()] = parse_duration(value) if key.strip() == "period" else float(value)
    return out


def parse_steps(text: str) -> tuple[tuple[float, float], ...]:
    steps = []
    for part in filter(None, text.split(",")):
        start, sep, rate = part.partition(":")
        if not sep:
            raise ValueError(f"step: expected start_s:rate, got {part!r}")
        steps.append((parse_duration(start), float(rate)))
    return tuple(steps)


def parse_tenants(text: str) -> tuple[Tenant, ...]:
    tenants = []
    for part in filter(None, text.split(",")):
        fields = part.split(":")
        if not 1 <= len(fields) <= 3:
            raise ValueError(f"tenant: expected name[:weight[:priority]], got {part!r}")
        weight = float(fields[1]) if len(fields) > 1 else 1.0
        priority = int(fields[2]) if len(fields) > 2 else None
        tenants.append(Tenant(fields[0], weight, priority))
    return tuple(tenants)


def parse_int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def parse_float_list(text: str) -> tuple[float, ...]:
    values = tuple(float(x) for x in text.split(",") if x)
    if any(not (v > 0 and math.isfinite(v)) for v in values):
        raise ValueError(f"expected positive numbers, got {text!r}")
    return values
