"""Alpha-beta-gamma cost model of the collectives in a data-parallel step: fit, then extrapolate.

A collective over ``p`` ranks that this rank hands ``n`` bytes (what :class:`CommStats` counts: an
all-reduce's buffer, an all-gather's padded contribution, a send's message) costs

    T = alpha * A + beta * B + gamma * G,    beta = efficiency * 8 / rate_bps

with ``alpha`` seconds per message, ``beta`` seconds per byte on the wire (``efficiency`` >= 1 says
how far the link falls short of its nominal rate) and ``gamma`` seconds per byte reduced. Per op, for
``c`` calls moving ``n`` bytes in total (all terms are 0 at p == 1):

    all_reduce (ring)                   A = 2(p-1) c        B = 2(p-1)/p n      G = (p-1)/p n
    all_gather, all_gather_counts       A = (p-1) c         B = (p-1) n         G = 0
    reduce_scatter (ring)               A = (p-1) c         B = (p-1)/p n       G = (p-1)/p n
    broadcast (binomial tree)           A = ceil(log2 p) c  B = ceil(log2 p) n  G = 0
    send (concurrent point-to-point)    A = c               B = n               G = 0
    parameter_server (push + pull)      A = 2 c             B = 2 p n           G = p n

A step costs ``compute_seconds + sum over ops of T``. :func:`fit` recovers (alpha, efficiency, gamma)
from measured per-step communication times by non-negative least squares on relative errors;
:func:`extrapolate` uses them to predict step times on clusters larger and faster than the one measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np
from scipy.optimize import nnls

OPS = (
    "all_reduce",
    "all_gather",
    "all_gather_counts",
    "reduce_scatter",
    "broadcast",
    "send",
    "parameter_server",
)

# How an op's per-rank bytes change with the number of ranks p: bytes(p) = bytes(p0) * (p / p0) ** k.
SCALINGS: Mapping[str, int] = MappingProxyType({"constant": 0, "linear": 1, "inverse": -1})

PARAM_NAMES = ("alpha", "efficiency", "gamma")

_RATE_UNITS = (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3), ("bit/s", 1.0))
_RATE_PREFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_RATE_EXAMPLES = '"500kbit", "100mbit", "1gbit", "2.5Gbit", "10 Gbit/s" or plain bits/s such as "1e9"'

Ops = Mapping[str, tuple[float, float]]


def _check_nonneg(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def _check_rate(rate_bps: float) -> float:
    rate = float(rate_bps)
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"rate_bps must be a finite number of bits per second > 0, got {rate_bps!r}")
    return rate


def _check_p(p: int, name: str = "p") -> int:
    if isinstance(p, bool) or not isinstance(p, int | np.integer) or p < 1:
        raise ValueError(f"{name} (number of ranks) must be an integer >= 1, got {p!r}")
    return int(p)


def _check_op(op: str) -> str:
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; valid ops: {', '.join(OPS)}")
    return op


def _check_ops(ops: Ops) -> Mapping[str, tuple[float, float]]:
    """Validate op -> (calls, bytes) and return a read-only copy."""
    out: dict[str, tuple[float, float]] = {}
    for op, value in ops.items():
        _check_op(op)
        try:
            calls, nbytes = value
        except (TypeError, ValueError):
            raise ValueError(f"ops[{op!r}] must be a pair (calls, bytes), got {value!r}") from None
        out[op] = (_check_nonneg(f"calls of {op!r}", calls), _check_nonneg(f"bytes of {op!r}", nbytes))
    return MappingProxyType(out)


@dataclass(frozen=True)
class LinkParams:
    """alpha: seconds per message; efficiency: multiplier on ideal wire time; gamma: seconds per byte reduced."""

    alpha: float
    efficiency: float
    gamma: float

    def __post_init__(self) -> None:
        for name in PARAM_NAMES:
            _check_nonneg(name, getattr(self, name))

    def beta(self, rate_bps: float) -> float:
        """Seconds per byte on a link of ``rate_bps`` bits per second."""
        return self.efficiency * 8.0 / _check_rate(rate_bps)


def op_terms(op: str, p: int, calls: float, nbytes: float) -> tuple[float, float, float]:
    """(A, B, G) of ``calls`` calls of ``op`` over ``p`` ranks moving ``nbytes`` bytes in total."""
    _check_op(op)
    p = _check_p(p)
    c = _check_nonneg("calls", calls)
    n = _check_nonneg("nbytes", nbytes)
    if p == 1:
        return (0.0, 0.0, 0.0)
    if op == "all_reduce":
        return (2.0 * (p - 1) * c, 2.0 * (p - 1) / p * n, (p - 1) / p * n)
    if op in ("all_gather", "all_gather_counts"):
        return ((p - 1) * c, (p - 1) * n, 0.0)
    if op == "reduce_scatter":
        return ((p - 1) * c, (p - 1) / p * n, (p - 1) / p * n)
    if op == "broadcast":
        depth = math.ceil(math.log2(p))
        return (depth * c, depth * n, 0.0)
    if op == "send":
        return (c, n, 0.0)
    # parameter_server: every rank pushes to and pulls from one server, whose link carries it all.
    return (2.0 * c, 2.0 * p * n, p * n)


def comm_terms(ops: Ops, p: int) -> tuple[float, float, float]:
    """(A, B, G) summed over a step's ops (op -> (calls, bytes) per step)."""
    total = np.zeros(3)
    for op, (calls, nbytes) in ops.items():
        total += op_terms(op, p, calls, nbytes)
    return (float(total[0]), float(total[1]), float(total[2]))


