"""``python -m torchneuron.target SUMMARY.json``: time and cost per workload (report.py)."""
import sys

from .report import main

sys.exit(main())
