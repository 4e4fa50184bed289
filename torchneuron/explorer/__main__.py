"""python -m torchneuron.explorer TRACE [-o report.html]: the explorer's report of a trace."""
import argparse
import sys

from . import report, resolve_trace


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchneuron.explorer",
                                description="Write a self-contained HTML report of a PyTorch profiler trace.")
    p.add_argument("trace", help="chrome trace from torch.profiler (export_chrome_trace), .json or .json.gz, or "
                                 "a directory holding one (torch_neuronx.profiling's output)")
    p.add_argument("-o", "--output", default="report.html", help="the HTML file to write")
    p.add_argument("--title", help="title shown in the report (default: the trace's file name)")
    args = p.parse_args(argv)
    try:
        trace = resolve_trace(args.trace)  # a directory: the one trace in it
    except (FileNotFoundError, ValueError) as e:
        print(f"python -m torchneuron.explorer: {e}", file=sys.stderr)
        return 2
    print(report(trace, args.output, title=args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