def _time(terms: tuple[float, float, float], rate_bps: float, params: LinkParams) -> float:
    a, b, g = terms
    return params.alpha * a + params.beta(rate_bps) * b + params.gamma * g


def collective_time(
    op: str, p: int, nbytes: float, rate_bps: float, params: LinkParams, calls: float = 1
) -> float:
    """Seconds for ``calls`` calls of ``op`` moving ``nbytes`` bytes in total."""
    return _time(op_terms(op, p, calls, nbytes), rate_bps, params)


def comm_time(ops: Ops, p: int, rate_bps: float, params: LinkParams) -> float:
    """Seconds of communication per step for ``ops`` (op -> (calls, bytes) per step)."""
    return _time(comm_terms(ops, p), rate_bps, params)


class StepLike(Protocol):
    @property
    def p(self) -> int: ...
    @property
    def rate_bps(self) -> float: ...
    @property
    def ops(self) -> Ops: ...
    @property
    def compute_seconds(self) -> float: ...


@dataclass(frozen=True)
class StepSample:
    """One measured configuration, per step: what was sent, how long communicating and the rest took."""

    p: int
    rate_bps: float
    ops: Ops
    comm_seconds: float
    compute_seconds: float = 0.0
    label: str = ""

    def __post_init__(self) -> None:
        _check_p(self.p)
        _check_rate(self.rate_bps)
        object.__setattr__(self, "ops", _check_ops(self.ops))
        _check_nonneg("comm_seconds", self.comm_seconds)
        _check_nonneg("compute_seconds", self.compute_seconds)


def step_time(sample: StepLike, params: LinkParams) -> float:
    """compute_seconds + modelled communication seconds of one step."""
    return sample.compute_seconds + comm_time(sample.ops, sample.p, sample.rate_bps, params)


def parse_rate(text: str) -> float:
    """'100mbit', '2.5Gbit', '10 Gbit/s', '1e9' (plain: bits/s) -> bits per second."""
    s = str(text).strip().lower().replace(" ", "")
    number, prefix = s, ""
    for unit in ("bits/s", "bit/s", "bits", "bit"):
        if s.endswith(unit):
            number = s[: -len(unit)]
            if number and number[-1] in _RATE_PREFIXES:
                number, prefix = number[:-1], number[-1]
            break
    try:
        value = float(number) if number and number[0] in "0123456789." else float("nan")
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"cannot read {text!r} as a positive link rate; valid examples: {_RATE_EXAMPLES}")
    return value * _RATE_PREFIXES[prefix]


def format_rate(bps: float) -> str:
    """Bits per second, human-readable: 1e8 -> '100 Mbit/s', 2.5e9 -> '2.5 Gbit/s'."""
    rate = _check_rate(bps)
    for unit, scale in _RATE_UNITS:
        if rate >= scale or scale == 1.0:
            return f"{rate / scale:.4g} {unit}"
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class FitRow:
    """Measured against modelled seconds per step for one sample (errors: modelled / measured - 1)."""

    label: str
    p: int
    rate_bps: float
    comm_measured: float
    comm_modelled: float
    step_measured: float
    step_modelled: float
    comm_error: float
    step_error: float


