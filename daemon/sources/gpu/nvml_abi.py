"""NVML's ABI as loadwatch uses it: return codes and constants from nvml.h (stable across
drivers), what each error means for a poll, and the hot fields read per GPU."""

from __future__ import annotations

from typing import Any, Final

# NVML return codes and constants, from nvml.h: part of the library's ABI, stable across drivers.
ERROR_UNINITIALIZED: Final = 1
ERROR_INVALID_ARGUMENT: Final = 2
ERROR_NOT_SUPPORTED: Final = 3
ERROR_NO_PERMISSION: Final = 4
ERROR_NOT_FOUND: Final = 6
ERROR_DRIVER_NOT_LOADED: Final = 9
ERROR_TIMEOUT: Final = 10
ERROR_LIBRARY_NOT_FOUND: Final = 12
ERROR_FUNCTION_NOT_FOUND: Final = 13
ERROR_GPU_IS_LOST: Final = 15
ERROR_RESET_REQUIRED: Final = 16
ERROR_LIB_RM_VERSION_MISMATCH: Final = 18
ERROR_NO_DATA: Final = 21
ERROR_ARGUMENT_VERSION_MISMATCH: Final = 25
ERROR_DEPRECATED: Final = 26
ERROR_NOT_READY: Final = 27
ERROR_GPU_NOT_FOUND: Final = 28
ERROR_UNKNOWN: Final = 999

TEMPERATURE_GPU: Final = 0
MEMORY_ERROR_TYPE_UNCORRECTED: Final = 1
VOLATILE_ECC: Final = 0
MEMORY_INFO_V2: Final = 0x02000028  # nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24
EVENT_TYPE_XID_CRITICAL_ERROR: Final = 0x8
PSTATE_UNKNOWN: Final = 32

# The field is not there on this GPU, driver or binding, and will not be: stop asking.
NEVER: Final = frozenset(
    {
        ERROR_NOT_SUPPORTED,
        ERROR_NO_PERMISSION,
        ERROR_FUNCTION_NOT_FOUND,
        ERROR_ARGUMENT_VERSION_MISMATCH,
        ERROR_DEPRECATED,
        ERROR_INVALID_ARGUMENT,
    }
)
# Not available just now; ask again next poll, health unaffected.
NOT_NOW: Final = frozenset({ERROR_NO_DATA, ERROR_NOT_READY, ERROR_NOT_FOUND})
LOST: Final = frozenset({ERROR_GPU_IS_LOST, ERROR_RESET_REQUIRED, ERROR_GPU_NOT_FOUND})
# The library or driver went away (driver reload, unload, version mismatch): start over.
REINIT: Final = frozenset(
    {
        ERROR_UNINITIALIZED,
        ERROR_DRIVER_NOT_LOADED,
        ERROR_LIB_RM_VERSION_MISMATCH,
        ERROR_LIBRARY_NOT_FOUND,
    }
)

Alt = tuple[str, str, tuple[Any, ...], dict[str, Any]]  # key, function, args after handle, kwargs
# What one poll reads per GPU, in the order _read_hot unpacks it; equivalents newest-first,
# except temperature, where the plain call is cheaper and stays until drivers drop it.
HOT_FIELDS: Final[tuple[tuple[Alt, ...], ...]] = (
    (
        ("mem2", "nvmlDeviceGetMemoryInfo", (), {"version": MEMORY_INFO_V2}),
        ("mem1", "nvmlDeviceGetMemoryInfo", (), {}),
    ),
    (("util", "nvmlDeviceGetUtilizationRates", (), {}),),
    (
        ("temp", "nvmlDeviceGetTemperature", (TEMPERATURE_GPU,), {}),
        ("tempv", "nvmlDeviceGetTemperatureV", (TEMPERATURE_GPU,), {}),
    ),
    (("power", "nvmlDeviceGetPowerUsage", (), {}),),
    (("pstate", "nvmlDeviceGetPerformanceState", (), {}),),
    (
        ("reasons", "nvmlDeviceGetCurrentClocksEventReasons", (), {}),
        ("throttle", "nvmlDeviceGetCurrentClocksThrottleReasons", (), {}),
    ),
    (
        (
            "ecc",
            "nvmlDeviceGetTotalEccErrors",
            (MEMORY_ERROR_TYPE_UNCORRECTED, VOLATILE_ECC),
            {},
        ),
    ),
    (("procs", "nvmlDeviceGetComputeRunningProcesses", (), {}),),
)

# The process list is read again when device memory moved by this much, or after this many polls.
PROCS_MOVE_BYTES: Final = 16 << 20
PROCS_EVERY_POLLS: Final = 5


class GpuLost(Exception):
    """This GPU is gone (lost, reset required); the others go on."""


class Reinit(Exception):
    """The library or the driver went away: the whole source starts over."""


def describe(exc: BaseException) -> str:
    """One line for an NVML error (or any other exception from the binding)."""
    code = getattr(exc, "value", None)
    try:
        text = " ".join(str(exc).split())
    except Exception:
        text = ""
    if isinstance(code, int):
        return f"{text or 'NVML error'} (NVML error {code})"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
