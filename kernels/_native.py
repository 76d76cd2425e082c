"""Compiled CPU kernels (``_native.c``): TernGrad's and QSGD's ``fused_rng`` quantizers and decoders,
DGC's / ExDyna's threshold selection and DGC's momentum-correction update.

On a CPU the pure-torch references make one pass over the gradient per op: ``torch.rand`` draws
the noise (Mersenne Twister, ~4-7 ns an entry on one core: most of TernGrad's and QSGD's
compression of a ResNet-18 gradient), then scale, compare, sign and pack each read it again. With
``fused_rng=True`` (the option that on CUDA lets the Triton kernels draw Philox numbers in
registers) the CPU runs one C loop instead: the noise is a counter-based hash of the element index
and two 32-bit keys drawn from the caller's generator, and each entry is quantized and packed where
its noise is made. Not bit-exact with the ``torch.rand`` stream (no fused path is, on any device);
bit-exact with the reference given :func:`counter_uniform`'s numbers, which is how it is tested.
The default path (``fused_rng=False``, the ``torch.rand`` stream the cross-checks with GRACE and the
official code share) runs compiled too on fp32 CPU tensors: :func:`torch_rand` makes torch.rand's
own numbers (its Mersenne Twister, read from and written back to the generator's state) and the same
quantizers take them as their noise, so the codes and the generator's state after are the
reference's bit for bit.
The decoders (``ternary_decode_accumulate``, ``qsgd_dequantize_accumulate``) are deterministic: one
loop gives the reference's values bit for bit, where the reference makes a pass per op (a table
gather, a bucket multiply, a sum per worker), so ``backend="auto"`` takes them on any CPU tensor; so
are ``threshold_select`` (the reference's abs, compare, ``nonzero`` and gather in one pass) and
``ef_update`` (its multiply and two adds in one pass) on fp32 tensors.

The library is compiled on first use with the C compiler (``$CC``, else ``cc``) into
``$THINWIRE_CACHE/kernels`` (default ``<repo>/.cache/kernels``, git-ignored), named by a hash of
the source, the flags and the CPU, and loaded with ctypes (calls release the GIL). Without a
compiler :func:`available` is False, says why in :func:`unavailable_reason`, and the ops fall back to
the reference (``backend="auto"``) or raise (``backend="native"``).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("_native.c")
#: No FMA contraction: ``|v| * scale + u`` rounds as the reference's separate multiply and add.
CFLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared", "-std=c11")
_MASK32 = 0xFFFFFFFF


def _cache_dir() -> Path:
    env = os.environ.get("THINWIRE_CACHE")
    root = Path(env).expanduser() if env else Path(__file__).resolve().parent.parent / ".cache"
    return root / "kernels"


def _cpu_signature() -> str:
    """What ``-march=native`` compiled for: the CPU's model and flags (a cache shared between
    machine kinds must not hand one CPU's instructions to another)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))


