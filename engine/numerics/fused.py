"""Fused CPU quantizer passes (docs/methods.md §1, "Fused kernels").

On the CPU a quantizer is a chain of whole-tensor torch passes (affine, noise, clamp, round, back to values:
six to eight reads and writes of the tensor), and on a CPU with fast convolutions (AVX-512) those passes are
much of a quantized step. ``fused_quant.c`` does each chain in one pass, with the same float operations in the
same order, so the results are the same bit for bit (and the noise is torch's own draw: the random stream is
unchanged). It is compiled at first use with the system's C compiler (``$CC``, else ``cc``, else ``gcc``) into
a per-user cache (``$FRACTUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/fractune``, else ``~/.cache/fractune``) and
loaded with ctypes; each process checks the library against the torch passes before using it. Where there is
no compiler, the cache cannot be written, the check fails, or ``FRACTUNE_FUSED=0`` is set, the torch passes run
instead: the same numbers, slower. ``status()`` says which, and why.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from engine.numerics import affine

SOURCE = Path(__file__).with_name("fused_quant.c")
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared"]
OPENMP = ["-fopenmp"]
ENV_SWITCH = "FRACTUNE_FUSED"
COMPILE_TIMEOUT_S = 120

_lock = threading.Lock()
_state: dict = {}  # "lib": ctypes.CDLL | None, "status": str


def _cache_dir() -> Path:
    if os.environ.get("FRACTUNE_CACHE_DIR"):
        return Path(os.environ["FRACTUNE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fractune"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_flags() -> str:
    """The CPU's feature flags (-march=native builds for them: a library built on one CPU may not run on
    another, so the cache key names them)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _build(cc: str, source: bytes, dest_dir: Path, key: str) -> Path:
    """Compile ``source`` into ``dest_dir/fused-<key>.so`` (written under a private name, then renamed into
    place, so processes compiling at once never load a half-written file). Tries with OpenMP, then without."""
    dest = dest_dir / f"fused-{key}.so"
    if dest.is_file():
        return dest
    errors = []
    for extra in (OPENMP, []):
        fd, tmp = tempfile.mkstemp(prefix=".fused-", suffix=".so", dir=dest_dir)
        os.close(fd)
        try:
            r = subprocess.run([cc, *FLAGS, *extra, "-x", "c", "-", "-o", tmp, "-lm"], input=source,
                               capture_output=True, timeout=COMPILE_TIMEOUT_S)
            if r.returncode == 0:
                os.replace(tmp, dest)
                return dest
            errors.append(r.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["failed"])
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise RuntimeError(f"{cc} failed: {errors[0][0]}")


SWITCH_VALUES = {"1": True, "on": True, "true": True, "yes": True, "0": False, "off": False, "false": False,
                 "no": False}


def environment_problem() -> str | None:
    """A one-line error for a ``FRACTUNE_FUSED`` value that is neither on nor off (None where it is fine or
    unset); the command line checks it before a command starts."""
    value = os.environ.get(ENV_SWITCH)
    if value is None or value.strip().lower() in SWITCH_VALUES:
        return None
    return f"{ENV_SWITCH}: got {value!r}; allowed: {', '.join(SWITCH_VALUES)} (unset: on)"


