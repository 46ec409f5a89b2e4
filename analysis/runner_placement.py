"""Where one runner put its model: its load lines (``analysis.runner_load_lines``), in order, folded into a
``RunnerPlacement`` (``PlacementReader``): layers offloaded of all, each GPU's share, what stayed in system memory.
A load names at most ``MAX_DEVICES`` devices and buffers and ``MAX_LAYERS`` layers; more are dropped, counted."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from analysis.runner_load_lines import LoadLine, LoadLineKind, buffer_device, is_gpu_device, is_host_buffer, parse_load_line

MAX_DEVICES = 16  # devices and buffers one load's lines may name; more are not a load's (dropped, counted)
MAX_LAYERS = 1024  # layers one load's debug lines may place (the largest models have under 200)


@dataclass(frozen=True)
class DevicePlacement:
    """What one device holds of a runner's model, as the runner said. None: the runner did not say."""

    device: str  # "CUDA0", "ROCm1", "Vulkan0", "MTL0"
    description: str | None  # "NVIDIA H200"
    layers: int | None  # layers on it: said by debug lines, or all offloaded ones when it is the only GPU
    layers_estimated: bool  # layers shared out among several GPUs by their model bytes (the runner did not say)
    model_bytes: int | None
    kv_bytes: int | None
    compute_bytes: int | None
    free_bytes_at_load: int | None  # free on the device when the runner looked, before it loaded
    total_bytes: int | None
    rs_bytes: int | None = None  # recurrent state (hybrid and recurrent models' "RS" buffers)
    output_bytes: int | None = None  # the step's logits ("output" buffer)

    @property
    def buffer_sizes(self) -> tuple[int | None, ...]:
        """Every buffer kind the runner prints for this device (``BUFFER_KINDS``' order), None where it said none."""
        return (self.model_bytes, self.kv_bytes, self.rs_bytes, self.compute_bytes, self.output_bytes)


def sum_known(*parts: int | None) -> int | None:
    """The sum of the sizes said; None when none was (unknown is never 0)."""
    said = [p for p in parts if p is not None]
    return sum(said) if said else None


@dataclass(frozen=True)
class RunnerPlacement:
    """Where one runner put its model: layers offloaded of all, each GPU's share, what stayed in system memory."""

    layers_offloaded: int | None  # N of "offloaded N/M layers to GPU"; 0 for a build with no GPU backend
    layers_total: int | None  # M (the model's layers + the output layer)
    devices: tuple[DevicePlacement, ...]  # GPUs only
    host_model_bytes: int | None  # weights kept in system memory (CPU_Mapped, CPU, CPU_REPACK buffers)
    host_kv_bytes: int | None
    host_rs_bytes: int | None = None
    host_output_bytes: int | None = None  # llama.cpp keeps the logits in host memory (CUDA_Host, CPU)
    draft: RunnerPlacement | None = None  # the draft model's own placement (speculative decoding), loaded after this

    @property
    def gpu_fraction(self) -> float | None:
        """Share of the model's layers on GPUs (N ÷ M); None when the runner did not say."""
        if self.layers_offloaded == 0:
            return 0.0
        if self.layers_offloaded is None or not self.layers_total:
            return None
        return min(max(self.layers_offloaded / self.layers_total, 0.0), 1.0)

    @property
    def gpu_model_bytes(self) -> int | None:
        sizes = [d.model_bytes for d in self.devices if d.model_bytes is not None]
        return sum(sizes) if sizes else None

    @property
    def gpu_bytes(self) -> int | None:
        """Everything the runner put on its GPUs: weights, KV cache, recurrent state, compute and output buffers, its
        draft model's included."""
        draft = self.draft.gpu_bytes if self.draft is not None else None
        return sum_known(*(b for d in self.devices for b in d.buffer_sizes), draft)

    @property
    def host_bytes(self) -> int | None:
        """What the runner's buffer lines put in system memory, its draft model's included (host compute buffers are
        not kept)."""
        draft = self.draft.host_bytes if self.draft is not None else None
        return sum_known(self.host_model_bytes, self.host_kv_bytes, self.host_rs_bytes, self.host_output_bytes, draft)