def _compile(compiler: str, output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=output.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        subprocess.run(
            [compiler, *CFLAGS, "-o", tmp, str(SOURCE)], check=True, capture_output=True, text=True
        )
        os.replace(tmp, output)  # atomic: ranks compiling at once each land a whole file
    except subprocess.CalledProcessError as err:
        raise OSError(f"{compiler} failed on {SOURCE}: {err.stderr.strip()[-2000:]}") from err
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def _load() -> ctypes.CDLL | str:
    """The loaded library, or why it could not be built (a string)."""
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        return f"no C compiler: {compiler!r} is not on PATH (set CC to one)"
    key = hashlib.sha256(
        "\0".join([SOURCE.read_text(), " ".join(CFLAGS), compiler, _cpu_signature()]).encode()
    ).hexdigest()[:16]
    path = _cache_dir() / f"thinwire_native_{key}.so"
    try:
        if not path.exists():
            _compile(compiler, path)
        lib = ctypes.CDLL(str(path))
    except OSError as err:
        return f"could not build or load {path}: {err}"
    i64, u32, ptr = ctypes.c_int64, ctypes.c_uint32, ctypes.c_void_p
    lib.tw_uniform.argtypes = [i64, u32, u32, ptr]
    lib.tw_ternarize.argtypes = [ptr, i64, ptr, i64, u32, u32, ptr]
    lib.tw_qsgd_quantize.argtypes = [ptr, i64, ptr, i64, ctypes.c_int, u32, u32, ptr]
    lib.tw_ternarize_noise.argtypes = [ptr, i64, ptr, i64, ptr, ptr]
    lib.tw_qsgd_quantize_noise.argtypes = [ptr, i64, ptr, i64, ctypes.c_int, ptr, ptr]
    lib.tw_qsgd_decode.argtypes = [ptr, i64, i64, i64, ptr, i64, i64, ctypes.c_int, ptr]
    lib.tw_qsgd_decode.restype = ctypes.c_int
    lib.tw_ternary_decode.argtypes = [ptr, i64, i64, i64, ptr, i64, i64, ptr]
    for fn in (
        lib.tw_uniform,
        lib.tw_ternarize,
        lib.tw_qsgd_quantize,
        lib.tw_ternarize_noise,
        lib.tw_qsgd_quantize_noise,
        lib.tw_ternary_decode,
    ):
        fn.restype = None
    lib.tw_threshold_select.argtypes = [ptr, i64, ctypes.c_float, i64, ptr, ptr]
    lib.tw_threshold_select.restype = i64
    lib.tw_ef_update.argtypes = [ptr, ptr, ptr, i64, ctypes.c_float]
    lib.tw_ef_update.restype = None
    lib.tw_ef_update_out.argtypes = [ptr, ptr, ptr, i64, ctypes.c_float, ptr]
    lib.tw_ef_update_out.restype = None
    lib.tw_scatter.argtypes = [ptr, ptr, i64, i64, ptr]
    lib.tw_scatter.restype = i64
    lib.tw_ternary_values.argtypes = [ptr, i64, ptr]
    lib.tw_ternary_values.restype = None
    for fn in (lib.tw_scale_int8, lib.tw_scale_int16):
        fn.argtypes = [ptr, i64, ctypes.c_float, ptr]
        fn.restype = None
    lib.tw_mt_uniform.argtypes = [ptr, ptr, i64, ptr]
    lib.tw_mt_uniform.restype = None
    lib.tw_segment_noise.argtypes = [i64, ptr, ptr, ptr, i64, ctypes.c_int, ptr]
    lib.tw_segment_noise.restype = None
    lib.tw_sign_pack.argtypes = [ptr, i64, ptr]
    lib.tw_sign_pack.restype = None
    lib.tw_sign_decode.argtypes = [ptr, i64, i64, i64, ptr, ptr]
    lib.tw_sign_decode.restype = None
    return lib


def available() -> bool:
    """Whether the compiled kernels can run here (built once per process, then cached)."""
    return not isinstance(_load(), str)


def unavailable_reason() -> str | None:
    lib = _load()
    return lib if isinstance(lib, str) else None


def _lib() -> ctypes.CDLL:
    lib = _load()
    if isinstance(lib, str):
        raise RuntimeError(f"backend='native' needs the compiled CPU kernels: {lib}")
    return lib


def draw_keys(generator: torch.Generator | None) -> tuple[int, int]:
    """Two 32-bit keys for the counter hash, drawn from ``generator`` (a CPU generator)."""
    if generator is None:
        raise ValueError("fused_rng=True draws its keys from a generator; pass generator=")
    if generator.device.type != "cpu":
        raise ValueError(
            f"the native kernels draw their keys from a CPU generator, got one on {generator.device}"
        )
    k1, k2 = torch.randint(0, 2**32, (2,), generator=generator, dtype=torch.int64).tolist()
    return int(k1), int(k2)


def _hash_reference(x: torch.Tensor) -> torch.Tensor:
    """The kernel's 32-bit hash on int64 values in [0, 2^32) (products stay below 2^63)."""
    from kernels.segment_noise.reference import hash32

    return hash32(x)


def counter_uniform(numel: int, keys: tuple[int, int]) -> torch.Tensor:
    """The fused path's noise with torch ops: fp32 ``[numel]``, ``u_i = (h(h(i ^ k1) ^ k2) >> 8) / 2^24``."""
    k1, k2 = keys
    index = torch.arange(numel, dtype=torch.int64) & _MASK32
    h = _hash_reference(_hash_reference(index ^ k1) ^ k2)
    return (h >> 8).to(torch.float32) * 2.0**-24


def _check_cpu(dtype: torch.dtype, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if not t.is_cpu or t.dtype != dtype or not t.is_contiguous():  # is_cpu: 0.1 us, device.type 1.1
            raise ValueError(f"{name} must be a contiguous {dtype} CPU tensor, got {t.dtype} on {t.device}")


def uniform(numel: int, keys: tuple[int, int]) -> torch.Tensor:
    """:func:`counter_uniform` computed by the compiled kernel."""
    out = torch.empty(numel, dtype=torch.float32)
    _lib().tw_uniform(numel, keys[0], keys[1], out.data_ptr())
    return out


def ternarize(
    g_N: torch.Tensor, scaler_B: torch.Tensor, bucket_size: int, keys_or_noise: tuple[int, int] | torch.Tensor
) -> torch.Tensor:
    """Packed 2-bit ternary codes ``[ceil(N / 4)]``: the reference's ``ternarize`` with
    ``counter_uniform(N, keys)`` as its noise, or with the given fp32 noise ``[N]`` itself."""
    _check_cpu(torch.float32, g=g_N, scaler=scaler_B)
    numel = g_N.numel()
    out = torch.empty((numel + 3) // 4, dtype=torch.uint8)
    if isinstance(keys_or_noise, torch.Tensor):
        _check_noise(keys_or_noise, numel)
        _lib().tw_ternarize_noise(
            g_N.data_ptr(), numel, scaler_B.data_ptr(), bucket_size, keys_or_noise.data_ptr(), out.data_ptr()
        )
        return out
    keys = keys_or_noise
    _lib().tw_ternarize(
        g_N.data_ptr(), numel, scaler_B.data_ptr(), bucket_size, keys[0], keys[1], out.data_ptr()
    )
    return out


def qsgd_quantize(
    v_N: torch.Tensor,
    scales_B: torch.Tensor,
    bits: int,
    bucket_size: int,
    keys_or_noise: tuple[int, int] | torch.Tensor,
) -> torch.Tensor:
    """Packed QSGD codes ``[ceil(N * bits / 8)]`` for per-bucket ``scales_B = s / n_b``: the
    reference's codes with ``counter_uniform(N, keys)`` as its noise, or with the given fp32 noise
    ``[N]`` itself."""
    _check_cpu(torch.float32, v=v_N, scales=scales_B)
    numel = v_N.numel()
    out = torch.empty((numel * bits + 7) // 8, dtype=torch.uint8)
    if isinstance(keys_or_noise, torch.Tensor):
        _check_noise(keys_or_noise, numel)
        _lib().tw_qsgd_quantize_noise(
            v_N.data_ptr(),
            numel,
            scales_B.data_ptr(),
            bucket_size,
            bits,
            keys_or_noise.data_ptr(),
            out.data_ptr(),
        )
        return out
    keys = keys_or_noise
    _lib().tw_qsgd_quantize(
        v_N.data_ptr(), numel, scales_B.data_ptr(), bucket_size, bits, keys[0], keys[1], out.data_ptr()
    )
    return out


def _check_noise(noise_N: torch.Tensor, numel: int) -> None:
    _check_cpu(torch.float32, noise=noise_N)
    if noise_N.numel() != numel:
        raise ValueError(f"noise must have one number per element ({numel}), got {noise_N.numel()}")


def _decode(
    kernel: str,
    packed: torch.Tensor,
    units: torch.Tensor,
    numel: int,
    bucket_size: int,
    *extra: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Run decoder ``kernel`` on the W payloads ``packed [W, bytes]`` (1-D: one) with per-bucket
    values ``units`` (read flat, W rows): fp32 ``[numel]``, written into ``out`` (``numel``
    entries; a fresh tensor when None), or None where the kernel reports a failure (a nonzero
    return). ValueError for arguments that are not a decoder's."""
    _check_cpu(torch.uint8, packed=packed)
    _check_cpu(torch.float32, units=units)
    if out is not None:
        _check_cpu(torch.float32, out=out)
    workers = packed.shape[0] if packed.dim() == 2 else 1
    per_row = units.numel() // max(workers, 1)
    if packed.dim() not in (1, 2) or workers < 1 or units.numel() != workers * per_row:
        raise ValueError(
            f"packed must be [W >= 1, bytes] or [bytes] with W rows of units, got {tuple(packed.shape)} "
            f"and {units.numel()} units"
        )
    if out is not None and out.numel() != numel:
        raise ValueError(f"out must have {numel} entries, got {out.numel()}")
    return decode_fast(kernel, packed, units, numel, packed.shape[-1], per_row, bucket_size, *extra, out=out)


def decode_fast(
    kernel: str,
    packed: torch.Tensor,
    units: torch.Tensor,
    numel: int,
    row_bytes: int,
    units_per_row: int,
    bucket_size: int,
    *extra: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Decoder ``kernel`` in its common case, checked in a few attribute reads: contiguous CPU
    ``packed`` (uint8, 1-D or W >= 1 rows of ``row_bytes``), fp32 ``units`` (``units_per_row`` a
    row), ``out`` None or a contiguous fp32 CPU tensor of ``numel`` entries. Returns the decode, or
    None where anything differs, the kernels did not build or the kernel failed: the caller then
    takes its checked path, which names what is wrong. (At 10^5 entries a decode's C loop takes
    ~30 us on one core and the checked path's Python ~15 us of calls and views: this path, ~3 us.)"""
    lib = _load()
    dim = packed.dim()
    workers = packed.shape[0] if dim == 2 else 1
    if (
        isinstance(lib, str)
        or dim not in (1, 2)
        or workers < 1
        or not (packed.is_cpu and units.is_cpu and packed.is_contiguous() and units.is_contiguous())
        or packed.dtype != torch.uint8
        or units.dtype != torch.float32
        or packed.shape[-1] != row_bytes
        or units.numel() != workers * units_per_row
    ):
        return None
    if out is None:
        out = torch.empty(numel, dtype=torch.float32)
    elif not (out.is_cpu and out.dtype == torch.float32 and out.is_contiguous() and out.numel() == numel):
        return None
    failed = getattr(lib, kernel)(
        packed.data_ptr(),
        workers,
        row_bytes,
        numel,
        units.data_ptr(),
        units_per_row,
        bucket_size,
        *extra,
        out.data_ptr(),
    )
    return None if failed else out


def qsgd_decode(
    packed: torch.Tensor,
    norms: torch.Tensor,
    numel: int,
    bits: int,
    bucket_size: int,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 ``[numel]`` (into ``out`` when given): the reference's ``qsgd_dequantize_accumulate``
    (worker order, one product and one sum per payload) of the W payloads ``packed [W, bytes]`` (1-D:
    one) with per-bucket fp32 ``norms`` (read flat, W rows), the level units ``n_b / s`` computed in
    the loop as the reference divides, bit for bit, in one pass."""
    decoded = _decode("tw_qsgd_decode", packed, norms, numel, bucket_size, bits, out=out)
    if decoded is None:
        raise MemoryError(f"tw_qsgd_decode could not allocate {norms.numel()} level units")
    return decoded


def ternary_decode(
    packed: torch.Tensor,
    scalers: torch.Tensor,
    numel: int,
    bucket_size: int,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 ``[numel]`` (into ``out`` when given): the reference's ``ternary_decode_accumulate`` of
    the W payloads ``packed [W, bytes]`` (1-D: one), ``scalers`` per bucket (read flat, W rows), bit
    for bit, in one pass."""
    decoded = _decode("tw_ternary_decode", packed, scalers, numel, bucket_size, out=out)
    assert decoded is not None  # the ternary decoder has no failure to report
    return decoded


def ternary_values(packed_M: torch.Tensor, numel: int, out: torch.Tensor) -> torch.Tensor:
    """The int8 values {-1, 0, +1} of ``numel`` packed ternary codes into ``out`` (the reference's
    unpack and subtraction, in one pass); returns ``out``."""
    _check_cpu(torch.uint8, packed=packed_M)
    _check_cpu(torch.int8, out=out)
    if packed_M.numel() != -(-numel // 4) or out.numel() != numel:
        raise ValueError(
            f"{numel} codes need {-(-numel // 4)} bytes and out of {numel}, got {packed_M.numel()} and {out.numel()}"
        )
    _lib().tw_ternary_values(packed_M.data_ptr(), numel, out.data_ptr())
    return out


def scale_values(values: torch.Tensor, scaler: float, out: torch.Tensor) -> torch.Tensor:
    """fp32 ``values * scaler`` (int8 or int16 ``values``) into ``out``: torch's cast then product."""
    _check_cpu(values.dtype, values=values)
    _check_cpu(torch.float32, out=out)
    if values.dtype not in (torch.int8, torch.int16) or out.numel() != values.numel():
        raise ValueError(
            f"values must be int8 or int16 with out's size, got {values.dtype} {values.numel()} for {out.numel()}"
        )
    kernel = _lib().tw_scale_int8 if values.dtype == torch.int8 else _lib().tw_scale_int16
    kernel(values.data_ptr(), values.numel(), scaler, out.data_ptr())
    return out


def scatter_fast(values: torch.Tensor, indices: torch.Tensor, out: torch.Tensor) -> bool:
    """``out`` (read flat) at ``indices`` set to ``values`` in one compiled loop (the reference's
    ``index_copy_`` without its int64 copy of the indices; IndexError, nothing written, for an
    index outside ``out``), where the arguments are its case, checked in a few attribute reads (at
    10^5 entries a checked call's Python took as long as the loop): contiguous CPU tensors, fp32
    ``values`` and ``out``, int32 ``indices``, one index a value. False, with nothing written,
    where anything differs or the kernels did not build (the caller then takes its checked path)."""
    lib = _load()
    if (
        isinstance(lib, str)
        or not (values.is_cpu and indices.is_cpu and out.is_cpu)
        or values.dtype != torch.float32
        or out.dtype != torch.float32
        or indices.dtype != torch.int32
        or not (values.is_contiguous() and indices.is_contiguous() and out.is_contiguous())
        or values.dim() != 1
        or indices.numel() != values.numel()
    ):
        return False
    bad = lib.tw_scatter(values.data_ptr(), indices.data_ptr(), indices.numel(), out.numel(), out.data_ptr())
    if bad >= 0:
        raise IndexError(
            f"index {int(indices[bad])} (position {bad}) is out of bounds for {out.numel()} entries"
        )
    return True


def threshold_select(
    x_N: torch.Tensor, threshold: float, capacity: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference's ``threshold_select`` for fp32 ``x_N`` in one pass: ``(values [K], indices int32
    [K], count int64 0-dim)``, ascending positions, bit for bit."""
    _check_cpu(torch.float32, x=x_N)
    values = torch.empty(capacity, dtype=torch.float32)
    indices = torch.empty(capacity, dtype=torch.int32)
    count = _lib().tw_threshold_select(
        x_N.data_ptr(), x_N.numel(), threshold, capacity, values.data_ptr(), indices.data_ptr()
    )
    return values, indices, torch.tensor(count, dtype=torch.int64)


def ef_update(
    u_N: torch.Tensor,
    v_N: torch.Tensor,
    g_N: torch.Tensor,
    momentum: float,
    v_out_N: torch.Tensor | None = None,
) -> None:
    """In place, fp32: ``u = momentum * u + g; v += u`` in one pass (the reference's three ops, bit for
    bit: the momentum is rounded to fp32 as torch rounds a Python scalar for an fp32 tensor); with
    ``v_out_N`` (memory of its own) the new ``v`` is written there too, in the same pass."""
    _check_cpu(torch.float32, u=u_N, v=v_N, g=g_N)
    if not u_N.numel() == v_N.numel() == g_N.numel():
        raise ValueError(f"u, v and g must have one size, got {u_N.numel()}, {v_N.numel()}, {g_N.numel()}")
    if v_out_N is None:
        _lib().tw_ef_update(u_N.data_ptr(), v_N.data_ptr(), g_N.data_ptr(), u_N.numel(), momentum)
        return
    _check_cpu(torch.float32, v_out=v_out_N)
    if v_out_N.numel() != u_N.numel():
        raise ValueError(f"v_out must have u's size {u_N.numel()}, got {v_out_N.numel()}")
    lib = _lib()
    lib.tw_ef_update_out(
        u_N.data_ptr(), v_N.data_ptr(), g_N.data_ptr(), u_N.numel(), momentum, v_out_N.data_ptr()
    )


# torch.rand on a CPU generator, made by the compiled engine (``tw_mt_uniform``). The generator's
# state (``Generator.get_state``) is ATen's CPUGeneratorImplState: the legacy record (uint64 seed,
# int32 left, int32 seeded, uint64 next, 624 uint64 words holding the MT19937 state, then the
# normal-sampling fields) and the float normal sample; only left, next and the words are read and
# written, the rest is handed back as it was.
_MT_WORDS = 624
_MT_LEFT, _MT_NEXT, _MT_STATE = 8, 16, 24  # byte offsets in the state record
_MT_STATE_BYTES = 5056  # torch 2.x's CPUGeneratorImplState: the layout the offsets are for
#: Below this many numbers ``torch.rand`` itself draws them (not tuned: one core, the state's round trip
#: takes 1.6 us and torch.rand of 4,096 numbers 20 us).
RAND_MIN_NUMEL = 1 << 12


def torch_rand(numel: int, generator: torch.Generator) -> torch.Tensor:
    """``torch.rand(numel, generator=generator)`` for a CPU generator: the same numbers and the same
    generator state after, bit for bit, from one compiled loop (3-7x faster on one core than torch's
    serial kernel). Falls back to ``torch.rand`` for small ``numel``, or where the generator's state
    is not the layout this reads (another torch). Not atomic like torch.rand (which holds the
    generator's lock): a generator drawn from by two threads at once must not use it."""
    if generator.device.type != "cpu":
        raise ValueError(f"torch_rand makes a CPU generator's numbers, got a generator on {generator.device}")
    state = generator.get_state()
    if numel < RAND_MIN_NUMEL or state.numel() != _MT_STATE_BYTES:
        return torch.rand(numel, generator=generator, dtype=torch.float32)
    words_64 = state[_MT_STATE : _MT_STATE + 8 * _MT_WORDS].view(torch.int64)
    words = words_64.to(torch.int32)  # the low 32 bits of each word (the engine's uint32 state)
    left_next = torch.tensor(
        [
            int(state[_MT_LEFT : _MT_LEFT + 4].view(torch.int32)),
            int(state[_MT_NEXT : _MT_NEXT + 8].view(torch.int64)),
        ],
        dtype=torch.int64,
    )
    out = torch.empty(numel, dtype=torch.float32)
    _lib().tw_mt_uniform(words.data_ptr(), left_next.data_ptr(), numel, out.data_ptr())
    words_64.copy_(words.to(torch.int64) & _MASK32)
    state[_MT_LEFT : _MT_LEFT + 4].view(torch.int32).fill_(int(left_next[0]))
    state[_MT_NEXT : _MT_NEXT + 8].view(torch.int64).fill_(int(left_next[1]))
    generator.set_state(state)
    return out


def segment_noise(
    starts_S: torch.Tensor, k1_S: torch.Tensor, k2_S: torch.Tensor, numel: int, priority: bool
) -> torch.Tensor:
    """``kernels.segment_noise`` in one compiled loop (the segments laid end to end from ``starts_S``)."""
    _check_cpu(torch.int64, starts=starts_S, k1=k1_S, k2=k2_S)
    out = torch.empty(numel, dtype=torch.float32)
    _lib().tw_segment_noise(
        starts_S.numel(),
        starts_S.data_ptr(),
        k1_S.data_ptr(),
        k2_S.data_ptr(),
        numel,
        int(priority),
        out.data_ptr(),
    )
    return out


def sign_pack(x_N: torch.Tensor) -> torch.Tensor:
    """``pack_bits((x < 0).to(uint8), 1)`` of a contiguous fp32 CPU tensor, in one compiled pass."""
    _check_cpu(torch.float32, x=x_N)
    out = torch.empty(-(-x_N.numel() // 8), dtype=torch.uint8)
    _lib().tw_sign_pack(x_N.data_ptr(), x_N.numel(), out.data_ptr())
    return out


def sign_decode(
    packed_W_M: torch.Tensor, scales_W: torch.Tensor | None, numel: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """fp32 ``[numel]``: each worker's signs times its scale (1 without scales), summed in worker
    order (the first worker's term itself, then ``+``), in one compiled pass; into ``out`` (fp32,
    contiguous, ``numel`` entries, memory of its own) when given."""
    _check_cpu(torch.uint8, packed=packed_W_M)
    workers, row_bytes = packed_W_M.shape
    if row_bytes != -(-numel // 8) or (scales_W is not None and scales_W.numel() != workers):
        raise ValueError(f"{numel} signs need {-(-numel // 8)} bytes a worker and one scale each")
    if scales_W is not None:
        _check_cpu(torch.float32, scales=scales_W)
    if out is None:
        out = torch.empty(numel, dtype=torch.float32)
    elif (
        out.dtype != torch.float32
        or out.device.type != "cpu"
        or not out.is_contiguous()
        or out.numel() != numel
    ):
        raise ValueError(
            f"out must be a contiguous fp32 CPU tensor of {numel} entries, got {out.dtype} "
            f"{tuple(out.shape)} on {out.device} (contiguous: {out.is_contiguous()})"
        )
    scales_ptr = scales_W.data_ptr() if scales_W is not None else None
    _lib().tw_sign_decode(packed_W_M.data_ptr(), workers, row_bytes, numel, scales_ptr, out.data_ptr())
    return out
