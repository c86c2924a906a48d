"""``python -m marin_model.cuda``: build the kernels (``--build``, what ``make cuda`` runs) or say whether
they serve CUDA tensors here (``--status``)."""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from marin_model.cuda.build import KernelBuildError, build_library
from marin_model.cuda.dispatch import register_cuda_kernels, status
from marin_model.cuda.ptxas import parse_ptxas_report


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m marin_model.cuda",
        description="Build the CUDA kernels of cuda/ (needs nvcc, not a GPU) or report their status.",
        epilog="EXAMPLES:\n  python -m marin_model.cuda --build          # what `make cuda` runs\n"
               "  python -m marin_model.cuda --build --force  # rebuild even if cached\n"
               "  python -m marin_model.cuda --status         # is CUDA dispatch active here?",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", action="store_true", help="build (or find cached) cuda/build/libmarin_kernels-*.so")
    parser.add_argument("--force", action="store_true", help="with --build: rebuild even when cached")
    parser.add_argument("--status", action="store_true", help="try to register the kernels and say what happened")
    args = parser.parse_args(argv)
    if not (args.build or args.status):
        parser.error("give --build or --status")
    if args.build:
        try:
            result = build_library(force=args.force)
        except KernelBuildError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        kernels = parse_ptxas_report(result.log)
        worst = max((k.registers for k in kernels), default=0)
        spills = sum(k.spill_stores + k.spill_loads + k.stack_frame for k in kernels)
        print(f"{'cached' if result.cached else 'built'}: {result.library}")
        print(f"{len(kernels)} kernels, at most {worst} registers, {spills} bytes of spills/stack frames")
    if args.status:
        register_cuda_kernels()
        for key, value in status().items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
