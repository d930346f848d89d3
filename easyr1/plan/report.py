"""The plan as text: tables per worker and per node, the step's FLOPs and time, the verdict, and one last line for
scripts: ``plan: fits=<yes|no> device_peak_gb=<per device> host_peak_gb=<per worker process> step_seconds=<est>``.
"""

from __future__ import annotations

from typing import Any

from easyr1.plan.plan import Plan


GIB = 2**30


def gib(value: float) -> str:
    """Bytes as GiB with two decimals."""
    return f"{value / GIB:.2f}"


def _table(title: str, header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> list[str]:
    cells = [header, *[tuple(str(c) for c in row) for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [title]
    for index, row in enumerate(cells):
        lines.append(
            "  "
            + "  ".join(
                cell.ljust(width) if i == 0 else cell.rjust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            )
        )
        if index == 0:
            lines.append("  " + "  ".join("-" * width for width in widths))
    return lines


def _dtype(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def summary_line(plan: Plan) -> str:
    """The last line of the plan, for scripts (GiB; ``host_peak_gb`` is the busiest worker process)."""
    return (
        f"plan: fits={'yes' if plan.fits else 'no'} device_peak_gb={plan.device_peak / GIB:.2f} "
        f"host_peak_gb={plan.host_worker_peak / GIB:.2f} step_seconds={plan.step_seconds:.1f}"
    )


def verdict(plan: Plan) -> str:
    """One sentence: fits or not, by how much, against which memory."""
    if plan.device.on_gpu:
        need, have, what = plan.device_peak, plan.device.memory_bytes, f"one {plan.device.name}'s memory"
        if plan.fits_device and not plan.fits_host:
            need, have, what = plan.host_node_total, plan.device.host_bytes, "the node's host RAM"
    else:
        need, have, what = plan.host_node_total, plan.device.memory_bytes, "the RAM available on this machine"
    if plan.fits:
        return f"fits: {gib(need)} GiB of {gib(have)} GiB ({what}), {gib(have - need)} GiB to spare"
    return (
        f"does not fit: needs {gib(need)} GiB, {what} is {gib(have)} GiB ({gib(need - have)} GiB over; "
        f"peak phase: {plan.peak_phase.name})"
    )


def render(plan: Plan, suggestions: list[tuple[dict, Plan]] | None = None) -> str:
    """The whole plan as readable text, ending with :func:`summary_line`."""
    size, device = plan.size, plan.device
    lines = [
        f"device: {device.name} ({device.kind}), {gib(device.memory_bytes)} GiB per device, "
        f"{device.peak_flops / 1e12:.3g} TFLOP/s peak; {plan.world} workers, {plan.workers_per_node} per node",
        f"model: {size.total / 1e6:,.1f} M parameters (language {size.language / 1e6:,.1f} M, "
        f"vision tower {size.vision / 1e6:,.1f} M); {size.text.layers} layers, hidden {size.text.hidden}, "
        f"vocabulary {size.text.vocab}",
        "",
    ]
    rows = []
    for role, model in plan.states.items():
        rows.append(
            (
                role,
                f"{model.parameters / 1e6:,.1f} M",
                f"{model.trainable / 1e6:,.1f} M",
                f"{_dtype(model.precision.storage)}/{_dtype(model.precision.compute)}",
                gib(model.param_bytes),
                gib(model.grad_bytes),
                gib(model.optimizer_bytes),
                gib(model.gathered_bytes),
                "host" if model.always_on_host else ("host between calls" if model.offload_params else "device"),
            )
        )
    lines += _table(
        f"model states per worker (GiB, sharded over {plan.world})",
        ("model", "params", "trainable", "store/compute", "weights", "grads", "optimizer", "gathered", "weights live"),
        rows,
    )
    engine = plan.engine
    lines += [
        "",
        *_table(
            "rollout engine per worker",
            (
                "dtype",
                "weights GiB",
                "KV cache GiB",
                "other GiB",
                "sequences held",
                "rows per step",
                "asleep in update",
            ),
            [
                (
                    _dtype(engine.dtype),
                    gib(engine.weight_bytes),
                    gib(engine.kv_bytes),
                    gib(engine.overhead_bytes),
                    engine.sequences,
                    engine.rows,
                    "released" if engine.releases else "kept",
                )
            ],
        ),
    ]
    lines += [
        "",
        *_table(
            "one micro-batch (GiB; worst case: every row at max_prompt_length + max_response_length)",
            ("pass", "rows", "tokens", "decoder layers", "vision", "attention mask", "logits", "total"),
            [
                (
                    name,
                    batch.samples,
                    batch.tokens,
                    gib(act.layers),
                    gib(act.vision),
                    gib(act.mask),
                    gib(act.logits),
                    gib(act.total),
                )
                for name, batch, act in (
                    ("update", plan.update_batch, plan.update),
                    ("log-probs", plan.experience_batch, plan.experience),
                )
            ],
        ),
    ]
    lines += [
        "",
        *_table(
            "device memory per worker by phase (GiB)",
            ("phase", "total", "largest parts"),
            [
                (
                    phase.name,
                    gib(phase.total),
                    ", ".join(
                        f"{name} {gib(value)}"
                        for name, value in sorted(phase.items, key=lambda item: -item[1])[:3]
                        if value
                    ),
                )
                for phase in plan.phases
            ],
        ),
    ]
    lines += [
        "",
        *_table(
            "host memory (GiB)",
            ("what", "GiB"),
            [
                *((f"worker process, {name}", gib(value)) for name, value in plan.host_worker.items()),
                *((f"node: {name}", gib(value)) for name, value in plan.host_node.items()),
                ("node total", gib(plan.host_node_total)),
            ],
        ),
    ]
    flops = plan.flops
    epoch = plan.hours_per_epoch
    lines += [
        "",
        *_table(
            f"one step at {plan.mfu:.0%} MFU",
            (
                "generation PFLOP",
                "log-prob passes PFLOP",
                "updates PFLOP",
                "seconds",
                "tokens/s per device",
                "hours per epoch",
            ),
            [
                (
                    f"{flops.generation / 1e15:.3g}",
                    f"{flops.log_probs / 1e15:.3g}",
                    f"{flops.updates / 1e15:.3g}",
                    f"{plan.step_seconds:.1f}",
                    f"{plan.tokens_per_second:,.0f}",
                    "unknown (data size)" if epoch is None else f"{epoch:.2f}",
                )
            ],
        ),
    ]
    lines += ["", *(f"note: {note}" for note in plan.notes), f"verdict: {verdict(plan)}"]
    for change, result in suggestions or []:
        settings = " ".join(f"{key}={value}" for key, value in change.items())
        lines.append(
            f"  would fit with {settings}: device peak {gib(result.device_peak)} GiB, "
            f"node host {gib(result.host_node_total)} GiB"
        )
    if not plan.fits and not suggestions:
        lines.append("  no single setting tried makes it fit: more or larger devices, or a smaller model")
    lines.append(summary_line(plan))
    return "\n".join(lines)
