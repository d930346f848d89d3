"""``python -m easyr1.tools.plan config=FILE key=value ... [--gpu NAME] [--mfu F] [--prompt-fill F]
[--response-fill F]``: the memory
and step-time plan of a run, before launching it.

The config is loaded exactly as ``easyr1.main`` loads it; the model is read from its ``config.json`` only. Without
``--gpu`` the plan is for the config's device (``trainer.device``; ``auto``: this machine's GPU, else its CPU);
``--gpu H100`` (see ``easyr1.plan.hardware.GPU_MEMORY_GIB``) plans for that GPU from any machine. The last line is
for scripts::

    plan: fits=<yes|no> device_peak_gb=<per device> host_peak_gb=<per worker process> step_seconds=<est>

Exit code 0 whether it fits or not; 2 for a bad config.
"""

from __future__ import annotations

import argparse
import sys

from easyr1.errors import UserError


def main(argv: list[str] | None = None) -> int:
    """Print the plan of the config given as ``config=FILE key=value ...``."""
    from easyr1.config import load_config
    from easyr1.plan.check import plan_run, run_device
    from easyr1.plan.hardware import gpu_device
    from easyr1.plan.plan import DEFAULT_MFU
    from easyr1.plan.report import render

    parser = argparse.ArgumentParser(prog="python -m easyr1.tools.plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", help="plan for this GPU (A100, H100, H200, H20, L40S, 4090, ...) on any machine")
    parser.add_argument(
        "--mfu",
        type=float,
        default=DEFAULT_MFU,
        help=f"fraction of the device's peak FLOP/s a step reaches (default {DEFAULT_MFU})",
    )
    parser.add_argument(
        "--prompt-fill",
        type=float,
        default=1.0,
        help="mean prompt length as a fraction of data.max_prompt_length, for the step time",
    )
    parser.add_argument(
        "--response-fill",
        type=float,
        default=1.0,
        help="mean response length as a fraction of data.max_response_length, for the step time",
    )
    parser.add_argument("--host-gb", type=float, help="host RAM per node for a --gpu plan (default 1024)")
    args, overrides = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        for option, value in (
            ("--mfu", args.mfu),
            ("--prompt-fill", args.prompt_fill),
            ("--response-fill", args.response_fill),
        ):
            if not 0 < value <= 1:
                raise UserError(f"{option}={value}: must be in (0, 1]")
        config = load_config(overrides)
        peak = config.trainer.peak_flops_per_device
        if args.gpu:
            host = int(args.host_gb * 2**30) if args.host_gb else None
            device = gpu_device(args.gpu, peak, host)
        else:
            device = run_device(config)
            if device is None:
                raise UserError("no GPU is visible here to plan this GPU run for: pass --gpu NAME (e.g. --gpu H100)")
        try:
            plan, suggestions = plan_run(
                config, device, mfu=args.mfu, prompt_fill=args.prompt_fill, response_fill=args.response_fill
            )
        except OSError as error:  # a hub id with no network and no cached config.json, a missing directory
            raise UserError(
                f"cannot read the config.json of worker.actor.model.model_path={config.worker.actor.model.model_path}"
                f" ({type(error).__name__}: {str(error).splitlines()[0]}); download the model or point the key at a "
                "local directory holding its config.json"
            ) from None
    except UserError as error:
        print(f"easyr1: error: {error}", file=sys.stderr)
        return 2
    print(render(plan, suggestions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