@dataclass
class PlacementReader:
    """Folds one runner's load lines, in order, into its ``RunnerPlacement`` (``placement()``). A new load of the
    same runner starts with ``reset()``."""

    offloaded: tuple[int, int] | None = None
    descriptions: dict[str, str] = field(default_factory=dict)
    free: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    model: dict[str, int] = field(default_factory=dict)  # by buffer name
    kv: dict[str, int] = field(default_factory=dict)  # by buffer name, summed (a sliding-window model has two caches)
    rs: dict[str, int] = field(default_factory=dict)  # by buffer name, summed (one per buffer type, as the KV cache)
    compute: dict[str, int] = field(default_factory=dict)  # by buffer name, the latest
    output: dict[str, int] = field(default_factory=dict)  # by buffer name, the latest
    layer_devices: dict[int, str] = field(default_factory=dict)
    breakdown: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # the memory table's, by device
    lines: int = 0
    dropped: int = 0  # facts beyond MAX_DEVICES names or MAX_LAYERS layers
    draft: PlacementReader | None = None  # the draft model's lines, once its load began

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    def _names(self) -> set[str]:
        buffers = (*self.model, *self.kv, *self.rs, *self.compute, *self.output)
        return {*self.descriptions, *self.free, *self.total, *buffers, *self.breakdown}

    def _room_for(self, fact: LoadLine) -> bool:
        """Whether the fact names no device or buffer beyond the ``MAX_DEVICES`` this load already named, and no
        layer beyond ``MAX_LAYERS``."""
        dev = fact.device
        if dev is not None and dev not in self._names() and len(self._names()) >= MAX_DEVICES:
            return False
        new_layer = fact.kind is LoadLineKind.LAYER and fact.layers is not None and fact.layers not in self.layer_devices
        return not (new_layer and len(self.layer_devices) >= MAX_LAYERS)

    def feed(self, fact: LoadLine) -> bool:
        """Fold one fact in; False (and counted in ``dropped``) when there is no room for it (``_room_for``): more
        devices or layers than a load has are not a load's."""
        if self.draft is not None:  # the draft's load: its figures are its own, never this model's
            return self.draft.feed(fact)
        if fact.kind is LoadLineKind.DRAFT:
            self.draft = PlacementReader()
            self.lines += 1
            return True
        if not self._room_for(fact):
            self.dropped += 1
            return False
        self.lines += 1
        dev = fact.device
        if fact.kind is LoadLineKind.OFFLOADED and fact.layers is not None and fact.layers_total is not None:
            if self.offloaded is not None or self.model:  # a second model load in the same runner: its own figures
                self.model.clear()
                self.kv.clear()
                self.rs.clear()
            self.offloaded = (fact.layers, fact.layers_total)
        elif fact.kind is LoadLineKind.DEVICE and dev is not None:
            self._device(dev, fact)
        elif fact.kind is LoadLineKind.BUFFER and dev is not None and fact.size_bytes is not None:
            self._buffer(dev, fact.what, fact.size_bytes)
        elif fact.kind is LoadLineKind.LAYER and dev is not None and fact.layers is not None:
            self.layer_devices[fact.layers] = dev
        return True

    def _buffer(self, name: str, what: str | None, size: int) -> None:
        if what == "model":
            self.model[name] = size
        elif what in ("KV", "RS"):  # caches: one line per buffer type, a model may have several (SWA, hybrid)
            cache = self.kv if what == "KV" else self.rs
            cache[name] = cache.get(name, 0) + size
        elif what == "output":
            self.output[name] = size
        else:
            self.compute[name] = size

    def _device(self, dev: str, fact: LoadLine) -> None:
        if fact.description:
            self.descriptions[dev] = fact.description
        if fact.free_bytes is not None:
            self.free.setdefault(dev, fact.free_bytes)  # the first: before this runner took any
        if fact.total_bytes is not None:
            self.total[dev] = fact.total_bytes
        if fact.breakdown is not None:
            self.breakdown[dev] = fact.breakdown

    def feed_line(self, line: str) -> bool:
        """Feed a raw line; True when it was a load line."""
        fact = parse_load_line(line)
        return fact is not None and self.feed(fact)

    def _device_sizes(self) -> tuple[dict[str, int], ...]:
        """Each kind's bytes by device (model, KV, RS, compute, output), the memory table's where no line said."""
        model, kv, rs = _by_device(self.model), _by_device(self.kv), _by_device(self.rs)
        compute, output = _by_device(self.compute), _by_device(self.output)
        for d, (table_model, table_context, table_compute) in self.breakdown.items():
            model.setdefault(d, table_model)
            if d not in rs:  # the table's "context" is the KV cache and the recurrent state together
                kv.setdefault(d, table_context)
            compute.setdefault(d, table_compute)
        return model, kv, rs, compute, output

    def _layers_on(self, device: str, offloaded: int | None, weights: dict[str, int]) -> tuple[int | None, bool]:
        """(layers on the device, estimated): as debug lines said; else all offloaded ones on the only GPU with
        weights; else shared out among the GPUs by their model bytes (estimated). ``weights``: GPUs with weights."""
        if self.layer_devices:
            return sum(1 for v in self.layer_devices.values() if v == device), False
        if offloaded is None:
            return None, False
        if len(weights) <= 1:
            return (offloaded if device in weights or not weights else 0), False
        if device in weights:
            return round(offloaded * weights[device] / sum(weights.values())), True
        return None, False

    def placement(self) -> RunnerPlacement | None:
        """The placement so far; None before any figure of where the model went."""
        if self.offloaded is None and not self.model:
            return None

        model, kv, rs, compute, output = self._device_sizes()
        names = [d for d in dict.fromkeys([*model, *kv, *rs, *self.free]) if is_gpu_device(d)]
        if not model and self.offloaded is None:
            names = []
        offloaded = self.offloaded
        if offloaded is None:  # a build with no GPU backend prints no "offloaded" line: all of it is in system memory
            offloaded = (0, 0) if not names else None
        n = offloaded[0] if offloaded is not None else None
        gpus_with_weights = [d for d in names if model.get(d)]
        devices = []
        for d in names:
            layers, estimated = self._layers_on(d, n, {g: model[g] for g in gpus_with_weights})
            sizes = (model.get(d), kv.get(d), compute.get(d), self.free.get(d), self.total.get(d), rs.get(d), output.get(d))
            devices.append(DevicePlacement(d, self.descriptions.get(d), layers, estimated, *sizes))
        layers_total = offloaded[1] if offloaded is not None and offloaded[1] else None
        placement = RunnerPlacement(
            offloaded[0] if offloaded is not None else None,
            layers_total,
            tuple(devices),
            _on_host(self.model),
            _on_host(self.kv),
            _on_host(self.rs),
            _on_host(self.output),
        )
        if offloaded == (0, 0):
            placement = replace(placement, layers_total=None)
        if self.draft is not None:
            placement = replace(placement, draft=self.draft.placement())
        return placement


def _by_device(sizes: dict[str, int]) -> dict[str, int]:
    """Buffer sizes by the device each buffer lives on (host and split buffers left out)."""
    out: dict[str, int] = {}
    for buf, size in sizes.items():
        d = buffer_device(buf)
        if d is not None:
            out[d] = out.get(d, 0) + size
    return out


def _on_host(sizes: dict[str, int]) -> int | None:
    host = [size for buf, size in sizes.items() if is_host_buffer(buf)]
    return sum(host) if host else None


def placement_from_lines(lines: list[str] | tuple[str, ...]) -> RunnerPlacement | None:
    """One runner's placement from its output lines (the last load, when it loaded more than once)."""
    reader = PlacementReader()
    for line in lines:
        reader.feed_line(line)
    return reader.placement()
