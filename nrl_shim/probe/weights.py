"""Weight versions of one model in one engine process, and the findings of the "weights vs the refit" check.

An engine's probe module calls, for each model it follows: `WeightsProbe(model, engine, where)` once loaded (version 0:
the weights as loaded), `sent(weights)` around each refit call's (name, tensor) iterable, `refit_starts()` before each
refit call and `refit_done()` once the refit is over (before the engine's next step: a bucketed refit is many calls).
Torch is imported only when a digest is taken (inside an engine process, where it is loaded already).
"""

from __future__ import annotations

import hashlib

from nrl_shim.probe.finding import Finding

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any

# A tensor's bytes are read as 32-bit words where it is whole words (else as its own elements' integers), in rows of ROW
# words (flat position p: row p // ROW, column p % ROW), CHUNK words (a whole number of rows) per step. Each step sums
# its rows and its columns in int32 (wrapping; torch's int32 reductions run ~50x faster on a CPU than ones that
# accumulate in int64) and makes no copy of the chunk: temporaries of one integer per row and per column.
ROW = 4096
CHUNK = 1 << 22
_MASK = (1 << 64) - 1
_INT_VIEW = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
_COLUMNS: dict = {}  # device -> int64 column weights 1..ROW, made once per device


def _flat(tensor: Any) -> Any:
    import torch

    flat = tensor.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    return flat


def _as_words(piece: Any) -> Any:
    """A piece of whole 32-bit words as int32: a view, or (its storage offset not 4-byte aligned: a slice) a copy of
    this piece only, so that the digest depends on the bits alone, never on where they sit."""
    import torch

    try:
        return piece.view(torch.int32)
    except RuntimeError:
        return piece.clone().view(torch.int32)


def _column_weights(device: Any) -> Any:
    import torch

    weights = _COLUMNS.get(device)
    if weights is None:
        weights = _COLUMNS[device] = torch.arange(1, ROW + 1, dtype=torch.int64, device=device)
    return weights