def _private(path: Path) -> bool:
    """Whether ``path`` is this user's and nobody else can write it: a shared folder (FRACTUNE_CACHE_DIR=/tmp)
    or a library planted by another user is never loaded."""
    st = path.stat()
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def _load() -> tuple[ctypes.CDLL | None, str]:
    if environment_problem():
        raise ValueError(environment_problem())
    if not SWITCH_VALUES[os.environ.get(ENV_SWITCH, "1").strip().lower()]:
        return None, f"off ({ENV_SWITCH}={os.environ[ENV_SWITCH]})"
    cc = _compiler()
    if cc is None:
        return None, "off (no C compiler: set CC, or install gcc)"
    try:
        source = SOURCE.read_bytes()
        version = subprocess.run([cc, "--version"], capture_output=True, timeout=30).stdout
        key = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), version, platform.machine().encode(),
                                         _cpu_flags().encode()])).hexdigest()[:16]
        try:
            cache = _cache_dir()
            cache.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not _private(cache):
                raise PermissionError(f"{cache} is shared")
            path = _build(cc, source, cache, key)
            if not _private(path):
                raise PermissionError(f"{path} is shared")
            lib = ctypes.CDLL(str(path))
        except (OSError, ValueError):  # no usable cache (unwritable, shared, a bad path): a private folder
            with tempfile.TemporaryDirectory(prefix="fractune-fused-") as d:
                lib = ctypes.CDLL(str(_build(cc, source, Path(d), key)))  # loaded: the file may go
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return None, f"off ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    lib.fq_tensor.argtypes = [ptr, ptr, ptr, i64, f32, f32, f32]
    lib.fq_tensor.restype = None
    lib.fq_rows.argtypes = [ptr, ptr, ptr, i64, i64, ptr, ptr]
    lib.fq_rows.restype = None
    lib.fq_mt_words.argtypes = [ptr, ptr, i64]
    lib.fq_row_range.argtypes = [ptr, i64, i64, ptr, ptr]
    lib.fq_row_range.restype = None
    lib.fq_minmax.argtypes = [ptr, i64, ptr]
    lib.fq_minmax.restype = None
    lib.fq_mt_words.restype = ctypes.c_int
    problem = _self_check(lib)
    if problem:
        return None, f"off (self-check: {problem})"
    return lib, "on"


