"""Atomic, sorted JSON files with a schema version: the only way attn-gate writes to disk.

Sorted keys and a fixed indent make a `git diff` of a baseline read like a changelog; writing to a
temporary file and renaming it means a crash never leaves half a file behind.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, TypeVar

from gate.core.errors import UserError

T = TypeVar("T")


def _clean(value: Any) -> Any:
    """JSON has no NaN/Inf: store them as strings so the file stays strict JSON."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def clean_json(value: Any) -> Any:
    """A payload as written to disk (NaN/inf as strings), for validating it before writing."""
    return _clean(value)


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_clean(payload), indent=1, sort_keys=True, allow_nan=False) + "\n"
    write_text_atomic(path, text)


_PENDING: set[str] = set()  # temporary files of writes in progress, for remove_pending_temps


def remove_pending_temps() -> None:
    """Remove the temporary file of every write in progress: the SIGTERM handler calls it before
    the process dies by the signal, when no `finally` runs (the target keeps its old content)."""
    for tmp in list(_PENDING):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    _PENDING.add(tmp)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results and baselines are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    finally:
        _PENDING.discard(tmp)


def save_figure_atomic(fig, path: Path, **savefig_kwargs) -> Path:
    """A matplotlib figure as a PNG, written like every other file here: temp file, 0644, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    _PENDING.add(tmp)
    try:
        fig.savefig(tmp, format="png", **savefig_kwargs)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        _PENDING.discard(tmp)
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def read_json(
    path: Path, *, kind: str, schema_version: int | tuple[int, ...], file_kind: str | None = None
) -> dict[str, Any]:
    """Read a schema-versioned JSON file or raise a UserError that names the file and the fix.
    `schema_version` may list every version the caller can migrate from (the newest last);
    `file_kind`, the `kind` the file must declare ("attn-gate sweep"): a file of another kind
    (a perf file where a sweep is wanted) is refused, whatever else it holds."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such {kind} file")
    try:
        payload = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_no_duplicate_keys)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # JSONDecodeError is a ValueError; so are huge ints
        what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise UserError(
            f"{path}: not valid JSON ({what}); the file is truncated or hand-edited: "
            f"restore it from git or regenerate it"
        ) from None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror or exc}); pass a readable {kind} file") from None
    if not isinstance(payload, dict):
        raise UserError(f"{path}: expected a JSON object for a {kind} file")
    found = payload.get("schema_version")
    accepted = schema_version if isinstance(schema_version, tuple) else (schema_version,)
    if found not in accepted or isinstance(found, bool):
        raise UserError(
            f"{path}: {kind} schema_version {found!r} is not the supported {' or '.join(map(str, accepted))}; "
            f"regenerate it with this attn-gate version"
        )
    if file_kind is not None and payload.get("kind") != file_kind:
        raise UserError(
            f"{path}: kind = {str(payload.get('kind'))[:60]!r} is not {file_kind!r}; pass a {kind} file "
            f"(this one is another kind of attn-gate file, or was hand-edited)"
        )
    return payload


def read_record(
    path: Path,
    *,
    kind: str,
    schema_version: int | tuple[int, ...],
    from_dict: Callable[[dict[str, Any]], T],
    fix: str,
    file_kind: str | None = None,
) -> T:
    """A schema-versioned file parsed into its dataclass; a missing or malformed field is a
    UserError naming the file, the field and `fix` (what to do about it)."""
    payload = read_json(path, kind=kind, schema_version=schema_version, file_kind=file_kind)
    try:
        return from_dict(payload)
    except Exception as exc:  # noqa: BLE001 - whatever a hand-edited file makes the parser raise, never a traceback
        raise UserError(f"{path}: {kind} file is missing or has a bad field ({bad_field(exc)}); {fix}") from None


def bad_field(exc: BaseException) -> str:
    """A parsing exception as the field it is about: a KeyError names the missing field."""
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}" if exc.args else "missing field"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return f"{type(exc).__name__}: {str(exc)[:500]}"


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A key twice in one object is refused (json keeps the last silently: a hand-edit would win unseen)."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"key {key!r} appears twice in one object")
        data[key] = value
    return data


def measured_float(value: Any, field: str, upper: float) -> float:
    """A stored error, bound or ratio: a number in [0, upper], finite unless upper is inf. NaN,
    negative or absurd values would switch a rule off (every comparison with NaN is False), so
    they are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{field} = {value!r} is not a number")
    try:
        number = as_float(value)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None
    if not 0.0 <= number <= upper or (math.isinf(number) and math.isfinite(upper)):
        limit = f"a finite number in [0, {upper:g}]" if math.isfinite(upper) else "a number >= 0 (inf allowed)"
        raise ValueError(f"{field} = {value!r} must be {limit}")
    return number


NAME_RE = __import__("re").compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


def checked_name(value: Any, field: str) -> str:
    """A name read from a file that becomes part of a path (suite, GPU class): no separators, no '..'."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value) or ".." in value or len(value) > 100:
        raise ValueError(
            f"{field} = {value!r} is not a plain name (letters, digits, _ . + -; no path separators or '..')"
        )
    return value


def as_float(value: Any) -> float:
    """Inverse of `_clean` for floats stored as 'nan'/'inf'. An int too large for a float (a
    401-digit number) is a ValueError like any other bad number, not an OverflowError."""
    if isinstance(value, str) and len(value) > 40:
        raise ValueError(f"{value[:20]!r}... is not a number")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{str(value)[:20]}... ({len(str(value))} digits) is out of range for a number") from None


MAX_MULT = 100.0  # a tolerance multiplier above this would pass a planted bug: no rule of ours needs one


def checked_tolerance(value: Any, field: str = "tolerance") -> dict[str, float]:
    """Tolerance multipliers as a file records them: an object of positive finite numbers <= MAX_MULT."""
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{field} = {value!r} must be an object of multipliers (mult_out, mult_dq, ...)")
    out = {}
    for key, number in value.items():
        if not (key.startswith(("mult_", "mean_mult")) or key == "fp32_factor") or len(key) > 40:
            raise ValueError(f"{field}.{key} is not a tolerance multiplier (mult_<tensor>, mean_mult* or fp32_factor)")
        out[key] = measured_float(number, f"{field}.{key}", MAX_MULT)
        if out[key] <= 0:
            raise ValueError(f"{field}.{key} = {number!r} must be > 0")
    return out


KERNEL_RE = __import__("re").compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")


def checked_kernel(value: Any, field: str) -> str:
    """A kernel name read from a file (a built-in, a family or package.module:function): it
    becomes part of a file name, so no separators, no '..'."""
    if not isinstance(value, str) or not KERNEL_RE.fullmatch(value) or ".." in value or len(value) > 200:
        raise ValueError(
            f"{field} = {value!r} is not a kernel name (letters, digits, _ . : -; no path separators or '..')"
        )
    return value