@dataclass
class Fit:
    """Fitted parameters, their standard errors and how well they reproduce every sample.

    ``stderr`` comes from the weighted least-squares covariance (residual variance times the inverse
    Gram matrix), ignoring the non-negativity bound; nan where a parameter was not fitted.
    """

    params: LinkParams
    rows: list[FitRow]
    notes: list[str] = field(default_factory=list)
    stderr: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARAM_NAMES, float("nan")))

    @property
    def max_abs_step_error(self) -> float:
        return max((abs(r.step_error) for r in self.rows), default=float("nan"))

    @property
    def max_abs_comm_error(self) -> float:
        return max((abs(r.comm_error) for r in self.rows), default=float("nan"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": asdict(self.params),
            "rows": [asdict(r) for r in self.rows],
            "stderr": dict(self.stderr),
            "notes": list(self.notes),
            "max_abs_step_error": self.max_abs_step_error,
            "max_abs_comm_error": self.max_abs_comm_error,
        }

    def markdown(self) -> str:
        p, e = self.params, self.stderr
        lines = [
            f"Fitted link: alpha = {p.alpha * 1e6:.3g}{_pm(e['alpha'] * 1e6)} µs, "
            f"efficiency = {p.efficiency:.3g}{_pm(e['efficiency'])}, "
            f"gamma = {p.gamma * 1e9:.3g}{_pm(e['gamma'] * 1e9)} ns/byte",
            "",
            "| label | workers | bandwidth | step ms (measured) | step ms (model) | step error "
            "| comm ms (measured) | comm ms (model) | comm error |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in self.rows:
            lines.append(
                f"| {r.label} | {r.p} | {format_rate(r.rate_bps)} | {_ms(r.step_measured)} | "
                f"{_ms(r.step_modelled)} | {r.step_error * 100:+.1f}% | {_ms(r.comm_measured)} | "
                f"{_ms(r.comm_modelled)} | {r.comm_error * 100:+.1f}% |"
            )
        if self.notes:
            lines.append("")
            lines.extend(f"- {note}" for note in self.notes)
        return "\n".join(lines)


def _pm(err: float) -> str:
    return f" ± {err:.2g}" if math.isfinite(err) else ""


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    if abs(ms) >= 100:
        return f"{ms:.0f}"
    if abs(ms) >= 10:
        return f"{ms:.1f}"
    return f"{ms:.2f}"


def _features(sample: StepLike) -> np.ndarray:
    a, b, g = comm_terms(sample.ops, sample.p)
    return np.array([a, b * 8.0 / sample.rate_bps, g])


def fit(samples: Sequence[StepSample]) -> Fit:
    """Fit (alpha, efficiency, gamma) to measured comm seconds, minimising relative step-time errors.

    Solves min ||W (X theta - y)|| subject to theta >= 0, where row i of X is (A_i, 8 B_i / rate_i, G_i),
    y_i is the measured comm seconds and W = diag(1 / (y_i + compute_i)): each sample's residual
    relative to its whole step. A parameter whose column is all zero (e.g.
    gamma without any reducing op) cannot be identified: it is set to 0 and :attr:`Fit.notes` says so.
    """
    samples = list(samples)
    if len(samples) < 3:
        raise ValueError(
            f"fit needs at least 3 samples (one per parameter: alpha, efficiency, gamma), got {len(samples)}"
        )
    for i, s in enumerate(samples):
        if not s.comm_seconds > 0:
            raise ValueError(
                f"sample {i} ({s.label or 'unlabelled'}) has comm_seconds={s.comm_seconds!r}; "
                "fit needs comm_seconds > 0 (errors are relative to it)"
            )
    y = np.array([s.comm_seconds for s in samples])
    # Relative to the step: what the model is judged on. Weighting by 1/comm instead would let a
    # few milliseconds of jitter in a sparse method's tiny communication time steer the fit.
    weight = 1.0 / np.array([s.comm_seconds + s.compute_seconds for s in samples])
    X = np.stack([_features(s) for s in samples]) * weight[:, None]
    notes: list[str] = []
    scale = np.linalg.norm(X, axis=0)
    used = scale > 0
    for name, ok in zip(PARAM_NAMES, used):
        if not ok:
            notes.append(f"{name} is not identifiable (its term is 0 in every sample); set to 0")
    theta = np.zeros(3)
    stderr = np.full(3, np.nan)
    if used.any():
        Xs = X[:, used] / scale[used]
        if np.linalg.matrix_rank(Xs) < int(used.sum()):
            names = ", ".join(n for n, ok in zip(PARAM_NAMES, used) if ok)
            notes.append(
                f"the terms of {names} are linearly dependent over these samples; the split is arbitrary"
            )
        solution, rnorm = nnls(Xs, y * weight)
        theta[used] = solution / scale[used]
        dof = len(samples) - int(used.sum())
        gram = Xs.T @ Xs
        if dof > 0 and np.linalg.cond(gram) < 1e12:
            cov = rnorm**2 / dof * np.linalg.inv(gram)
            stderr[used] = np.sqrt(np.clip(np.diag(cov), 0.0, None)) / scale[used]
    params = LinkParams(alpha=float(theta[0]), efficiency=float(theta[1]), gamma=float(theta[2]))
    for name, value, err in zip(PARAM_NAMES, theta, stderr):
        if used[PARAM_NAMES.index(name)] and math.isfinite(err) and err > 0.5 * value:
            notes.append(
                f"{name} is poorly determined by these samples (standard error {err:.3g} against a value "
                f"of {value:.3g}); widen the range of workers, rates or message sizes"
            )
    rows = []
    for s in samples:
        comm = comm_time(s.ops, s.p, s.rate_bps, params)
        step_measured = s.compute_seconds + s.comm_seconds
        step_modelled = s.compute_seconds + comm
        rows.append(
            FitRow(
                label=s.label,
                p=s.p,
                rate_bps=s.rate_bps,
                comm_measured=s.comm_seconds,
                comm_modelled=comm,
                step_measured=step_measured,
                step_modelled=step_modelled,
                comm_error=comm / s.comm_seconds - 1.0,
                step_error=step_modelled / step_measured - 1.0,
            )
        )
    return Fit(params=params, rows=rows, notes=notes, stderr=dict(zip(PARAM_NAMES, map(float, stderr))))


@dataclass(frozen=True)
class MethodProfile:
    """One method measured at ``p_measured`` ranks: per-step compute, compress and ops.

    ``scaling[op]`` says how the per-rank bytes of ``op`` change with the number of ranks (one of
    :data:`SCALINGS`); "constant" (the default for every op) fits all-reduce buffers and top-k
    all-gather contributions, whose size does not depend on p. Calls per step never change.
    """

    name: str
    compute_seconds: float
    compress_seconds: float
    ops: Ops
    p_measured: int
    scaling: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_nonneg("compute_seconds", self.compute_seconds)
        _check_nonneg("compress_seconds", self.compress_seconds)
        _check_p(self.p_measured, "p_measured")
        object.__setattr__(self, "ops", _check_ops(self.ops))
        for op, rule in self.scaling.items():
            _check_op(op)
            if rule not in SCALINGS:
                raise ValueError(
                    f"unknown scaling {rule!r} for op {op!r}; valid scalings: {', '.join(SCALINGS)}"
                )
        object.__setattr__(self, "scaling", MappingProxyType(dict(self.scaling)))

    def ops_at(self, p: int) -> dict[str, tuple[float, float]]:
        """Per-step (calls, bytes) per op at ``p`` ranks."""
        p = _check_p(p)
        out = {}
        for op, (calls, nbytes) in self.ops.items():
            k = SCALINGS[self.scaling.get(op, "constant")]
            out[op] = (calls, nbytes * (p / self.p_measured) ** k)
        return out


def extrapolate(
    profiles: Iterable[MethodProfile],
    params: LinkParams,
    workers: Sequence[int] = (64, 128, 256, 512),
    rates: Sequence[float] = (10e9, 25e9, 100e9),
) -> list[dict[str, Any]]:
    """Modelled step time of each method at each worker count and link rate.

    step = compute + compress + comm; speedup = fp32's step / this step at the same workers and rate
    (nan when no profile is named "fp32").
    """
    profiles = list(profiles)
    names = [prof.name for prof in profiles]
    if len(set(names)) != len(names):
        raise ValueError(f"profile names must be unique, got {names}")
    workers = [_check_p(w, "workers") for w in workers]
    rates = [_check_rate(r) for r in rates]
    rows: list[dict[str, Any]] = []
    for prof in profiles:
        for rate in rates:
            for w in workers:
                comm = comm_time(prof.ops_at(w), w, rate, params)
                step = prof.compute_seconds + prof.compress_seconds + comm
                rows.append(
                    {
                        "method": prof.name,
                        "workers": w,
                        "rate_bps": rate,
                        "rate": format_rate(rate),
                        "step_seconds": step,
                        "comm_seconds": comm,
                        "comm_fraction": comm / step if step > 0 else float("nan"),
                    }
                )
    baseline = {(r["workers"], r["rate_bps"]): r["step_seconds"] for r in rows if r["method"] == "fp32"}
    for r in rows:
        base = baseline.get((r["workers"], r["rate_bps"]))
        r["speedup"] = (
            base / r["step_seconds"] if base is not None and r["step_seconds"] > 0 else float("nan")
        )
    return rows


def extrapolation_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """One table row per method x rate, one column per worker count: "412 ms (3.1x)"."""
    workers = sorted({int(r["workers"]) for r in rows})
    cells: dict[tuple[str, float], dict[int, str]] = {}
    for r in rows:
        cell = f"{_ms(r['step_seconds'])} ms"
        if math.isfinite(r["speedup"]):
            cell += f" ({r['speedup']:.1f}x)"
        cells.setdefault((r["method"], r["rate_bps"]), {})[int(r["workers"])] = cell
    lines = [
        "| method | bandwidth | " + " | ".join(f"{w} workers" for w in workers) + " |",
        "|---|---|" + "---:|" * len(workers),
    ]
    for (method, rate), by_w in cells.items():
        lines.append(
            f"| {method} | {format_rate(rate)} | " + " | ".join(by_w.get(w, "") for w in workers) + " |"
        )
    return "\n".join(lines)
