"""CUDA_VISIBLE_DEVICES as the CUDA driver reads it, and the GPUs it leaves visible.

The driver reads the list left to right and stops quietly at the first entry it cannot use (an
empty entry, a negative or unknown id); a repeated id hides EVERY device. torch mirrors these
rules in torch.cuda._parse_visible_devices; so do we, to say which GPUs a job will really see and
why the others vanished, without starting CUDA.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ddpdoctor.checks.probes.gpu import GpuDevice

HIDE_ALL_VALUES = ("-1", "NoDevFiles")  # set on purpose (by people, or Slurm without GPUs)


@dataclass(frozen=True)
class Visibility:
    raw: str | None  # the variable as set; None when unset
    ordinals: tuple[int, ...] | None  # NVML indices CUDA will see, in CUDA order; None: unknown
    entries: tuple[str, ...]  # the entries CUDA accepts, before matching them to GPUs
    errors: tuple[str, ...] = ()  # mistakes that hide GPUs the user meant to use
    notes: tuple[str, ...] = ()  # oddities that still work (lenient parsing)
    hides_all_on_purpose: bool = False

    @property
    def count(self) -> int | None:
        """How many GPUs CUDA will see (None: cannot tell without NVML)."""
        return None if self.ordinals is None else len(self.ordinals)


def parse_visible_devices(raw: str | None, devices: Sequence[GpuDevice] | None) -> Visibility:
    """`devices` is NVML's list, or None when NVML is unavailable (then ids cannot be checked)."""
    known = None if devices is None else tuple(devices)
    if raw is None:
        ordinals = None if known is None else tuple(d.index for d in known)
        return Visibility(raw, ordinals, entries=())
    if raw.strip() in HIDE_ALL_VALUES:
        return Visibility(raw, (), entries=(), hides_all_on_purpose=True)
    if raw.strip() == "":
        return Visibility(
            raw,
            (),
            entries=(),
            errors=("CUDA_VISIBLE_DEVICES is set but empty, which hides every GPU",),
        )
    if raw.startswith(("GPU-", "MIG-")):
        return _parse_uuids(raw, known)
    return _parse_ordinals(raw, known)


def _parse_ordinals(raw: str, known: tuple[GpuDevice, ...] | None) -> Visibility:
    # Every bad entry is reported, but CUDA keeps only the entries before the first one.
    accepted: list[int] = []
    errors: list[str] = []
    notes: list[str] = []
    stopped = False
    count = None if known is None else len(known)
    for position, item in enumerate(raw.split(","), start=1):
        text = item.strip()
        value = _strtoul(text)
        if value < 0:
            what = "an empty entry" if not text else f"entry {text!r}"
            errors.append(f"{what} at position {position}: CUDA stops reading the list there")
            stopped = True
            continue
        if str(value) != text.lstrip("+"):
            notes.append(f"entry {text!r} is read as {value}")
        if value in accepted:
            errors.append(f"GPU {value} is listed twice: a repeated id makes CUDA hide every GPU")
            return Visibility(raw, (), tuple(map(str, accepted)), errors=tuple(errors))
        if count is not None and value >= count:
            errors.append(_missing_gpu(value, count))
            stopped = True
            continue
        if not stopped:
            accepted.append(value)
    ordinals = None if known is None else tuple(accepted)
    return Visibility(
        raw, ordinals, tuple(map(str, accepted)), errors=tuple(errors), notes=tuple(notes)
    )


def _missing_gpu(value: int, count: int) -> str:
    if not count:
        return f"GPU {value} does not exist (this machine has no GPU)"
    plural = "s" if count != 1 else ""
    return f"GPU {value} does not exist (this machine has {count} GPU{plural}: 0..{count - 1})"


def _parse_uuids(raw: str, known: tuple[GpuDevice, ...] | None) -> Visibility:
    prefix = "MIG-" if raw.startswith("MIG-") else "GPU-"
    accepted: list[str] = []
    errors: list[str] = []
    for position, item in enumerate(raw.split(","), start=1):
        if item in accepted:
            return Visibility(
                raw,
                (),
                tuple(accepted),
                errors=(f"{item} is listed twice: a repeated id makes CUDA hide every GPU",),
            )
        if not item.startswith(prefix):
            errors.append(
                f"entry {item!r} at position {position} is not a {prefix} UUID: CUDA stops reading "
                "there (indices and UUIDs cannot be mixed)"
            )
            break
        accepted.append(item)
    if known is None:
        return Visibility(raw, None, tuple(accepted), errors=tuple(errors))
    ordinals: list[int] = []
    for item in accepted:
        matches = _uuid_matches(item, known, mig=prefix == "MIG-")
        if len(matches) != 1:
            why = "matches no GPU on this machine" if not matches else "matches several GPUs"
            errors.append(f"{item} {why}: CUDA stops reading there")
            break
        if matches[0] in ordinals:
            errors.append(f"{item} names a GPU already listed: CUDA hides every GPU")
            return Visibility(raw, (), tuple(accepted), errors=tuple(errors))
        ordinals.append(matches[0])
    return Visibility(raw, tuple(ordinals), tuple(accepted), errors=tuple(errors))


def _uuid_matches(item: str, known: tuple[GpuDevice, ...], *, mig: bool) -> list[int]:
    # CUDA accepts any unique prefix of a UUID. A MIG UUID selects its parent GPU's slot here.
    found = []
    for device in known:
        uuids = [m.uuid for m in device.mig_devices] if mig else [device.uuid]
        if any(u.startswith(item) for u in uuids if u):
            found.append(device.index)
    return found


def _strtoul(text: str) -> int:
    """The leading integer of `text` as strtoul reads it ("1gpu" -> 1), or -1 when there is none."""
    digits = ""
    for i, char in enumerate(text):
        if char.isdigit() or (i == 0 and char in "+-"):
            digits += char
        else:
            break
    try:
        return int(digits)
    except ValueError:
        return -1