def _self_check(lib: ctypes.CDLL) -> str | None:
    """Run both kernels against the torch passes on a small tensor (odd length, every bit-width kind, with and
    without noise); a difference in any bit turns the kernels off."""

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 1031, generator=g) * 3
    x[0, 5] = float("nan")
    words = torch.randint(-(2**15), 2**15, x.shape, dtype=torch.int16, generator=g)
    lo, hi = float(x[1:].min()), float(x[1:].max())
    for bits in (2, 4, 8):
        for noise in (None, words):
            step = affine.tensor_step(bits, lo, hi)
            want = torch.sub(x, lo).div_(step)
            if noise is not None:
                want.add_(0.5 / affine.NOISE_LEVELS).add_(noise, alpha=1.0 / affine.NOISE_LEVELS)
            want = want.clamp_(0, affine.levels(bits)).round_().mul_(step).add_(lo)
            got = torch.empty_like(x)
            lib.fq_tensor(x.data_ptr(), got.data_ptr(), None if noise is None else noise.data_ptr(), x.numel(),
                          lo, step, float(affine.levels(bits)))
            if not torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)):
                return f"fq_tensor differs from torch at {bits} bits"
    params = torch.tensor([[lo, affine.tensor_step(3, lo, hi), 7.0], [0.0] * 3,
                           [lo, affine.tensor_step(8, lo, hi), 255.0]])
    gid = torch.tensor([2, 0, 1])
    per_row = params.index_select(0, gid)
    lo_r, step_r, qmax_r = per_row.t().unsqueeze(2)
    for noise in (None, words):
        want = torch.sub(x, lo_r).div_(step_r)
        if noise is not None:
            want.add_(0.5 / affine.NOISE_LEVELS).add_(noise, alpha=1.0 / affine.NOISE_LEVELS)
        want = torch.minimum(want.clamp_min_(0), qmax_r).round_().mul_(step_r).add_(lo_r)
        want[2] = x[2]
        got = torch.empty_like(x)
        lib.fq_rows(x.data_ptr(), got.data_ptr(), None if noise is None else noise.data_ptr(), 3, x.shape[1],
                    gid.data_ptr(), params.data_ptr())
        if not torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)):
            return "fq_rows differs from torch"
    lo_r, hi_r = torch.empty(3), torch.empty(3)
    lib.fq_row_range(x.data_ptr(), 3, x.shape[1], lo_r.data_ptr(), hi_r.data_ptr())
    if not (torch.equal(lo_r.nan_to_num(7.0), x.amin(1).nan_to_num(7.0))
            and torch.equal(hi_r.nan_to_num(7.0), x.amax(1).nan_to_num(7.0))):
        return "fq_row_range differs from torch"
    for t in (x[1:], x, x[1:, :0]):
        pair = (ctypes.c_float * 2)()
        lib.fq_minmax(t.data_ptr(), t.numel(), pair)
        want = torch.aminmax(t) if t.numel() else (torch.tensor(float("inf")), torch.tensor(float("-inf")))
        if not all(a == float(b) or (a != a and b != b) for a, b in zip(pair, want)):
            return "fq_minmax differs from torch"
    saved = torch.get_rng_state()
    try:
        for seed, before, n in ((1, 0, 3), (2, 5, 700), (3, 1, 1249)):  # from a fresh seed, mid-block, across blocks
            torch.manual_seed(seed)
            torch.rand(before)
            state = torch.get_rng_state()
            want = torch.empty(n, dtype=torch.int64).random_(-(2**63), None)
            got = torch.empty(n, dtype=torch.int64)
            if lib.fq_mt_words(state.data_ptr(), got.data_ptr(), n) != 0 or not torch.equal(got, want) \
                    or not torch.equal(state, torch.get_rng_state()):
                return "fq_mt_words differs from torch's generator"
    finally:
        torch.set_rng_state(saved)
    return None


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None where the torch passes run (``status()`` says why); made once per process."""
    if "status" not in _state:
        with _lock:
            if "status" not in _state:
                _state["lib"], _state["status"] = _load()
    return _state["lib"]


def status() -> str:
    """"on", or "off (reason)"."""
    library()
    return _state["status"]


@contextlib.contextmanager
def disabled():
    """Run the torch passes inside this block (this process): for side-by-side timing and tests."""
    library()
    saved = dict(_state)
    _state.update(lib=None, status="off (fused.disabled)")
    try:
        yield
    finally:
        _state.clear()
        _state.update(saved)


def usable(*tensors: torch.Tensor | None) -> bool:
    """Whether the kernels can run on these tensors: CPU, float32, contiguous, and the library loaded; never
    inside a step being compiled (a ctypes call is opaque to ``torch.compile``: the torch passes are traced)."""
    if torch.compiler.is_compiling():
        return False
    for t in tensors:
        if t is not None and (t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous()):
            return False
    return library() is not None


def random_words(words: torch.Tensor) -> torch.Tensor:
    """``words.random_(-2**63, None)`` from torch's default CPU generator, bit for bit and leaving the generator
    where that call leaves it, faster (docs/benchmarks.md; a contiguous int64 CPU tensor; ``usable`` checked)."""
    state = torch.get_rng_state()
    if _state["lib"].fq_mt_words(state.data_ptr(), words.data_ptr(), words.numel()) != 0:
        return words.random_(-(2**63), None)  # a state this code does not know: torch's own draw
    torch.set_rng_state(state)
    return words


def minmax(x: torch.Tensor) -> tuple[float, float]:
    """``torch.aminmax(x)`` of a contiguous float32 CPU tensor as Python floats, in one pass and one call."""
    pair = (ctypes.c_float * 2)()
    _state["lib"].fq_minmax(x.data_ptr(), x.numel(), pair)
    return pair[0], pair[1]


def row_range(rows: torch.Tensor) -> tuple[list[float], list[float]]:
    """``rows.amin(1).tolist(), rows.amax(1).tolist()`` of a contiguous 2-D float32 CPU tensor, in one pass."""
    n = rows.shape[0]
    lo, hi = torch.empty(n), torch.empty(n)
    _state["lib"].fq_row_range(rows.data_ptr(), n, rows.shape[1], lo.data_ptr(), hi.data_ptr())
    return lo.tolist(), hi.tolist()


def tensor(x: torch.Tensor, out: torch.Tensor, noise: torch.Tensor | None, lo: float, step: float,
           qmax: float) -> torch.Tensor:
    """``quant.quantize``'s per-tensor pass on the host's range into ``out``: ``(x - lo) / step`` on the levels,
    ``noise`` the drawn words or None, back to values (``usable`` checked by the caller)."""
    _state["lib"].fq_tensor(x.data_ptr(), out.data_ptr(), None if noise is None else noise.data_ptr(), x.numel(),
                            lo, step, qmax)
    return out


def rows(x: torch.Tensor, out: torch.Tensor, noise: torch.Tensor | None, gid: torch.Tensor,
         params: torch.Tensor) -> torch.Tensor:
    """``quant.quantize_rows``'s host pass: row r of ``x`` (dim 0) at group ``gid[r]``'s (lo, step, qmax) from ``params``
    (groups x 3 float32; qmax 0: copy the row) into ``out``."""
    n = x.shape[0]
    _state["lib"].fq_rows(x.data_ptr(), out.data_ptr(), None if noise is None else noise.data_ptr(), n,
                          x.numel() // max(n, 1), gid.data_ptr(), params.data_ptr())
    return out