def tensor_digest(tensor: Any) -> Any:
    """A 3-element int64 tensor on the tensor's device: over its words, the sum of the row sums, the row sums weighted
    by row (1, 2, ...), the column sums weighted by column (1..ROW), wrapping mod 2**64 (row and column sums mod 2**32).
    Integer sums are exact and order-free: the same bits give the same digest on any device. One word changed changes
    its row's sum, so the first; two words swapped change the second (other rows) or the third (other columns): a row
    sum's change (< 2**33) times a weight difference (< 2**31) cannot vanish mod 2**64."""
    import torch

    flat = _flat(tensor)
    size = flat.element_size()
    # Words where the tensor is whole 32-bit words (decided by dtype and size only: the same bits, the same digest);
    # else its own elements' integers.
    words = size >= 4 or flat.numel() * size % 4 == 0
    step = CHUNK * 4 // size if words else CHUNK  # elements per step: CHUNK of what is summed
    device = flat.device
    total = torch.zeros((), dtype=torch.int64, device=device)
    by_row = torch.zeros((), dtype=torch.int64, device=device)
    columns = torch.zeros(ROW, dtype=torch.int32, device=device)
    for start in range(0, flat.numel(), step):
        piece = flat[start : start + step]
        chunk = _as_words(piece) if words else piece.view(getattr(torch, _INT_VIEW[size]))
        first_row = (start * size // 4 if words else start) // ROW
        whole = chunk.numel() // ROW * ROW
        if whole:
            block = chunk[:whole].view(-1, ROW)
            rows = block.sum(dim=1, dtype=torch.int32).to(torch.int64)
            total += rows.sum()
            weights = torch.arange(first_row + 1, first_row + 1 + rows.numel(), dtype=torch.int64, device=device)
            by_row += (rows * weights).sum()
            columns += block.sum(dim=0, dtype=torch.int32)
        if whole < chunk.numel():  # the tensor's last, partial row
            tail = chunk[whole:].to(torch.int32)
            tail_sum = tail.sum(dtype=torch.int32).to(torch.int64)
            total += tail_sum
            by_row += tail_sum * (first_row + whole // ROW + 1)
            columns[: tail.numel()] += tail
    by_column = (columns.to(torch.int64) * _column_weights(device)).sum()
    return torch.stack([total, by_row, by_column])


def _digestible(tensor: Any) -> bool:
    return tensor is not None and hasattr(tensor, "element_size") and tensor.device.type != "meta"


def read_digests(pending: dict) -> list[tuple[str, tuple[int, ...]]]:
    """{device: [(name, tensor_digest(...)), ...]} to (name, digest) pairs on the host: one stack and one copy (one
    device sync) per device, however many tensors."""
    import torch

    found: list[tuple[str, tuple[int, ...]]] = []
    for parts in pending.values():
        values = torch.stack([digest for _, digest in parts]).tolist()
        found.extend((name, tuple(v & _MASK for v in value)) for (name, _), value in zip(parts, values))
    return found


def digests(named_tensors: Iterable[tuple[str, Any]]) -> dict[str, tuple[int, ...]]:
    """{name: digest} of many tensors, with one device sync for all of them."""
    pending: dict = {}  # device -> [(name, digest tensor)]
    for name, tensor in named_tensors:
        if _digestible(tensor):
            pending.setdefault(tensor.device, []).append((name, tensor_digest(tensor)))
    return dict(read_digests(pending))


def model_digests(model: Any) -> dict[str, tuple[int, ...]]:
    """Every parameter of the model (tied ones once), by name. Buffers are left out: engines rewrite some of them at
    the first forward (a rotary cache cast to the activations' dtype), which would read as weights changed."""
    return digests(model.named_parameters())


def version_key(parameters: dict[str, tuple[int, ...]]) -> str:
    text = repr(sorted(parameters.items())).encode()
    return hashlib.blake2b(text, digest_size=8).hexdigest()


def layout_key(model: Any, ranks: tuple) -> str:
    """What replicas must share to be compared: parameter names, shapes and dtypes, and the ranks of the shard."""
    text = repr((ranks, [(n, tuple(p.shape), str(p.dtype)) for n, p in model.named_parameters()])).encode()
    return hashlib.blake2b(text, digest_size=6).hexdigest()


def _names(changed: list[str]) -> str:
    return ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")


class WeightsProbe:
    """One model's weight versions in this process (version 0: as loaded; one per refit after), and the checks."""

    def __init__(
        self,
        model: Any,
        engine: str,
        where: dict,
        digest: Callable[[Any], dict] = model_digests,
        model_of: Callable[[], Any] | None = None,
        live_layers: Callable[[Any], Iterable[Any]] | None = None,
    ) -> None:
        import weakref

        # `model_of`: where the engine keeps its model, asked each time (an engine may swap the object); else a weak
        # reference to `model`.
        self._model = model_of or weakref.ref(model)
        self._digest = digest
        self.engine, self.where = engine, dict(where)
        self.refits = 0  # finished refits
        self.in_refit = False  # a refit's calls have started and the engine has not stepped since
        self.current = digest(model)
        self.versions = [(version_key(self.current), "when loaded at start-up")]  # per version: its key, what it was
        self._sent: dict[str, tuple[int, ...]] = {}  # per tensor name, the digest it was last sent with
        self._sent_changed: list[str] = []  # names sent in this refit with a digest other than their last one
        self._sent_count = 0
        # This refit's sent tensors' digests, still on their devices: read at its end with one sync per device, not
        # one per tensor (a sync per tensor would stall a GPU loader hundreds of times per refit).
        self._sent_pending: dict = {}
        # Check d (probe/live.py): the layers the engine computes from copies derived from their weights, as
        # (name, kernel, weight, bias); checked once per refit that ended, its largest gap kept for the report.
        self._live_layers = live_layers
        self._live_due = False
        self.live_gap: float | None = None

    @property
    def model(self) -> Any:
        return self._model()

    def refit_starts(self, check: bool = True) -> Finding | None:
        """Before each refit call: at the first one of a refit, the weights must still be the last version's.
        `check=False`: a refit the engine hears of only once it is over (weights written in place), nothing to check."""
        if self.in_refit:
            return None
        self.in_refit = True
        self._sent_changed, self._sent_count, self._sent_pending = [], 0, {}
        model = self.model
        if model is None or not check:
            return None
        # Parameters an in-place reload has already moved aside (vLLM 0.3x's layerwise reload puts them on the meta
        # device before its load_weights call) are not compared: only the ones still there.
        now = self._digest(model)
        changed = sorted(name for name, value in now.items() if name in self.current and self.current[name] != value)
        now = {**self.current, **now}
        self.current = now
        if not changed:
            return None
        # What the engine served since: a version of its own (a later refit that returns to it is named).
        self.versions.append((version_key(now), f"when changed under the engine after refit {self.refits}"))
        return Finding(
            "changed under the engine",
            "weights vs the refit",
            f"{len(changed)} parameter(s) changed after refit {self.refits} with no refit through the engine since "
            f"({_names(changed)})",
            f"{len(changed)} of {len(now)} parameters",
            "something wrote the weights under the engine (a checkpoint reloaded, a direct copy into a parameter, "
            "another engine's transfer); a framework that writes weights in place (P2P/RDMA) with no load_weights call "
            "reads the same",
        )

    def sent(self, weights: Any) -> Any:
        """The refit call's (name, tensor) items, each digest kept: a list or tuple read at once and passed on as it is
        (a loader may index it); any other iterable passed on item by item as the loader takes them."""
        if isinstance(weights, (list, tuple)):
            for item in weights:
                self._note_sent(item)
            return weights
        return self._passing(weights)

    def _passing(self, weights: Iterable[Any]) -> Iterator[Any]:
        for item in weights:
            self._note_sent(item)
            yield item

    def _note_sent(self, item: Any) -> None:
        try:
            name, tensor = item
            if not _digestible(tensor):
                return
            digest = tensor_digest(tensor)
        except Exception:  # an item of a form the probe does not know: passed on unread
            return
        self._sent_pending.setdefault(tensor.device, []).append((name, digest))

    def _read_sent(self) -> None:
        """This refit's sent digests, in the order sent: which tensors changed since they were last sent."""
        pending, self._sent_pending = self._sent_pending, {}
        for name, value in read_digests(pending):
            self._sent_count += 1
            last = self._sent.get(name)
            if last is not None and last != value:
                self._sent_changed.append(name)
            self._sent[name] = value

    def refit_done(self) -> Finding | None:
        """Once the refit is over (the engine's next step): the new version, checked against the earlier ones."""
        if not self.in_refit:
            return None
        self.in_refit = False
        self._read_sent()
        model = self.model
        if model is None:
            return None
        self.refits += 1
        self._live_due = self._live_layers is not None
        now = self._digest(model)
        key = version_key(now)
        unchanged = now == self.current
        self.current = now
        earlier = [k for k, _ in self.versions[:-1]]
        self.versions.append((key, f"after refit {self.refits}"))
        if unchanged:
            if not self._sent_changed:
                return None  # the same tensors again (a re-sync), or nothing sent: nothing to say
            return Finding(
                "landed nowhere",
                "weights vs the refit",
                f"refit {self.refits} sent {len(self._sent_changed)} tensor(s) that changed since they were last sent "
                f"({_names(self._sent_changed)}) and no weight of the model changed",
                f"{len(self._sent_changed)} of {self._sent_count} tensors sent",
                "the refit landed nowhere: names the model skips or does not have, another engine's model, a "
                "transfer into a copy of the weights",
            )
        if key in earlier:
            index = earlier.index(key)
            return Finding(
                "earlier weights again",
                "weights vs the refit",
                f"refit {self.refits} left the weights exactly as they were {self.versions[index][1]}",
                "every parameter, bit for bit",
                "earlier weights loaded again over the synced ones: the checkpoint reloaded from disk (a wake-up or "
                "reload that reads the checkpoint, TRL#5312's shape) or an old copy sent; a policy in training never "
                "comes back exactly. If the job loaded these weights on purpose (an evaluation), ignore this",
            )
        return None

    def live_done(self) -> Finding | None:
        """After a refit ended: the live layers against their weight parameters (probe/live.py), once."""
        if not self._live_due or self._live_layers is None:
            return None
        self._live_due = False
        model = self.model
        if model is None:
            return None
        from nrl_shim.probe import live

        finding, self.live_gap = live.check(self._live_layers(model), self.refits)
        return finding

    def record(self) -> dict:
        """What the job report keeps of the latest version (one note per refit)."""
        record = {"engine": self.engine, **self.where, "refit": self.refits, "version": self.versions[-1][0]}
        if self.live_gap is not None:
            record["live_gap"] = self.live_gap
        return record
